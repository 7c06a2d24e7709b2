//! Pure types and rules of the inventory: machines, their NICs, disks and BMCs, the checks that
//! decide whether an operator's input is acceptable, and how a BMC inspection merges into a machine.
//!
//! Nothing here performs I/O: no tokio, sqlx, axum or reqwest. Front doors and stores convert to and
//! from these types; the rules live here once.

pub mod boot;
pub mod database;
pub mod dhcp;
pub mod import;
pub mod inspection;
pub mod lifecycle;
pub mod mac;
pub mod machine;
pub mod snapshots;
pub mod validate;

pub use inspection::{
    disk_type_of, inspected_keys, merge_inspection, DriveSource, FieldChange, InspectConflict,
    InspectedDrive, InspectedHardware, InspectedNic, Merge,
};
pub use mac::MacAddr;
pub use machine::{
    bmc_origin, check_hostname, normalise_fingerprint, spec_diff, unique_keys, Bmc, BmcSpec,
    Conflict, Disk, DiskType, Interface, LifecycleState, Machine, MachineId, MachineRef,
    MachineSpec, Role, TlsMode, UniqueKey,
};
pub use validate::{FieldError, ValidationErrors};
