//! `plinth cluster ...`. `init`: a new cluster's secrets bundle, generated natively into a file
//! only its owner can read (needs no server and no database). `bootstrap`, `talosconfig`,
//! `kubeconfig` and `health` talk to a running server's API (the Talos API is Plinth's to call);
//! credentials go to stdout and nowhere else (`> talosconfig`), never to a file Plinth writes.
//!
//! Imports `domain`, `talos`, `cli::api` and `cli::output` only.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::json;

use reqwest::Method;
use serde_json::Value;

use super::api::ApiArgs;
use super::output::{emit, say, table};

/// `plinth cluster ...`: server, token, output and the command (`init` needs no server).
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Server, token and output.
    #[command(flatten)]
    pub api: ApiArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: ClusterCommand,
}

/// `plinth cluster ...`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Generate a new cluster secrets bundle natively (as `talosctl gen secrets` does) into a file
    /// readable only by its owner. Keep it out of Git.
    Init {
        /// Cluster name.
        name: String,
        /// Control-plane endpoint, e.g. https://10.0.0.10:6443.
        #[arg(long)]
        endpoint: String,
        /// Where to write the bundle (refuses to overwrite; missing parent directories are created,
        /// mode 0700).
        #[arg(long)]
        out: PathBuf,
        /// The cluster's Talos release: the bundle is the one `talosctl gen secrets
        /// --talos-version` of it writes (default: the newest final release Plinth supports).
        #[arg(long)]
        talos_version: Option<crate::talos::TalosVersion>,
    },
    /// Bootstrap the cluster's etcd on one control plane, exactly once (admins; refused, naming
    /// when and where, once the cluster was bootstrapped).
    Bootstrap {
        /// Cluster name.
        name: String,
        /// The node (host name, id or address); default: the first verified control plane.
        #[arg(long)]
        node: Option<String>,
    },
    /// Print a talosconfig signed now from the cluster's OS CA (admins; an event names you).
    Talosconfig {
        /// Cluster name.
        name: String,
        /// Talos role: os:admin, os:operator, os:reader or os:etcd:backup.
        #[arg(long, default_value = "os:admin")]
        role: String,
        /// Lifetime: 30m, 8h, 7d (at most 30 days).
        #[arg(long, default_value = "8h")]
        ttl: String,
    },
    /// Print an admin kubeconfig signed now from the cluster's Kubernetes CA (admins; an event
    /// names you).
    Kubeconfig {
        /// Cluster name.
        name: String,
        /// Lifetime: 30m, 8h, 7d (at most 30 days).
        #[arg(long, default_value = "8h")]
        ttl: String,
    },
    /// Per node: Talos version, apid, etcd/kubelet/apid/trustd, etcd members and leader, quorum.
    Health {
        /// Cluster name.
        name: String,
        /// The last stored measurement instead of measuring now.
        #[arg(long)]
        cached: bool,
    },
}

/// Run `plinth cluster ...`.
pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let json_out = args.api.json;
    match args.command {
        ClusterCommand::Init {
            name,
            endpoint,
            out,
            talos_version,
        } => {
            crate::domain::machine::check_hostname(&name)
                .map_err(|e| anyhow::anyhow!("cluster name: {e}"))?;
            let rest = endpoint
                .strip_prefix("https://")
                .ok_or_else(|| anyhow::anyhow!("--endpoint: `{endpoint}` must be an https:// URL such as https://10.0.0.10:6443"))?;
            if rest.split('/').next().is_none_or(str::is_empty) {
                bail!("--endpoint: `{endpoint}` has no host");
            }
            let bundle = crate::talos::secrets::SecretsBundle::generate_for(
                talos_version.unwrap_or(crate::talos::secrets::DEFAULT_CONTRACT),
            )?;
            let yaml = bundle.to_yaml()?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
                if !parent.exists() {
                    let mut dirs = std::fs::DirBuilder::new();
                    dirs.recursive(true);
                    #[cfg(unix)]
                    {
                        use std::os::unix::fs::DirBuilderExt;
                        dirs.mode(0o700);
                    }
                    dirs.create(parent).with_context(|| {
                        format!("cannot create the directory {}", parent.display())
                    })?;
                }
            }
            let mut f = opts.open(&out).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    anyhow::anyhow!(
                        "{} exists already: a secrets bundle is never overwritten; choose another --out or remove it first",
                        out.display()
                    )
                } else {
                    anyhow::Error::new(e).context(format!("cannot create {}", out.display()))
                }
            })?;
            use std::io::Write as _;
            f.write_all(yaml.as_bytes())?;
            f.sync_all()?;
            if json_out {
                say(json!({"cluster": name, "endpoint": endpoint, "path": out, "mode": "0600"}));
            } else {
                eprintln!("secrets bundle for cluster {name} ({endpoint}) written to {} (mode 0600); keep it out of Git", out.display());
            }
        }
        ClusterCommand::Bootstrap { name, node } => {
            let c = args.api.client()?;
            let (_, r) = c
                .send(
                    c.req(Method::POST, &path(&name, "bootstrap"))
                        .json(&serde_json::json!({ "node": node })),
                )
                .await?;
            emit(json_out, &r, |r| {
                say(format!(
                    "cluster {name} bootstrapped on {} ({}) by instance {}: {}",
                    r["node"].as_str().unwrap_or("?"),
                    r["node_address"].as_str().unwrap_or("?"),
                    r["instance"].as_str().unwrap_or("?"),
                    r["detail"].as_str().unwrap_or("")
                ))
            });
        }
        ClusterCommand::Talosconfig { name, role, ttl } => {
            let c = args.api.client()?;
            let (_, body) = c
                .send(
                    c.req(Method::POST, &path(&name, "talosconfig")).json(
                        &serde_json::json!({ "role": role, "ttl_seconds": parse_ttl(&ttl)? }),
                    ),
                )
                .await?;
            super::output::say_raw(body.as_str().unwrap_or_default());
        }
        ClusterCommand::Kubeconfig { name, ttl } => {
            let c = args.api.client()?;
            let (_, body) = c
                .send(
                    c.req(Method::POST, &path(&name, "kubeconfig"))
                        .json(&serde_json::json!({ "ttl_seconds": parse_ttl(&ttl)? })),
                )
                .await?;
            super::output::say_raw(body.as_str().unwrap_or_default());
        }
        ClusterCommand::Health { name, cached } => {
            let c = args.api.client()?;
            let q = if cached { "?cached=true" } else { "" };
            let (_, h) = c
                .send(c.req(Method::GET, &format!("{}{q}", path(&name, "health"))))
                .await?;
            emit(json_out, &h, print_health);
        }
    }
    Ok(())
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

fn print_health(h: &Value) {
    let mut t = table();
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
