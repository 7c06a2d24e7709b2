//! What every command prints with: lines on stdout that end the program quietly on a closed pipe,
//! JSON or a human printer, tables in one style fitted to the terminal (`COLUMNS`, else 100
//! columns, when stdout is not a terminal), JSON values as plain text, and the `--json` flag.
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

/// An empty table in the CLI's style, fitted to the terminal's width (long cells wrap).
pub(crate) fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    fit(&mut t);
    t
}

/// An empty table in the CLI's style at its natural width (`--wide`).
pub(crate) fn wide_table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t
}

/// `--json`, for the command groups that do not talk to the API (those have it in `ApiArgs`).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct JsonArg {
    /// Print JSON instead of text; errors too, as {"error": {...}} on stderr.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Width of tables when stdout is not a terminal and `COLUMNS` does not say.
pub const DEFAULT_WIDTH: u16 = 100;

/// The width tables are fitted to: the terminal's; else `COLUMNS`; else `DEFAULT_WIDTH`.
pub(crate) fn width() -> u16 {
    let t = Table::new();
    match t.width() {
        Some(w) if t.is_tty() => w,
        _ => std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<u16>().ok())
            .filter(|c| *c >= 20)
            .unwrap_or(DEFAULT_WIDTH),
    }
}

/// Fit a table to `width()`: long cells wrap rather than run past the edge.
fn fit(t: &mut Table) {
    t.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
    t.set_width(width());
}

/// Which columns of a table fit `width()` at their natural width: every column, or without the
/// columns of least `priority` (larger numbers go first) until the rest fits; the first column
/// with priority 0 always stays. Returns the kept columns' indices, in order.
pub(crate) fn columns_that_fit(
    header: &[&str],
    rows: &[Vec<String>],
    priority: &[u8],
) -> Vec<usize> {
    let natural: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .chain(std::iter::once(&header[i].to_string()))
                .map(|c| c.lines().map(|l| l.chars().count()).max().unwrap_or(0))
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Borders only (UTF8_BORDERS_ONLY): one column each side, one of padding each side of a cell.
    let total = |kept: &[usize]| 2 + kept.iter().map(|i| natural[*i] + 2).sum::<usize>();
    let mut kept: Vec<usize> = (0..header.len()).collect();
    let mut order: Vec<usize> = (0..header.len()).collect();
    order.sort_by_key(|i| std::cmp::Reverse(priority.get(*i).copied().unwrap_or(u8::MAX)));
    for drop in order {
        if total(&kept) <= usize::from(width()) || priority.get(drop) == Some(&0) {
            break;
        }
        kept.retain(|k| *k != drop);
    }
    kept
}

/// Ask on the terminal and read one line (the typed confirmation of a dangerous command). Refused
/// without a terminal: a script passes the confirmation as an argument instead.
pub(crate) fn prompt(question: &str) -> anyhow::Result<String> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    if !std::io::stdin().is_terminal() {
        anyhow::bail!("no terminal to ask for the confirmation: pass it with --confirm");
    }
    eprint!("{question}");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(line.trim().to_string())
}
