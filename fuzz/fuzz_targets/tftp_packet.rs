//! cargo-fuzz target: every input goes through `checks/tftp_packet.rs` (see its paragraph), which
//! the test suite also replays over `fuzz/regressions/tftp_packet/` and `fuzz/seeds/tftp_packet/`.
#![no_main]

#[path = "../checks/tftp_packet.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
