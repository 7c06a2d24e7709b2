//! The cluster commands that talk to a running server's API: `plinth cluster bootstrap`,
//! `talosconfig`, `kubeconfig` and `health` (`plinth cluster init` works offline, in `cli`).
//! Credentials go to stdout and nowhere else (`> talosconfig`); they are never written to disk
//! by Plinth.

use anyhow::{bail, Context};
use clap::Args;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use reqwest::Method;
use serde_json::{json, Value};

use crate::cli::{emit, say, ApiClient, ClusterCommand};

/// Connection to the API (flattened into each cluster command that needs one).
#[derive(Debug, Clone, Args)]
pub struct ApiConn {
    /// Server URL.
    #[arg(long, env = "PLINTH_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// API token (an admin's, for bootstrap and credentials).
    #[arg(long, env = "PLINTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// A lifetime: `90s`, `30m`, `8h`, `7d`, or plain seconds.
pub fn parse_ttl(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let (num, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("--ttl `{text}`: expected e.g. 8h, 30m, 7d or seconds"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        other => bail!("--ttl `{text}`: unknown unit `{other}` (s, m, h or d)"),
    };
    n.checked_mul(mult)
        .with_context(|| format!("--ttl `{text}` is too long"))
}

fn path(name: &str, what: &str) -> String {
    let enc: String = name
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("/clusters/{enc}/{what}")
}

/// Run a `plinth cluster ...` command.
pub async fn run(cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Init { .. } => crate::cli::cluster(cmd),
        ClusterCommand::Bootstrap { name, node, api } => {
            let c = ApiClient::new(&api.server, api.token)?;
            let (_, r) = c
                .send(
                    c.req(Method::POST, &path(&name, "bootstrap"))
                        .json(&json!({ "node": node })),
                )
                .await?;
            emit(api.json, &r, |r| {
                say(format!(
                    "cluster {name} bootstrapped on {} ({}) by instance {}: {}",
                    r["node"].as_str().unwrap_or("?"),
                    r["node_address"].as_str().unwrap_or("?"),
                    r["instance"].as_str().unwrap_or("?"),
                    r["detail"].as_str().unwrap_or("")
                ))
            });
            Ok(())
        }
        ClusterCommand::Talosconfig {
            name,
            role,
            ttl,
            api,
        } => {
            let c = ApiClient::new(&api.server, api.token)?;
            let (_, body) = c
                .send(
                    c.req(Method::POST, &path(&name, "talosconfig"))
                        .json(&json!({ "role": role, "ttl_seconds": parse_ttl(&ttl)? })),
                )
                .await?;
            print!("{}", body.as_str().unwrap_or_default());
            Ok(())
        }
        ClusterCommand::Kubeconfig { name, ttl, api } => {
            let c = ApiClient::new(&api.server, api.token)?;
            let (_, body) = c
                .send(
                    c.req(Method::POST, &path(&name, "kubeconfig"))
                        .json(&json!({ "ttl_seconds": parse_ttl(&ttl)? })),
                )
                .await?;
            print!("{}", body.as_str().unwrap_or_default());
            Ok(())
        }
        ClusterCommand::Health { name, cached, api } => {
            let c = ApiClient::new(&api.server, api.token)?;
            let q = if cached { "?cached=true" } else { "" };
            let (_, h) = c
                .send(c.req(Method::GET, &format!("{}{q}", path(&name, "health"))))
                .await?;
            emit(api.json, &h, print_health);
            Ok(())
        }
    }
}

fn print_health(h: &Value) {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header([
        "NODE", "ROLE", "ADDRESS", "APID", "TALOS", "ETCD", "KUBELET", "ERROR",
    ]);
    let svc = |n: &Value, id: &str| -> String {
        n["services"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["id"] == id)
            .map(|s| {
                let health = match s["healthy"].as_bool() {
                    Some(true) => "healthy",
                    Some(false) => "unhealthy",
                    None => "?",
                };
                format!("{} {health}", s["state"].as_str().unwrap_or(""))
            })
            .unwrap_or_else(|| "-".into())
    };
    for n in h["nodes"].as_array().into_iter().flatten() {
        t.add_row([
            n["machine"].as_str().unwrap_or("").to_string(),
            n["role"].as_str().unwrap_or("-").to_string(),
            n["address"].as_str().unwrap_or("-").to_string(),
            if n["apid"] == true { "up" } else { "down" }.to_string(),
            n["talos_version"].as_str().unwrap_or("-").to_string(),
            svc(n, "etcd"),
            svc(n, "kubelet"),
            n["error"].as_str().unwrap_or("").to_string(),
        ]);
    }
    say(t.to_string());
    let e = &h["etcd"];
    if e.is_object() {
        say(format!(
            "etcd: {} member(s), {} healthy, leader {}, quorum {}, may lose {} control plane(s) now",
            e["members"].as_array().map_or(0, Vec::len),
            e["healthy_members"],
            e["leader_hostname"].as_str().unwrap_or("none"),
            e["quorum"],
            e["quorum_margin"].as_i64().unwrap_or(0).max(0)
        ));
    } else {
        say("etcd: not running (cluster not bootstrapped, or no control plane answers)");
    }
    if let Some(b) = h["bootstrap"].as_object() {
        say(format!(
            "bootstrap: {} on {} ({}) at {} by {}",
            b["state"].as_str().unwrap_or("?"),
            b["node"].as_str().unwrap_or("?"),
            b["node_address"].as_str().unwrap_or("?"),
            b["claimed_at"].as_str().unwrap_or("?"),
            b["instance"].as_str().unwrap_or("?")
        ));
    }
    if let Some(c) = h["talos_check"].as_object() {
        say(format!(
            "talos health check: {}{}",
            if c["passed"] == true {
                "passed"
            } else {
                "not passed"
            },
            c["error"]
                .as_str()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        ));
    }
    say(format!(
        "measured at {}",
        h["checked_at"].as_str().unwrap_or("?")
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_parse() {
        assert_eq!(parse_ttl("8h").expect("8h"), 28800);
        assert_eq!(parse_ttl("30m").expect("30m"), 1800);
        assert_eq!(parse_ttl("2d").expect("2d"), 172800);
        assert_eq!(parse_ttl("90").expect("90"), 90);
        assert!(parse_ttl("8w").is_err());
        assert!(parse_ttl("h").is_err());
    }
}
