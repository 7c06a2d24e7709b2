//! The `plinth` binary.
fn main() {}
