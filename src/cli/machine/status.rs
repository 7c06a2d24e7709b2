//! `plinth machine status NAME`: where a machine stands, as `GET /api/v1/machines/{id}/status`
//! answers it (what `--json` prints), shown as one row per field of `FIELDS`, so a new field is
//! one line there.
//!
//! Imports `cli::api` and `cli::output` only.

use reqwest::Method;
use serde_json::{json, Value};

use crate::cli::api::ApiClient;
use crate::cli::output::{s, say, table};

/// Gather the status of `machine` (named any way the CLI accepts) from
/// `GET /api/v1/machines/{id}/status`.
pub(super) async fn gather(api: &ApiClient, machine: &str) -> anyhow::Result<Value> {
    let id = api.machine_id(machine).await?;
    let (_, status) = api
        .send(api.req(Method::GET, &format!("/machines/{id}/status")))
        .await?;
    let mut status = status;
    // A config release waiting for an operator (`delivery: approve`) is a reason to wait too.
    if status["waiting"].is_null() {
        let (_, config) = api
            .send(api.req(Method::GET, &format!("/machines/{id}/config")))
            .await?;
        if let Some(hold) = config["hold"].as_str() {
            status["waiting"] = json!(hold);
        }
    }
    Ok(status)
}

/// An event as one cell: when, kind, and its detail.
fn event(e: &Value) -> String {
    if e.is_null() {
        return "none seen".into();
    }
    format!("{} {} {}", s(&e["at"]), s(&e["kind"]), e["detail"])
}

/// The reinstall's stage and deadline, or how it ended.
fn reinstall(r: &Value) -> String {
    if r.is_null() {
        return "none".into();
    }
    let auto = if r["automatic"] == json!(true) {
        format!(", automatic attempt {}", s(&r["attempt"]))
    } else {
        String::new()
    };
    match (r["finished_at"].is_null(), r["error"].as_str()) {
        (true, _) => format!(
            "stage {} since {}, deadline {}{auto}",
            s(&r["stage"]),
            s(&r["stage_started_at"]),
            s(&r["stage_deadline"])
        ),
        (false, Some(err)) if r["stage"] == json!("cancelled") => {
            format!("cancelled at {}: {err}{auto}", s(&r["finished_at"]))
        }
        (false, Some(err)) => format!("failed at {}: {err}{auto}", s(&r["finished_at"])),
        (false, None) => format!("finished at {}{auto}", s(&r["finished_at"])),
    }
}

fn window(st: &Value) -> String {
    let w = &st["window"];
    if w.is_null() {
        return "none".into();
    }
    let open = if st["window_open"] == json!(true) {
        "open"
    } else {
        "closed"
    };
    format!(
        "{open}: opened {} by {}, expires {}{}",
        s(&w["opened_at"]),
        s(&w["opened_by"]),
        s(&w["expires_at"]),
        if w["wipe"] == json!(true) {
            ", wipe"
        } else {
            ""
        }
    )
}

/// The rows of the human view: label and how to show it from the gathered status.
type Field = (&'static str, fn(&Value) -> String);

const FIELDS: &[Field] = &[
    ("machine", |st| {
        format!(
            "{} ({})",
            s(&st["machine"]["hostname"]),
            s(&st["machine"]["id"])
        )
    }),
    ("state", |st| {
        let by = match st["state_by"].as_str() {
            Some(by)
                if st["manual_hold"] == json!(true)
                    && (st["state"] == json!("failed") || st["state"] == json!("maintenance")) =>
            {
                format!(" (set by {by}; no automatic reinstall)")
            }
            Some(by) => format!(" (set by {by})"),
            None => String::new(),
        };
        format!("{}{by}", s(&st["state"]))
    }),
    ("state reason", |st| s(&st["state_reason"])),
    ("reinstall", |st| reinstall(&st["reinstall"])),
    ("waiting", |st| match st["waiting"].as_str() {
        Some(w) => w.to_string(),
        None => "no".into(),
    }),
    ("power", |st| {
        match (st["power"].as_str(), st["power_error"].as_str()) {
            (Some(p), _) => p.to_string(),
            (None, Some(e)) => format!("unknown: {e}"),
            (None, None) => "unknown (no BMC)".into(),
        }
    }),
    ("last DHCP", |st| event(&st["last_dhcp"])),
    ("last boot step", |st| event(&st["last_boot_step"])),
    ("window", window),
    ("config renders", |st| s(&st["config_valid"])),
    ("held", |st| {
        if st["hold"].is_null() {
            "no".into()
        } else {
            s(&st["hold"])
        }
    }),
];

/// Print the gathered status, one row per field.
pub(super) fn print(st: &Value) {
    let mut t = table();
    for (label, show) in FIELDS {
        t.add_row([label.to_string(), show(st)]);
    }
    say(&t);
}
