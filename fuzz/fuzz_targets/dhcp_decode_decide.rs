//! cargo-fuzz target: every input goes through `checks/dhcp_decode_decide.rs` (see its paragraph), which
//! the test suite also replays over `fuzz/regressions/dhcp_decode_decide/` and `fuzz/seeds/dhcp_decode_decide/`.
#![no_main]

#[path = "../checks/dhcp_decode_decide.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
