//! Plinth: a bare-metal provisioning server for Talos Linux.
//!
//! Layers (arrows point inwards only): front doors (`http`) -> `service` -> `domain`; `store`
//! implements the traits of `service`. `app` is the only place that names concrete types.

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
pub mod service;
pub mod store;
pub mod talos;
pub mod talos_api;
pub mod tftp;
