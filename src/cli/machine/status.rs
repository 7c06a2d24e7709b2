//! `plinth machine status NAME`: where a machine stands, gathered from the API's machine,
//! reinstall, timeline and config answers into one JSON object (what `--json` prints), and shown
//! as one row per field of `FIELDS`, so a new field (a power state, say) is one line there.
//!
//! Imports `cli::api` and `cli::output` only.

use reqwest::Method;
use serde_json::{json, Value};

use crate::cli::api::{ApiClient, ApiFailure};
use crate::cli::output::{s, say, table};

/// Event kinds that are steps of a boot (the timeline also holds state changes).
const BOOT_STEPS: &[&str] = &["dhcp.", "tftp.", "http.", "boot.", "config."];

/// Gather the status of `machine` (named any way the CLI accepts).
pub(super) async fn gather(api: &ApiClient, machine: &str) -> anyhow::Result<Value> {
    let (_, m) = api.get_machine(machine).await?;
    let id = s(&m["id"]);
    let reinstall = match api
        .send(api.req(Method::GET, &format!("/machines/{id}/reinstall")))
        .await
    {
        Ok((_, r)) => r,
        Err(e)
            if e.downcast_ref::<ApiFailure>()
                .is_some_and(|f| f.status == 404) =>
        {
            Value::Null
        }
        Err(e) => return Err(e),
    };
    let (_, timeline) = api
        .send(api.req(Method::GET, &format!("/machines/{id}/timeline")))
        .await?;
    let (_, config) = api
        .send(api.req(Method::GET, &format!("/machines/{id}/config")))
        .await?;
    let steps = timeline.as_array().cloned().unwrap_or_default();
    let last = |prefixes: &[&str]| {
        steps
            .iter()
            .rev()
            .find(|e| {
                let kind = e["kind"].as_str().unwrap_or("");
                prefixes.iter().any(|p| kind.starts_with(p))
            })
            .cloned()
            .unwrap_or(Value::Null)
    };
    Ok(json!({
        "machine": {"id": id, "hostname": m["hostname"]},
        "state": m["state"],
        "state_reason": m["state_reason"],
        "reinstall": reinstall,
        "last_dhcp": last(&["dhcp."]),
        "last_boot_step": last(BOOT_STEPS),
        "window": config["window"],
        "window_open": config["window_open"],
        "config_valid": config["valid"],
        "hold": config["hold"],
    }))
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
    ("state", |st| s(&st["state"])),
    ("state reason", |st| s(&st["state_reason"])),
    ("reinstall", |st| reinstall(&st["reinstall"])),
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
