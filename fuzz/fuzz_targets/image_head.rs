//! cargo-fuzz target: every input goes through `checks/image_head.rs` (see its paragraph), which
//! the test suite also replays over `fuzz/regressions/image_head/` and `fuzz/seeds/image_head/`.
#![no_main]

#[path = "../checks/image_head.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
