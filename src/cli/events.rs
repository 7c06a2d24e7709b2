//! Events as the command line shows them: one line each, from the event log or from the live
//! stream (server-sent events) that `machine events --follow` and `machine reinstall --follow`
//! read.
//!
//! Imports `cli::api` and `cli::output` only.

use anyhow::{bail, Context};
use serde_json::Value;

use super::api::{urlencode, ApiClient};
use super::output::{s, say};

/// Print one event: a JSON line with `--json`, else one line of text.
pub(crate) fn print(json_out: bool, e: &Value) {
    if json_out {
        say(e);
    } else {
        // The machine by host name (else MAC or UUID, as the server names it); its id only when
        // it has none of them or is gone.
        let machine = match &e["machine"] {
            serde_json::Value::String(name) => name.clone(),
            _ => s(&e["machine_id"]),
        };
        say(format!(
            "{} {:<28} {:<10} {} {}",
            s(&e["at"]),
            s(&e["kind"]),
            s(&e["actor"]),
            machine,
            e["detail"]
        ));
    }
}

/// Print events from the live stream (server-sent events); with `until_done`, stop after a
/// reinstall ends (`reinstall.done`, `reinstall.failed` or `reinstall.cancelled`), failing on the
/// last two.
pub(crate) async fn follow(
    api: &ApiClient,
    machine: Option<&str>,
    kind: Option<&str>,
    until_done: bool,
) -> anyhow::Result<()> {
    let resp = open_stream(api, machine, kind).await?;
    print_stream(resp, until_done).await
}

/// Open the live stream. The server fixes the stream's starting point before it answers, so
/// every event written after this returns is in the stream: open it before starting what it is
/// to show (a reinstall's first stage can be written before a stream opened afterwards starts).
pub(crate) async fn open_stream(
    api: &ApiClient,
    machine: Option<&str>,
    kind: Option<&str>,
) -> anyhow::Result<reqwest::Response> {
    let mut q = vec![];
    if let Some(m) = machine {
        q.push(format!("machine={m}"));
    }
    if let Some(k) = kind {
        q.push(format!("kind={}", urlencode(k)));
    }
    let resp = api
        .req(
            reqwest::Method::GET,
            &format!("/events/stream?{}", q.join("&")),
        )
        .timeout(std::time::Duration::from_secs(365 * 24 * 3600))
        .send()
        .await
        .context("event stream")?;
    if !resp.status().is_success() {
        bail!("event stream: HTTP {}", resp.status());
    }
    Ok(resp)
}

/// Why a machine waits, from a boot plan event that holds (`boot.script` with plan `hold`, or an
/// unknown machine's `boot.discovered`): its reason.
pub(crate) fn hold_reason(e: &Value) -> Option<String> {
    let kind = e["kind"].as_str()?;
    if !kind.starts_with("boot.") {
        return None;
    }
    let plan = e["detail"]["plan"].as_str()?;
    if plan != "hold" && plan != "discovery" {
        return None;
    }
    e["detail"]["reason"].as_str().map(str::to_string)
}

/// Print the events of an open stream (see `follow`). With `until_done` (a reinstall), a boot
/// that holds is shown as `waiting: REASON` once per new reason rather than at every poll, and
/// the stream ends with the reinstall: done, failed or cancelled (the last two fail).
pub(crate) async fn print_stream(
    mut resp: reqwest::Response,
    until_done: bool,
) -> anyhow::Result<()> {
    let mut buf = String::new();
    let mut last_hold: Option<String> = None;
    while let Some(chunk) = resp.chunk().await.context("event stream")? {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let data: String = block
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            let Ok(e) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            if !until_done {
                print(false, &e);
                continue;
            }
            if let Some(reason) = hold_reason(&e) {
                if last_hold.as_deref() != Some(reason.as_str()) {
                    say(format!("{} waiting: {reason}", s(&e["at"])));
                    last_hold = Some(reason);
                }
                continue;
            }
            print(false, &e);
            match e["kind"].as_str() {
                Some("reinstall.done") => return Ok(()),
                Some("reinstall.failed") => {
                    bail!("reinstall failed: {}", s(&e["detail"]["error"]))
                }
                Some("reinstall.cancelled") => {
                    bail!(
                        "reinstall cancelled by {} at stage {}",
                        s(&e["detail"]["cancelled_by"]),
                        s(&e["detail"]["stage"])
                    )
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// One step of a machine's timeline as a line: when, kind, who, and its detail.
pub(crate) fn timeline_line(e: &Value) -> String {
    format!(
        "{} {:<24} {:<8} {}",
        s(&e["at"]),
        s(&e["kind"]),
        s(&e["actor"]),
        e["detail"]
    )
}
