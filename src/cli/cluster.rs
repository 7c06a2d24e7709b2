//! `plinth cluster ...`. `init`: a new cluster's secrets bundle, generated natively into a file
//! only its owner can read (needs no server and no database). `bootstrap`, `talosconfig`,
//! `kubeconfig`, `health` and `upgrade` (plan, start, status, pause, resume, abort a rolling Talos
//! upgrade) talk to a running server's API (the Talos API is Plinth's to call);
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
    /// Rolling Talos upgrade: control planes one at a time, then workers by rack; refused unless
    /// every node is healthy, etcd has full quorum and a fresh etcd snapshot is verified. Start
    /// (admins), --dry-run (the plan, operators), --status, --pause (operators), --resume,
    /// --abort (admins).
    Upgrade {
        /// Cluster name.
        name: String,
        /// Target Talos version, e.g. v1.13.9.
        #[arg(long, required_unless_present_any = ["status", "pause", "resume", "abort"])]
        to: Option<String>,
        /// Image Factory schematic id of the target's installer (default: the cluster's).
        #[arg(long, requires = "to")]
        schematic: Option<String>,
        /// Print the plan (pre-checks, order, installer per node); start nothing.
        #[arg(long, requires = "to")]
        dry_run: bool,
        /// The newest rollout and each node's step.
        #[arg(long, conflicts_with_all = ["to", "pause", "resume", "abort"])]
        status: bool,
        /// Pause the running rollout (the node in flight finishes; no further node starts).
        #[arg(long, conflicts_with_all = ["to", "resume", "abort"])]
        pause: bool,
        /// Resume a paused rollout.
        #[arg(long, conflicts_with_all = ["to", "abort"])]
        resume: bool,
        /// Abort the active rollout (no further call to any node).
        #[arg(long, conflicts_with = "to")]
        abort: bool,
    },
    /// Take an etcd snapshot now: streamed from a healthy control plane, encrypted, stored where
    /// the cluster's `etcdSnapshots.store` says, read back and verified (operators).
    Snapshot {
        /// Cluster name.
        name: String,
        /// Seconds the server waits for the end before answering that the snapshot goes on
        /// (at most 240); this command then follows it to its end.
        #[arg(long, default_value_t = 60)]
        wait_seconds: u64,
    },
    /// List the cluster's etcd snapshots, newest first.
    Snapshots {
        /// Cluster name.
        name: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Recover the cluster's etcd from a snapshot after losing the control plane's majority:
    /// one control plane whose etcd waits for a bootstrap is given the snapshot and bootstraps
    /// from it, the others rejoin (admins; once per cluster; refused while etcd has quorum).
    Recover {
        /// Cluster name.
        name: String,
        /// The snapshot's id (`plinth cluster snapshots NAME`).
        #[arg(long)]
        snapshot: String,
        /// The control plane to restore on (host name, id or address).
        #[arg(long)]
        node: Option<String>,
        /// Recover although etcd still has quorum: asks for the cluster's name to be typed
        /// (or give it with --confirm).
        #[arg(long)]
        force: bool,
        /// The cluster's name, typed, to confirm --force without a prompt.
        #[arg(long, requires = "force")]
        confirm: Option<String>,
        /// Seconds the server waits for the end before answering that the recovery goes on
        /// (at most 240); this command then follows it to its end.
        #[arg(long, default_value_t = 60)]
        wait_seconds: u64,
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
        ClusterCommand::Upgrade {
            name,
            to,
            schematic,
            dry_run,
            status,
            pause,
            resume,
            abort,
        } => {
            let c = args.api.client()?;
            let action = if pause {
                Some("pause")
            } else if resume {
                Some("resume")
            } else if abort {
                Some("abort")
            } else {
                None
            };
            if status {
                let (_, r) = c.send(c.req(Method::GET, &path(&name, "upgrade"))).await?;
                emit(json_out, &r, print_rollout);
            } else if let Some(a) = action {
                let (_, r) = c
                    .send(c.req(Method::POST, &path(&name, &format!("upgrade/{a}"))))
                    .await?;
                emit(json_out, &r, print_rollout);
            } else {
                let (_, r) = c
                    .send(c.req(Method::POST, &path(&name, "upgrade")).json(&json!({
                        "to": to, "schematic": schematic, "dry_run": dry_run,
                    })))
                    .await?;
                if dry_run {
                    emit(json_out, &r, print_plan);
                } else {
                    emit(json_out, &r, |r| {
                        print_rollout(r);
                        say(format!(
                            "follow it with `plinth cluster upgrade {name} --status`"
                        ));
                    });
                }
            }
        }
        ClusterCommand::Snapshot { name, wait_seconds } => {
            let c = args.api.client()?;
            let (_, mut r) = c
                .send(c.req(
                    Method::POST,
                    &format!("{}?wait_seconds={wait_seconds}", path(&name, "snapshots")),
                ))
                .await?;
            let id = r["id"].as_str().unwrap_or("?").to_string();
            if r["state"] == "taking" {
                // 202: the server goes on with it; follow its record to the end.
                eprintln!("snapshot {id} of cluster {name} is being taken; following it");
                let one = path(&name, &format!("snapshots/{id}"));
                while r["state"] == "taking" {
                    tokio::time::sleep(FOLLOW_EVERY).await;
                    r = c.send(c.req(Method::GET, &one)).await?.1;
                }
            }
            if r["state"] != "verified" {
                if json_out {
                    say(serde_json::to_string_pretty(&r).unwrap_or_default());
                }
                bail!(
                    "snapshot {id} of cluster {name} is {}: {}",
                    r["state"].as_str().unwrap_or("?"),
                    r["error"].as_str().unwrap_or("no error recorded")
                );
            }
            emit(json_out, &r, |r| {
                say(format!(
                    "snapshot {} of cluster {name} verified: {} bytes, revision {}, SHA-256 {}, from {}, stored at {}/{}",
                    r["id"].as_str().unwrap_or("?"),
                    r["size_bytes"],
                    r["revision"],
                    r["sha256"].as_str().unwrap_or("?"),
                    r["taken_from"].as_str().unwrap_or("?"),
                    r["store"].as_str().unwrap_or("?"),
                    r["object"].as_str().unwrap_or("?"),
                ))
            });
        }
        ClusterCommand::Snapshots { name, limit } => {
            let c = args.api.client()?;
            let (_, list) = c
                .send(c.req(
                    Method::GET,
                    &format!("{}?limit={limit}", path(&name, "snapshots")),
                ))
                .await?;
            emit(json_out, &list, print_snapshots);
        }
        ClusterCommand::Recover {
            name,
            snapshot,
            node,
            force,
            confirm,
            wait_seconds,
        } => {
            let confirm = match (force, confirm) {
                (true, None) => Some(super::output::prompt(&format!(
                    "etcd of cluster {name} may still have quorum. Recovering throws away every write since the snapshot. Type the cluster's name to go ahead: "
                ))?),
                (_, c) => c,
            };
            let c = args.api.client()?;
            let (_, mut r) = c
                .send(
                    c.req(
                        Method::POST,
                        &format!("{}?wait_seconds={wait_seconds}", path(&name, "recover")),
                    )
                    .json(
                        &serde_json::json!({"snapshot": snapshot, "node": node, "force": force, "confirm": confirm}),
                    ),
                )
                .await?;
            if r["state"] == "calling" {
                // 202: the server goes on with it; follow the cluster's recovery to its end.
                eprintln!(
                    "recovery of cluster {name} on {} is under way; following it",
                    r["node"].as_str().unwrap_or("?")
                );
                while r["state"] == "calling" {
                    tokio::time::sleep(FOLLOW_EVERY).await;
                    match c.send(c.req(Method::GET, &path(&name, "recovery"))).await {
                        Ok((_, now)) => r = now,
                        Err(e)
                            if e.downcast_ref::<super::api::ApiFailure>()
                                .is_some_and(|f| f.status == 404) =>
                        {
                            // Given back: it failed before anything reached the node.
                            let (_, ev) = c
                                .send(c.req(
                                    Method::GET,
                                    "/events?kind=cluster.recovery_refused&limit=1",
                                ))
                                .await?;
                            bail!(
                                "recovery of cluster {name} failed before anything reached the node (it may be tried again): {}",
                                ev[0]["detail"]["error"].as_str().unwrap_or("see the event cluster.recovery_refused")
                            );
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            if r["state"] == "failed" {
                if json_out {
                    say(serde_json::to_string_pretty(&r).unwrap_or_default());
                }
                bail!(
                    "recovery of cluster {name} failed: {}",
                    r["detail"].as_str().unwrap_or("no detail recorded")
                );
            }
            emit(json_out, &r, |r| {
                say(format!(
                    "cluster {name}: {}",
                    r["detail"].as_str().unwrap_or("recovered")
                ))
            });
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

/// How often a snapshot or recovery the server goes on with is looked at.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

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

fn print_snapshots(list: &Value) {
    let mut t = table();
    t.set_header([
        "ID", "STATE", "STARTED", "SIZE", "REVISION", "FROM", "TALOS", "ERROR",
    ]);
    for r in list.as_array().into_iter().flatten() {
        t.add_row([
            r["id"].as_str().unwrap_or("").to_string(),
            r["state"].as_str().unwrap_or("").to_string(),
            r["started_at"].as_str().unwrap_or("").to_string(),
            r["size_bytes"]
                .as_i64()
                .map_or("-".into(), |v| v.to_string()),
            r["revision"].as_i64().map_or("-".into(), |v| v.to_string()),
            r["taken_from"].as_str().unwrap_or("-").to_string(),
            r["talos_version"].as_str().unwrap_or("-").to_string(),
            r["error"].as_str().unwrap_or("").to_string(),
        ]);
    }
    say(t.to_string());
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

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn print_plan(p: &Value) {
    say(format!(
        "upgrade of cluster {} to {}: installer {}",
        text(&p["cluster"]),
        text(&p["to_version"]),
        text(&p["installer"])
    ));
    say("pre-checks:");
    for c in p["checks"].as_array().into_iter().flatten() {
        say(format!(
            "  [{}] {}: {}",
            if c["passed"] == true { "ok" } else { "FAILED" },
            text(&c["name"]),
            text(&c["detail"])
        ));
    }
    say(format!(
        "order: control planes one at a time, then workers at most {} per rack per batch; each node at most {}s",
        p["max_workers_per_rack"], p["node_timeout_seconds"]
    ));
    let mut t = table();
    t.set_header([
        "#",
        "BATCH",
        "NODE",
        "ROLE",
        "RACK",
        "FROM",
        "CALL",
        "INSTALLER",
    ]);
    for n in p["nodes"].as_array().into_iter().flatten() {
        let call = if n["step"] == "skipped" {
            "skip (on target)".to_string()
        } else if n["method"] == "lifecycle" {
            "LifecycleService.Upgrade".to_string()
        } else {
            "MachineService.Upgrade".to_string()
        };
        t.add_row([
            text(&n["position"]),
            text(&n["batch"]),
            text(&n["name"]),
            text(&n["role"]),
            text(&n["rack"]),
            text(&n["from_version"]),
            call,
            text(&n["installer"]),
        ]);
    }
    say(t.to_string());
    for n in p["notes"].as_array().into_iter().flatten() {
        say(format!("note: {}", text(n)));
    }
    let failed = p["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["passed"] != true)
        .count();
    let only_snapshot = p["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["passed"] != true)
        .all(|c| c["name"] == "etcd snapshot");
    say(if failed == 0 {
        "every pre-check passes: without --dry-run the rollout starts".to_string()
    } else if only_snapshot {
        "only the etcd snapshot is missing or stale: without --dry-run the rollout takes and verifies one, then starts (refused if that fails)".to_string()
    } else {
        format!("{failed} pre-check(s) fail: the rollout would be refused")
    });
}

fn print_rollout(s: &Value) {
    let r = &s["rollout"];
    say(format!(
        "rollout {} of cluster {} to {}: {}{}",
        text(&r["id"]),
        text(&r["cluster"]),
        text(&r["to_version"]),
        text(&r["state"]),
        r["error"]
            .as_str()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    ));
    say(format!(
        "started by {} at {}; driven by {}",
        text(&r["requested_by"]),
        text(&r["created_at"]),
        r["owner"].as_str().unwrap_or("no instance now")
    ));
    let mut t = table();
    t.set_header(["#", "BATCH", "NODE", "ROLE", "FROM", "STEP", "SEEN"]);
    for n in s["nodes"].as_array().into_iter().flatten() {
        t.add_row([
            text(&n["position"]),
            text(&n["batch"]),
            text(&n["name"]),
            text(&n["role"]),
            text(&n["from_version"]),
            text(&n["step"]),
            n["seen"].as_str().unwrap_or("").to_string(),
        ]);
    }
    say(t.to_string());
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
