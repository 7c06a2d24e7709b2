//! Plinth's integration tests, in one test binary: one link instead of one per file keeps the
//! debug build small and fast on a 2-core CI machine. Each module is one area; `support` holds the
//! shared harness (test servers and databases, network namespaces, real peers).

#[macro_use]
mod support;

mod api;
mod bmc_api;
mod bmc_emulator;
mod bmc_faults;
mod bmc_mockups;
mod bmc_secrets;
mod boot;
mod cancel;
mod cli;
mod cli_habits;
mod cli_settings;
mod clusters;
mod console;
mod container;
mod delivery_binding;
mod dhcp;
mod dhcp_peers;
mod dhcp_service;
mod doctor;
mod event_names;
mod fuzz_replay;
mod holds;
mod hostile;
mod images_door;
mod images_pull;
mod import_stream;
mod inventory_errors;
mod layers;
mod readme;
mod reinstall_e2e;
mod relay_pinning;
mod router_adverts;
mod secrets_at_rest;
mod snapshots;
mod store_battery;
mod store_faults;
mod talos_1_14;
mod talos_api;
mod talos_cli;
mod talos_configs;
mod talos_conformance;
mod talos_patch;
mod talos_schema;
mod talos_secrets;
mod timeline;
mod upgrades;
mod vm_boot;
mod vm_httpboot;
mod workflow_crash;
mod workflows;
