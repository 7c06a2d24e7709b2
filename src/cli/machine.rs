//! `plinth machine ...`: register, list, show, edit, import and remove machines, move them along
//! their lifecycle, open provisioning windows, start reinstalls and read their events, all through
//! a running server's API (tables by default, `--json` for scripts).
//!
//! Imports `cli::api`, `cli::events`, `cli::output` and `domain`/`service` helpers that are pure
//! (the JSON merge patch); never the store.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

use super::api::{urlencode, ApiArgs, ApiClient};
use super::events;

mod edit;
mod status;
use super::output::{columns_that_fit, emit, s, say, table, wide_table};

/// `plinth machine ...`: connection to the API and the command.
#[derive(Debug, Args)]
pub struct MachineArgs {
    /// Server, token and output.
    #[command(flatten)]
    pub api: ApiArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: MachineCommand,
}

/// `plinth machine ...`.
#[derive(Debug, Subcommand)]
pub enum MachineCommand {
    /// Register a machine.
    Add(Box<AddArgs>),
    /// List machines.
    List {
        /// Lifecycle state.
        #[arg(long)]
        state: Option<String>,
        /// Site.
        #[arg(long)]
        site: Option<String>,
        /// Rack.
        #[arg(long)]
        rack: Option<String>,
        /// Cluster.
        #[arg(long)]
        cluster: Option<String>,
        /// Role.
        #[arg(long)]
        role: Option<String>,
        /// Free-text search.
        #[arg(long, short)]
        q: Option<String>,
        /// Page size; with --all, pages are followed to the end.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Fetch every page.
        #[arg(long)]
        all: bool,
        /// Every column (id, site, serial, asset tag, SMBIOS UUID too), at its natural width.
        #[arg(long)]
        wide: bool,
    },
    /// Show one machine (id, host name, MAC, IPv4, serial, asset tag or SMBIOS UUID).
    Show {
        /// The machine.
        machine: String,
    },
    /// Change fields: `--set rack=r12 --set rack_unit=7 --set bmc.url=https://10.0.0.5`; an empty
    /// value clears the field; values that are JSON (numbers, arrays, objects) are sent as JSON.
    /// `--nic MAC --set ipv4=...` changes one NIC; `--rack r21 --set ...` (or --site, --cluster,
    /// --role) every machine there, after printing the count and asking (`--yes` skips it).
    Edit {
        /// The machine (or, instead, a selection: --rack, --site, --cluster, --role).
        #[arg(required_unless_present_any = ["rack", "site", "cluster", "role"])]
        machine: Option<String>,
        /// key=value.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// A JSON merge patch file.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Change one NIC of the machine, by its MAC: `--nic MAC --set ipv4=10.0.0.30` (keys mac,
        /// ipv4, boot, name); its other NICs stay as they are.
        #[arg(long, value_name = "MAC", requires = "machine")]
        nic: Option<String>,
        /// Every machine of this rack (a bulk edit: prints the count and asks first).
        #[arg(long, conflicts_with = "machine")]
        rack: Option<String>,
        /// Every machine of this site.
        #[arg(long, conflicts_with = "machine")]
        site: Option<String>,
        /// Every machine of this cluster.
        #[arg(long, conflicts_with = "machine")]
        cluster: Option<String>,
        /// Every machine of this role.
        #[arg(long, conflicts_with = "machine")]
        role: Option<String>,
        /// Bulk edit without asking.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Inspect a machine through its BMC and update the inventory; prints what changed and the
    /// conflicts that were not written.
    Inspect {
        /// The machine.
        machine: String,
    },
    /// Open the machine's provisioning window (its config must render and validate; it becomes
    /// `provisioning` and its next network boot installs Talos), or close it with `--close`.
    Provision {
        /// The machine.
        machine: String,
        /// How long the window stays open, seconds (60-86400).
        #[arg(long, default_value_t = 3600)]
        ttl: u32,
        /// Wipe the system disk on the install boot.
        #[arg(long)]
        wipe: bool,
        /// Close the window instead.
        #[arg(long)]
        close: bool,
    },
    /// Reinstall a machine: open its window, one-time network boot and power cycle through the
    /// BMC (or a tech does it), then follow it to `installed`; `--follow` prints its events until
    /// it is done or failed.
    Reinstall {
        /// The machine.
        machine: String,
        /// Wipe the system disk on the install boot.
        #[arg(long)]
        wipe: bool,
        /// Follow the reinstall's events until it ends, with why the machine waits whenever it
        /// holds.
        #[arg(long)]
        follow: bool,
        /// Cancel the running reinstall instead, at whatever stage it is: the machine goes to
        /// maintenance, its window closes and its slots are freed.
        #[arg(long, conflicts_with_all = ["wipe", "follow"])]
        cancel: bool,
    },
    /// The events of one machine, or of every machine when none is named; `--follow` keeps
    /// printing new ones live.
    Events {
        /// The machine.
        machine: Option<String>,
        /// Kind prefix, e.g. `reinstall.`.
        #[arg(long)]
        kind: Option<String>,
        /// Keep printing new events as they happen (Ctrl-C to stop).
        #[arg(long)]
        follow: bool,
    },
    /// The relay circuit a machine's DHCP is pinned to (the first relay and option-82 circuit
    /// seen for it); `--relay IP [--circuit-id HEX]` moves it (say, to another switch port),
    /// `--clear` lets its next relayed request pin the circuit it comes through.
    Circuit {
        /// The machine.
        machine: String,
        /// The relay agent's address (giaddr) to pin to.
        #[arg(long, conflicts_with = "clear")]
        relay: Option<String>,
        /// Option 82 circuit id as hex (e.g. `4769312f302f37` for Gi1/0/7).
        #[arg(long, requires = "relay")]
        circuit_id: Option<String>,
        /// Option 82 remote id as hex (recorded, not compared).
        #[arg(long, requires = "relay")]
        remote_id: Option<String>,
        /// Remove the pin.
        #[arg(long)]
        clear: bool,
    },
    /// Approve the release of a machine's config for its current install boot (clusters with
    /// `delivery: approve`): CODE is what the machine's console shows.
    Approve {
        /// The machine.
        machine: String,
        /// The code on the machine's console, e.g. `K7QP-3MZX`.
        code: String,
    },
    /// Whether a machine's config renders, its digest, warnings and provisioning window.
    Config {
        /// The machine.
        machine: String,
    },
    /// Move a machine along its lifecycle, e.g. accept a discovered one: `state NAME registered`.
    State {
        /// The machine.
        machine: String,
        /// discovered, registered, inspecting, ready, provisioning, installed, failed, maintenance.
        state: String,
        /// Why (required for failed).
        #[arg(long)]
        reason: Option<String>,
    },
    /// The boot timeline of a machine: every DHCP, TFTP and HTTP step and config fetch seen for
    /// it, with the state changes and reinstall stages between them, oldest first.
    Timeline {
        /// The machine.
        machine: String,
    },
    /// Where a machine stands: its state and why, its reinstall stage and deadline, its last DHCP
    /// exchange and boot step, and its provisioning window.
    Status {
        /// The machine.
        machine: String,
    },
    /// Remove a machine. Refused while a reinstall of it runs, unless `--force`.
    Rm {
        /// The machine.
        machine: String,
        /// Remove it even while a reinstall runs (the reinstall is cancelled first, recorded).
        #[arg(long)]
        force: bool,
    },
    /// Import a CSV or JSON file as one transaction.
    Import {
        /// The file (.csv or .json).
        file: PathBuf,
        /// csv or json (default: from the file name).
        #[arg(long)]
        format: Option<String>,
        /// Rows that match a machine by --key replace it (state, id and history kept); the
        /// others are created. Still one transaction.
        #[arg(long)]
        update: bool,
        /// What --update matches rows by: mac (the row's boot NIC), serial or hostname.
        #[arg(long, default_value = "mac", requires = "update")]
        key: String,
    },
}

/// `plinth machine add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// A JSON file with the whole machine (fields below override it).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Host name.
    #[arg(long)]
    pub hostname: Option<String>,
    /// NIC MAC address; repeat for more NICs (the first is the boot NIC).
    #[arg(long = "mac")]
    pub macs: Vec<String>,
    /// Reserved IPv4 of the first NIC.
    #[arg(long)]
    pub ip: Option<String>,
    /// Serial number.
    #[arg(long)]
    pub serial: Option<String>,
    /// Asset tag.
    #[arg(long)]
    pub asset_tag: Option<String>,
    /// SMBIOS UUID.
    #[arg(long)]
    pub uuid: Option<String>,
    /// Manufacturer.
    #[arg(long)]
    pub manufacturer: Option<String>,
    /// Model.
    #[arg(long)]
    pub model: Option<String>,
    /// Site.
    #[arg(long)]
    pub site: Option<String>,
    /// Rack.
    #[arg(long)]
    pub rack: Option<String>,
    /// Rack unit.
    #[arg(long)]
    pub unit: Option<u16>,
    /// control-plane or worker.
    #[arg(long)]
    pub role: Option<String>,
    /// Cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Profile.
    #[arg(long)]
    pub profile: Option<String>,
    /// BMC Redfish URL.
    #[arg(long)]
    pub bmc_url: Option<String>,
    /// BMC user.
    #[arg(long)]
    pub bmc_user: Option<String>,
    /// File holding the BMC password (or set PLINTH_BMC_PASSWORD); never on the command line.
    #[arg(long)]
    pub bmc_password_file: Option<PathBuf>,
    /// BMC TLS mode: verify, pinned, insecure, or insecure-http (an http:// BMC with a password:
    /// the password crosses the network in clear).
    #[arg(long)]
    pub bmc_tls: Option<String>,
    /// BMC certificate SHA-256 fingerprint (with --bmc-tls pinned).
    #[arg(long)]
    pub bmc_fingerprint: Option<String>,
}

fn opt(v: &Option<String>) -> Value {
    v.as_ref().map_or(Value::Null, |s| Value::String(s.clone()))
}

/// Turn `key=value` pairs into a merge patch (dotted keys nest; empty values clear).
pub fn set_patch(pairs: &[String]) -> anyhow::Result<Value> {
    let mut root = Map::new();
    for pair in pairs {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("`{pair}` is not KEY=VALUE"))?;
        let value = if v.is_empty() {
            Value::Null
        } else {
            match serde_json::from_str::<Value>(v) {
                Ok(
                    j @ (Value::Number(_) | Value::Array(_) | Value::Object(_) | Value::Bool(_)),
                ) => j,
                _ => Value::String(v.to_string()),
            }
        };
        let mut cur = &mut root;
        let parts: Vec<&str> = k.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            if i + 1 == parts.len() {
                cur.insert((*part).to_string(), value.clone());
            } else {
                let next = cur
                    .entry((*part).to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !next.is_object() {
                    *next = Value::Object(Map::new());
                }
                cur = next.as_object_mut().context("nested key")?;
            }
        }
    }
    Ok(Value::Object(root))
}

fn machine_spec(a: &AddArgs) -> anyhow::Result<Value> {
    let mut spec = match &a.file {
        Some(f) => serde_json::from_str(
            &std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        )
        .with_context(|| format!("{} is not JSON", f.display()))?,
        None => json!({}),
    };
    let fields = [
        ("hostname", opt(&a.hostname)),
        ("serial", opt(&a.serial)),
        ("asset_tag", opt(&a.asset_tag)),
        ("smbios_uuid", opt(&a.uuid)),
        ("manufacturer", opt(&a.manufacturer)),
        ("model", opt(&a.model)),
        ("site", opt(&a.site)),
        ("rack", opt(&a.rack)),
        ("rack_unit", a.unit.map_or(Value::Null, |u| json!(u))),
        ("role", opt(&a.role)),
        ("cluster", opt(&a.cluster)),
        ("profile", opt(&a.profile)),
    ];
    for (k, v) in fields {
        if !v.is_null() {
            spec[k] = v;
        }
    }
    if !a.macs.is_empty() {
        let nics: Vec<Value> = a
            .macs
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut n = json!({"mac": m, "boot": i == 0});
                if i == 0 {
                    if let Some(ip) = &a.ip {
                        n["ipv4"] = json!(ip);
                    }
                }
                n
            })
            .collect();
        spec["interfaces"] = Value::Array(nics);
    } else if a.ip.is_some() {
        bail!("--ip needs --mac: the address is reserved for a NIC");
    }
    if let Some(url) = &a.bmc_url {
        let mut b = json!({"url": url, "username": a.bmc_user.clone().unwrap_or_default()});
        let pw = match (
            &a.bmc_password_file,
            crate::config::env_value("PLINTH_BMC_PASSWORD"),
        ) {
            (Some(f), _) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("cannot read {}", f.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
            (None, env) => env,
        };
        if let Some(pw) = pw {
            b["password"] = json!(pw);
        }
        if let Some(t) = &a.bmc_tls {
            b["tls"] = json!(t);
        }
        if let Some(fp) = &a.bmc_fingerprint {
            b["fingerprint"] = json!(fp);
        }
        spec["bmc"] = b;
    }
    Ok(spec)
}

fn boot_nic(m: &Value) -> (String, String) {
    let nics = m["interfaces"].as_array().cloned().unwrap_or_default();
    let nic = nics
        .iter()
        .find(|n| n["boot"] == json!(true))
        .or(nics.first())
        .cloned()
        .unwrap_or(Value::Null);
    (s(&nic["mac"]), s(&nic["ipv4"]))
}

/// The columns of `machine list`: header, priority without `--wide` (`None`: only with
/// `--wide`; when the table is too wide for the terminal, the largest numbers go first), value.
type Column = (&'static str, Option<u8>, fn(&Value) -> String);

const LIST_COLUMNS: &[Column] = &[
    ("HOSTNAME", Some(0), |m| s(&m["hostname"])),
    ("STATE", Some(1), |m| s(&m["state"])),
    ("ROLE", Some(4), |m| s(&m["role"])),
    ("CLUSTER", Some(5), |m| s(&m["cluster"])),
    ("SITE", None, |m| s(&m["site"])),
    ("RACK/U", Some(6), |m| {
        match (s(&m["rack"]), s(&m["rack_unit"])) {
            (r, u) if u.is_empty() => r,
            (r, u) => format!("{r}/{u}"),
        }
    }),
    ("BOOT MAC", Some(2), |m| boot_nic(m).0),
    ("IPV4", Some(3), |m| boot_nic(m).1),
    ("SERIAL", None, |m| s(&m["serial"])),
    ("ASSET TAG", None, |m| s(&m["asset_tag"])),
    ("SMBIOS UUID", None, |m| s(&m["smbios_uuid"])),
    ("ID", None, |m| s(&m["id"])),
];

/// Host name first; the long identifiers only with `--wide`, which also leaves the table at its
/// natural width. Without it, columns that do not fit the terminal are left out (and named on
/// stderr), least useful first. Returns the headers left out.
fn print_list(items: &[Value], wide: bool) -> Vec<&'static str> {
    let columns: Vec<&Column> = LIST_COLUMNS
        .iter()
        .filter(|c| wide || c.1.is_some())
        .collect();
    let header: Vec<&str> = columns.iter().map(|c| c.0).collect();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|m| columns.iter().map(|c| (c.2)(m)).collect())
        .collect();
    let kept = if wide {
        (0..columns.len()).collect()
    } else {
        let priority: Vec<u8> = columns.iter().map(|c| c.1.unwrap_or(u8::MAX)).collect();
        columns_that_fit(&header, &rows, &priority)
    };
    let mut t = if wide { wide_table() } else { table() };
    t.set_header(kept.iter().map(|i| header[*i]));
    for r in &rows {
        t.add_row(kept.iter().map(|i| r[*i].clone()));
    }
    say(&t);
    (0..columns.len())
        .filter(|i| !kept.contains(i))
        .map(|i| header[i])
        .collect()
}

/// A relay circuit pin in words.
fn circuit_text(p: &Value) -> String {
    let circuit = match p["circuit_id"].as_str() {
        Some(c) => format!("circuit {c}"),
        None => "no circuit id".into(),
    };
    format!(
        "relay {} {circuit} (pinned by {} at {})",
        s(&p["relay"]),
        s(&p["pinned_by"]),
        s(&p["pinned_at"])
    )
}

fn print_machine(m: &Value) {
    let mut t = table();
    for k in [
        "id",
        "hostname",
        "state",
        "state_reason",
        "role",
        "cluster",
        "profile",
        "site",
        "rack",
        "rack_unit",
        "serial",
        "asset_tag",
        "smbios_uuid",
        "manufacturer",
        "model",
        "version",
        "created_at",
        "updated_at",
    ] {
        if !m[k].is_null() {
            t.add_row([k.to_string(), s(&m[k])]);
        }
    }
    if let Some(b) = m["bmc"].as_object() {
        t.add_row([
            "bmc".to_string(),
            format!(
                "{} (user {}, tls {}, password {})",
                s(&b["url"]),
                s(&b["username"]),
                s(&b["tls"]),
                if b["has_password"] == json!(true) {
                    "stored"
                } else {
                    "none"
                }
            ),
        ]);
    }
    if m["dhcp_circuit"].is_object() {
        t.add_row(["dhcp_circuit".to_string(), circuit_text(&m["dhcp_circuit"])]);
    }
    for n in m["interfaces"].as_array().into_iter().flatten() {
        let boot = if n["boot"] == json!(true) {
            " (boot)"
        } else {
            ""
        };
        t.add_row([
            "interface".to_string(),
            format!("{} {}{boot}", s(&n["mac"]), s(&n["ipv4"]))
                .trim()
                .to_string(),
        ]);
    }
    for d in m["disks"].as_array().into_iter().flatten() {
        t.add_row([
            "disk".to_string(),
            format!(
                "{} {} {} {}B{}",
                s(&d["type"]),
                s(&d["model"]),
                s(&d["serial"]),
                s(&d["size_bytes"]),
                if d["data_disk"] == json!(true) {
                    " data"
                } else {
                    ""
                }
            ),
        ]);
    }
    say(&t);
}

fn print_inspection(r: &Value) {
    let changes = r["changes"].as_array().cloned().unwrap_or_default();
    let conflicts = r["conflicts"].as_array().cloned().unwrap_or_default();
    if !changes.is_empty() {
        let mut t = table();
        t.set_header(["CHANGED", "BEFORE", "AFTER"]);
        for c in &changes {
            t.add_row([s(&c["field"]), s(&c["before"]), s(&c["after"])]);
        }
        say(&t);
    }
    if !conflicts.is_empty() {
        let mut t = table();
        t.set_header(["CONFLICT", "INVENTORY", "BMC REPORTS", "OWNED BY"]);
        for c in &conflicts {
            let owner = if c["owner"].is_object() {
                format!("{} ({})", s(&c["owner"]["name"]), s(&c["owner"]["id"]))
            } else {
                String::new()
            };
            t.add_row([s(&c["field"]), s(&c["registered"]), s(&c["found"]), owner]);
        }
        say(&t);
    }
    say(format!(
        "{}: {} change(s), {} conflict(s) not written; version {}",
        s(&r["machine"]["name"]),
        changes.len(),
        conflicts.len(),
        s(&r["version"])
    ));
}

/// `plinth machine inspect MACHINE`: inspect through the BMC, print what changed.
async fn inspect(api: &ApiClient, machine: &str, json_out: bool) -> anyhow::Result<()> {
    let id = api.machine_id(machine).await?;
    let (_, r) = api
        .send(api.req(reqwest::Method::POST, &format!("/machines/{id}/inspect")))
        .await?;
    emit(json_out, &r, print_inspection);
    Ok(())
}

/// Run `plinth machine ...`.
pub async fn run(args: Box<MachineArgs>) -> anyhow::Result<()> {
    let api = args.api.client()?;
    let json_out = args.api.json;
    use reqwest::Method;
    match args.command {
        MachineCommand::Add(a) => {
            let spec = machine_spec(&a)?;
            let (_, m) = api
                .send(api.req(Method::POST, "/machines").json(&spec))
                .await?;
            emit(json_out, &m, print_machine);
        }
        MachineCommand::List {
            state,
            site,
            rack,
            cluster,
            role,
            q,
            limit,
            all,
            wide,
        } => {
            let mut items = Vec::new();
            let mut cursor: Option<String> = None;
            let mut total;
            loop {
                let mut query: Vec<(&str, String)> = vec![("limit", limit.to_string())];
                for (k, v) in [
                    ("state", &state),
                    ("site", &site),
                    ("rack", &rack),
                    ("cluster", &cluster),
                    ("role", &role),
                    ("q", &q),
                ] {
                    if let Some(v) = v {
                        query.push((k, v.clone()));
                    }
                }
                if let Some(c) = &cursor {
                    query.push(("cursor", c.clone()));
                }
                let (_, page) = api
                    .send(api.req(Method::GET, "/machines").query(&query))
                    .await?;
                total = page["total"].as_i64().unwrap_or(0);
                items.extend(page["items"].as_array().cloned().unwrap_or_default());
                cursor = page["next_cursor"].as_str().map(str::to_string);
                if !all || cursor.is_none() {
                    break;
                }
            }
            if json_out {
                say(serde_json::to_string_pretty(&items)?);
            } else {
                let hidden = print_list(&items, wide);
                let more = if cursor.is_some() {
                    " (more: use --all)"
                } else {
                    ""
                };
                say(format!("{} of {total} machine(s){more}", items.len()));
                if !hidden.is_empty() {
                    eprintln!(
                        "{} left out to fit {} columns; --wide shows every column",
                        hidden.join(", "),
                        super::output::width()
                    );
                }
            }
        }
        MachineCommand::Show { machine } => {
            let (_, mut m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let (_, pin) = api
                .send(api.req(Method::GET, &format!("/machines/{id}/dhcp-circuit")))
                .await?;
            if let Value::Object(o) = &mut m {
                o.insert("dhcp_circuit".into(), pin["dhcp_circuit"].clone());
            }
            emit(json_out, &m, print_machine);
        }
        MachineCommand::Approve { machine, code } => {
            let id = api.machine_id(&machine).await?;
            api.send(
                api.req(Method::POST, &format!("/machines/{id}/config/approve"))
                    .json(&json!({ "code": code })),
            )
            .await?;
            emit(
                json_out,
                &json!({ "approved": true, "machine": id }),
                |_| {
                    say(format!(
                        "approved: {machine}'s config is served at its next fetch"
                    ))
                },
            );
        }
        MachineCommand::Circuit {
            machine,
            relay,
            circuit_id,
            remote_id,
            clear,
        } => {
            let id = api.machine_id(&machine).await?;
            let path = format!("/machines/{id}/dhcp-circuit");
            let rb = match (relay, clear) {
                (Some(relay), _) => api.req(Method::PUT, &path).json(&json!({
                    "relay": relay, "circuit_id": circuit_id, "remote_id": remote_id,
                })),
                (None, true) => api.req(Method::DELETE, &path),
                (None, false) => api.req(Method::GET, &path),
            };
            let (_, pin) = api.send(rb).await?;
            emit(json_out, &pin, |v| match v["dhcp_circuit"].as_object() {
                Some(_) => say(circuit_text(&v["dhcp_circuit"])),
                None => say("no circuit pinned (the next relayed request pins its circuit)"),
            });
        }
        MachineCommand::Edit {
            machine,
            set,
            file,
            nic,
            rack,
            site,
            cluster,
            role,
            yes,
        } => {
            let Some(machine) = machine else {
                let selection = edit::selection(&rack, &site, &cluster, &role);
                let mut patch = set_patch(&set)?;
                if let Some(f) = file {
                    let text = std::fs::read_to_string(&f)
                        .with_context(|| format!("cannot read {}", f.display()))?;
                    let from_file: Value = serde_json::from_str(&text)
                        .with_context(|| format!("{} is not JSON", f.display()))?;
                    crate::service::inventory::merge_patch(&mut patch, &from_file);
                }
                edit::require_changes(&patch)?;
                return edit::bulk(&api, &selection, &patch, yes, json_out).await;
            };
            if let Some(mac) = nic {
                let (version, m) = api.get_machine(&machine).await?;
                let id = s(&m["id"]);
                let patch = edit::nic_patch(&m, &mac, &set)?;
                let (_, m) = api
                    .send(
                        api.req(Method::PATCH, &format!("/machines/{id}"))
                            .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
                            .json(&patch),
                    )
                    .await?;
                emit(json_out, &m, print_machine);
                return Ok(());
            }
            let mut patch = set_patch(&set)?;
            if let Some(f) = file {
                let text = std::fs::read_to_string(&f)
                    .with_context(|| format!("cannot read {}", f.display()))?;
                let from_file: Value = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", f.display()))?;
                crate::service::inventory::merge_patch(&mut patch, &from_file);
            }
            if patch.as_object().is_some_and(Map::is_empty) {
                bail!("nothing to change: give --set KEY=VALUE or --file PATCH.json");
            }
            let (version, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let (_, m) = api
                .send(
                    api.req(Method::PATCH, &format!("/machines/{id}"))
                        .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
                        .json(&patch),
                )
                .await?;
            emit(json_out, &m, print_machine);
            if !json_out {
                // What the edit did besides, e.g. a BMC password discarded because bmc.url moved
                // to another origin (`--json` carries them as `notices`).
                for notice in m["notices"].as_array().into_iter().flatten() {
                    eprintln!("notice: {}", s(notice));
                }
            }
        }
        MachineCommand::Inspect { machine } => {
            inspect(&api, &machine, json_out).await?;
        }
        MachineCommand::State {
            machine,
            state,
            reason,
        } => {
            let (version, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let (_, m) = api
                .send(
                    api.req(Method::POST, &format!("/machines/{id}/state"))
                        .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
                        .json(&json!({"state": state, "reason": reason})),
                )
                .await?;
            emit(json_out, &m, print_machine);
        }
        MachineCommand::Provision {
            machine,
            ttl,
            wipe,
            close,
        } => {
            let (_, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            if close {
                api.send(api.req(Method::DELETE, &format!("/machines/{id}/provision")))
                    .await?;
                say(format!("{machine}: provisioning window closed"));
            } else {
                let (_, w) = api
                    .send(
                        api.req(Method::POST, &format!("/machines/{id}/provision"))
                            .json(&json!({"ttl_seconds": ttl, "wipe": wipe})),
                    )
                    .await?;
                if json_out {
                    say(&w);
                } else {
                    for warning in w["warnings"].as_array().into_iter().flatten() {
                        eprintln!("warning: {}", s(warning));
                    }
                    say(format!(
                        "{machine}: provisioning window open until {}; config sha256 {}; network-boot the machine to install",
                        s(&w["window"]["expires_at"]),
                        s(&w["sha256"])
                    ));
                }
            }
        }
        MachineCommand::Reinstall {
            machine,
            wipe,
            follow,
            cancel,
        } => {
            let (_, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            if cancel {
                let (_, c) = api
                    .send(api.req(Method::POST, &format!("/machines/{id}/reinstall/cancel")))
                    .await?;
                if json_out {
                    say(&c);
                } else {
                    let at = match c["stage"].as_str() {
                        Some(st) => format!("reinstall cancelled at stage {st}"),
                        None => "provisioning cancelled".into(),
                    };
                    say(format!(
                        "{machine}: {at}; the machine is {} and its provisioning window is closed",
                        s(&c["state"])
                    ));
                }
                return Ok(());
            }
            // The whole feed of the machine: the reinstall's stages and, when it holds, why.
            let stream = if follow {
                Some(events::open_stream(&api, Some(&id), None).await?)
            } else {
                None
            };
            let (_, started) = api
                .send(
                    api.req(Method::POST, &format!("/machines/{id}/reinstall"))
                        .json(&json!({"wipe": wipe})),
                )
                .await?;
            if json_out {
                say(&started);
            } else {
                for warning in started["warnings"].as_array().into_iter().flatten() {
                    eprintln!("warning: {}", s(warning));
                }
                say(format!(
                    "{machine}: reinstall started; {}",
                    s(&started["next"])
                ));
            }
            if let Some(stream) = stream {
                events::print_stream(stream, true).await?;
            }
        }
        MachineCommand::Events {
            machine,
            kind,
            follow,
        } => {
            let id = match &machine {
                Some(m) => Some(s(&api.get_machine(m).await?.1["id"])),
                None => None,
            };
            if follow {
                events::follow(&api, id.as_deref(), kind.as_deref(), false).await?;
            } else {
                let mut q = vec![];
                if let Some(i) = &id {
                    q.push(format!("machine={i}"));
                }
                if let Some(k) = &kind {
                    q.push(format!("kind={}", urlencode(k)));
                }
                let (_, list) = api
                    .send(api.req(Method::GET, &format!("/events?{}", q.join("&"))))
                    .await?;
                for e in list.as_array().into_iter().flatten() {
                    events::print(json_out, e);
                }
            }
        }
        MachineCommand::Timeline { machine } => {
            let id = api.machine_id(&machine).await?;
            let (_, list) = api
                .send(api.req(Method::GET, &format!("/machines/{id}/timeline")))
                .await?;
            if json_out {
                say(serde_json::to_string_pretty(&list)?);
            } else {
                let steps = list.as_array().cloned().unwrap_or_default();
                for e in &steps {
                    say(events::timeline_line(e));
                }
                say(format!("{machine}: {} step(s)", steps.len()));
            }
        }
        MachineCommand::Status { machine } => {
            let status = status::gather(&api, &machine).await?;
            emit(json_out, &status, status::print);
        }
        MachineCommand::Config { machine } => {
            let (_, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let (_, c) = api
                .send(api.req(Method::GET, &format!("/machines/{id}/config")))
                .await?;
            if json_out {
                say(&c);
            } else {
                say(format!(
                    "valid: {}\nsha256: {}\ntalos: {}\ninstall disk: {}\nwindow open: {}\nlast served: {} {}",
                    c["valid"],
                    s(&c["sha256"]),
                    s(&c["talos_version"]),
                    s(&c["install_disk"]),
                    c["window_open"],
                    s(&c["served_sha256"]),
                    s(&c["served_at"])
                ));
                if let Some(e) = c["error"].as_str() {
                    say(format!("error: {e}"));
                }
                for w in c["warnings"].as_array().into_iter().flatten() {
                    say(format!("warning: {}", s(w)));
                }
            }
        }
        MachineCommand::Rm { machine, force } => {
            let (version, m) = api.get_machine(&machine).await?;
            let id = s(&m["id"]);
            let query = if force { "?force=true" } else { "" };
            api.send(
                api.req(Method::DELETE, &format!("/machines/{id}{query}"))
                    .header(reqwest::header::IF_MATCH, format!("\"{version}\"")),
            )
            .await?;
            if json_out {
                say(json!({"removed": id}));
            } else {
                say(format!("removed {} ({id})", s(&m["hostname"])));
            }
        }
        MachineCommand::Import {
            file,
            format,
            update,
            key,
        } => {
            // Streamed from the file as it is sent: a sheet of any size is never read whole here.
            let opened = tokio::fs::File::open(&file)
                .await
                .with_context(|| format!("cannot read {}", file.display()))?;
            let length = opened
                .metadata()
                .await
                .with_context(|| format!("cannot read {}", file.display()))?
                .len();
            let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(opened));
            let format = match format {
                Some(f) => f,
                None => match file.extension().and_then(|e| e.to_str()) {
                    Some("csv") => "csv".into(),
                    Some("json") => "json".into(),
                    _ => bail!(
                        "cannot tell the format of {}: give --format csv|json",
                        file.display()
                    ),
                },
            };
            let ct = if format == "csv" {
                "text/csv"
            } else {
                "application/json"
            };
            let (_, r) = api
                .send(
                    api.req(Method::POST, "/machines/import")
                        .query(&[("format", &format)])
                        .query(
                            &update
                                .then_some(("update", key.as_str()))
                                .into_iter()
                                .collect::<Vec<_>>(),
                        )
                        .header(reqwest::header::CONTENT_TYPE, ct)
                        .header(reqwest::header::CONTENT_LENGTH, length)
                        .body(body),
                )
                .await?;
            if json_out {
                say(&r);
            } else if update {
                say(format!(
                    "imported {} machine(s), updated {}, unchanged {}",
                    r["imported"],
                    r["updated"].as_array().map_or(0, Vec::len),
                    r["unchanged"]
                ));
            } else {
                say(format!("imported {} machine(s)", r["imported"]));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_patch_nests_and_clears() {
        let p = set_patch(&[
            "rack=r1".into(),
            "rack_unit=7".into(),
            "bmc.url=https://x".into(),
            "serial=".into(),
        ])
        .expect("patch");
        assert_eq!(
            p,
            json!({"rack": "r1", "rack_unit": 7, "bmc": {"url": "https://x"}, "serial": null})
        );
        assert!(set_patch(&["novalue".into()]).is_err());
    }
}
