//! What every command prints with: lines on stdout that end the program quietly on a closed pipe,
//! JSON or a human printer, tables in one style, and JSON values as plain text.
//!
//! Imports nothing of the crate; every other `cli` module may import it.

use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use serde_json::Value;

/// Print a line to stdout; a closed pipe (`plinth machine list | head`) ends the program quietly
/// instead of panicking as `println!` would.
pub(crate) fn say(text: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").is_err() {
        std::process::exit(0);
    }
}

/// Print text to stdout as it is (no newline added); a closed pipe ends the program quietly.
pub(crate) fn say_raw(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if out.write_all(text.as_bytes()).is_err() || out.flush().is_err() {
        std::process::exit(0);
    }
}

/// `v` as pretty JSON with `--json`, else through the human printer.
pub(crate) fn emit(json_out: bool, v: &Value, human: impl FnOnce(&Value)) {
    if json_out {
        say(serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        human(v);
    }
}

/// A JSON value as plain text: strings without quotes, null as nothing.
pub(crate) fn s(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The items of a JSON array as text, comma-separated.
pub(crate) fn join(v: &Value) -> String {
    v.as_array()
        .into_iter()
        .flatten()
        .map(s)
        .collect::<Vec<_>>()
        .join(", ")
}

/// An empty table in the CLI's style.
pub(crate) fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t
}
