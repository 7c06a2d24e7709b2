//! Re-exec entry points: harnesses that need another process (a UDP agent inside a network
//! namespace, a BMC beside its VM, a node's Talos API inside a VM's initramfs) run this test
//! binary again with [`ARGS`] and one environment variable naming what to become. The one
//! entry, [`ENTRY`], is not a test: it is `#[ignore]`d, so a test run never runs it or counts it
//! as a pass; [`ARGS`] select it with `--ignored`.

/// The libtest name of the entry point.
pub const ENTRY: &str = "support::reexec::entry";

/// The arguments that run only the entry point, quietly, with its output on stdout/stderr.
pub const ARGS: [&str; 6] = [
    "--exact",
    ENTRY,
    "--ignored",
    "--nocapture",
    "--test-threads=1",
    "-q",
];

/// Become the process the environment names: `peers::AGENT_ENV` (the namespace agent),
/// `qemu_bmc::BMC_ENV` (the BMC of a qemu VM) or `talos_node::NODE_ENV` (a node's Talos API).
/// Without any of them it does nothing.
#[test]
#[ignore = "re-exec entry point, not a test (see support::reexec)"]
fn entry() {
    use super::{peers, qemu_bmc, talos_node};
    if let Ok(spec) = std::env::var(peers::AGENT_ENV) {
        peers::agent_main(&spec);
    } else if let Ok(spec) = std::env::var(qemu_bmc::BMC_ENV) {
        qemu_bmc::main(&spec);
    } else if let Ok(spec) = std::env::var(talos_node::NODE_ENV) {
        talos_node::run_process(&spec);
    }
}
