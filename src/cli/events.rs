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
        say(format!(
            "{} {:<28} {:<10} {} {}",
            s(&e["at"]),
            s(&e["kind"]),
            s(&e["actor"]),
            s(&e["machine_id"]),
            e["detail"]
        ));
    }
}

/// Print events from the live stream (server-sent events); with `until_done`, stop after a
/// reinstall ends (`reinstall.done` or `reinstall.failed`), failing on the latter.
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

/// Print the events of an open stream (see `follow`).
pub(crate) async fn print_stream(
    mut resp: reqwest::Response,
    until_done: bool,
) -> anyhow::Result<()> {
    let mut buf = String::new();
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
            print(false, &e);
            if until_done {
                match e["kind"].as_str() {
                    Some("reinstall.done") => return Ok(()),
                    Some("reinstall.failed") => {
                        bail!("reinstall failed: {}", s(&e["detail"]["error"]))
                    }
                    _ => {}
                }
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
