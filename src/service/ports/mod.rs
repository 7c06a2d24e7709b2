//! The ports: one trait per role the use cases need from the outside world, implemented outside
//! `service` (by `crate::store`, `crate::bmc`, `crate::images`) and wired together in `crate::app`.
//! Use cases take the ports they use, not one everything-trait.
//!
//! Imports `domain` only.

pub mod images;

pub use images::{CachedImage, ImageFetchError, TalosImages};
