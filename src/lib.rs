//! Plinth: a bare-metal provisioning server for Talos Linux.
//!
//! Layers (arrows point inwards only; `tests/it/layers.rs` checks every file's `use crate::`):
//! - front doors `dhcp`, `tftp` and `http` (with the image door, `http::images_listener`) decode
//!   their protocol and ask `service`; `cli` parses the command line and calls `service` (or a
//!   running server's API);
//! - `service` holds the use cases (`service::provisioning` answers what a machine boots now)
//!   and, in `service::ports`, one trait per role it needs from outside;
//! - `store` (SQLite, PostgreSQL), `bmc` (Redfish), `images` (the image cache) and `talos_api`
//!   (gRPC to a node) implement those ports;
//! - `domain` (pure types and rules) and `talos` (machine configs as data) import nothing else;
//!   `config`, `declare` and `metrics` sit beside them.
//!
//! `app` is the only place that names concrete types; `main` is thin.

pub mod app;
pub mod bmc;
pub mod cli;
pub mod config;
pub mod declare;
pub mod dhcp;
pub mod domain;
pub mod http;
pub mod images;
pub mod metrics;
pub mod objects;
pub mod service;
pub mod store;
pub mod talos;
pub mod talos_api;
pub mod tftp;
