//! One trait per outside role the use cases need (GUIDE: "ports"). Implementations live outside
//! `service` (`crate::store`, `crate::bmc`, `crate::talos_api`); use cases take the ports they use.
//! This module imports `domain` and nothing from `store`, `http`, `bmc` or `talos_api`.

pub mod talos_api;
pub mod talos_state;
