//! Plinth: a bare-metal provisioning server for Talos Linux.
//!
//! Layers (arrows point inwards only): front doors (`http`) -> `service` -> `domain`; `store`
//! implements the traits of `service`. `app` is the only place that names concrete types.

pub mod bmc;
pub mod domain;
pub mod service;
pub mod store;
