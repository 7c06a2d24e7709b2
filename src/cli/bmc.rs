//! `plinth bmc power|boot-once|media|capabilities`: a machine's BMC driven through a running
//! server's API (tables by default, `--json` for scripts); the CLI never reaches a BMC itself.
//!
//! Imports `cli::api` and `cli::output` only.

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};

use super::api::ApiArgs;
use super::output::{emit, join, s, say, table};

/// `plinth bmc ...`: connection to the API and the command.
#[derive(Debug, Args)]
pub struct BmcArgs {
    /// Server, token and output.
    #[command(flatten)]
    pub api: ApiArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: BmcCommand,
}

/// `plinth bmc ...`.
#[derive(Debug, Subcommand)]
pub enum BmcCommand {
    /// Show or change the power state; waits until the BMC reports the new state.
    Power {
        /// The machine (id, host name, MAC, serial, asset tag or SMBIOS UUID).
        machine: String,
        /// What to do.
        #[arg(value_parser = ["status", "on", "off", "cycle", "graceful-restart"])]
        action: String,
    },
    /// Boot once from PXE, UEFI HTTP or the (virtual) CD; the BMC's answer is read back.
    BootOnce {
        /// The machine.
        machine: String,
        /// Boot device.
        #[arg(value_parser = ["pxe", "http", "cd"])]
        target: String,
        /// Firmware mode; default: as the BMC has it.
        #[arg(long, value_parser = ["uefi", "legacy"])]
        mode: Option<String>,
    },
    /// Virtual media: insert an image URL, eject, or show the slot.
    Media {
        /// The machine.
        machine: String,
        /// What to do.
        #[command(subcommand)]
        action: MediaCommand,
    },
    /// Show the BMC's capability record; `--refresh` probes the BMC again first.
    Capabilities {
        /// The machine.
        machine: String,
        /// Probe now.
        #[arg(long)]
        refresh: bool,
    },
}

/// `plinth bmc media MACHINE ...`.
#[derive(Debug, Subcommand)]
pub enum MediaCommand {
    /// Insert an ISO the BMC can download (http or https URL).
    Insert {
        /// Image URL.
        url: String,
    },
    /// Eject the virtual CD/DVD.
    Eject,
    /// Show the virtual CD/DVD slot.
    Status,
}

fn print_power(r: &Value) {
    let mut t = table();
    t.add_row(["machine".to_string(), s(&r["machine"]["name"])]);
    if !r["action"].is_null() {
        t.add_row(["action".to_string(), s(&r["action"])]);
    }
    t.add_row(["power".to_string(), s(&r["power_state"])]);
    if let Some(ms) = r["elapsed_ms"].as_u64() {
        t.add_row(["took".to_string(), format!("{:.1} s", ms as f64 / 1000.0)]);
    }
    say(&t);
}

fn print_boot(r: &Value) {
    let mut t = table();
    let o = &r["boot_override"];
    t.add_row(["machine".to_string(), s(&r["machine"]["name"])]);
    t.add_row(["target".to_string(), s(&o["target"])]);
    t.add_row(["enabled".to_string(), s(&o["enabled"])]);
    t.add_row(["mode".to_string(), s(&o["mode"])]);
    say(&t);
}

fn print_media(r: &Value) {
    let mut t = table();
    let m = &r["media"];
    t.add_row(["machine".to_string(), s(&r["machine"]["name"])]);
    t.add_row(["slot".to_string(), s(&m["slot"])]);
    t.add_row(["location".to_string(), s(&m["location"])]);
    t.add_row(["inserted".to_string(), s(&m["inserted"])]);
    t.add_row(["image".to_string(), s(&m["image"])]);
    t.add_row(["connected via".to_string(), s(&m["connected_via"])]);
    let types: Vec<String> = m["media_types"]
        .as_array()
        .into_iter()
        .flatten()
        .map(s)
        .collect();
    t.add_row(["media types".to_string(), types.join(", ")]);
    say(&t);
}

fn print_capabilities(r: &Value) {
    let mut t = table();
    t.add_row(["bmc url".to_string(), s(&r["bmc_url"])]);
    let c = &r["capabilities"];
    if c.is_object() {
        for (label, key) in [
            ("vendor", "vendor"),
            ("model", "model"),
            ("quirks", "quirks"),
            ("redfish version", "redfish_version"),
            ("sessions", "sessions"),
            ("auth", "auth"),
            ("boot mode settable", "boot_mode_settable"),
            ("virtual media", "virtual_media"),
            ("tls", "tls"),
        ] {
            t.add_row([label.to_string(), s(&c[key])]);
        }
        t.add_row(["reset types".to_string(), join(&c["reset_types"])]);
        t.add_row(["boot targets".to_string(), join(&c["boot_targets"])]);
        let e = &c["etag"];
        t.add_row([
            "etag".to_string(),
            format!(
                "offered {}, weak {}, If-Match required {}",
                s(&e["offered"]),
                s(&e["weak"]),
                s(&e["if_match_required"])
            ),
        ]);
        t.add_row(["probed at".to_string(), s(&r["probed_at"])]);
    } else {
        t.add_row(["capabilities".to_string(), "no successful probe yet".into()]);
    }
    if !r["last_error"].is_null() {
        t.add_row(["last attempt failed".to_string(), s(&r["last_error"])]);
    }
    t.add_row(["attempted at".to_string(), s(&r["attempted_at"])]);
    if r["stale"] == json!(true) {
        t.add_row([
            "stale".to_string(),
            "the BMC URL changed since: run with --refresh".into(),
        ]);
    }
    say(&t);
}

/// Run `plinth bmc ...`.
pub async fn run(args: Box<BmcArgs>) -> anyhow::Result<()> {
    let api = args.api.client()?;
    let json_out = args.api.json;
    match args.command {
        BmcCommand::Power { machine, action } => {
            let id = api.machine_id(&machine).await?;
            let path = format!("/machines/{id}/power");
            let rb = if action == "status" {
                api.req(Method::GET, &path)
            } else {
                api.req(Method::POST, &path)
                    .json(&json!({ "action": action }))
            };
            let (_, r) = api.send(rb).await?;
            emit(json_out, &r, print_power);
        }
        BmcCommand::BootOnce {
            machine,
            target,
            mode,
        } => {
            let id = api.machine_id(&machine).await?;
            let mut body = json!({ "target": target });
            if let Some(m) = mode {
                body["mode"] = json!(m);
            }
            let (_, r) = api
                .send(
                    api.req(Method::POST, &format!("/machines/{id}/boot-once"))
                        .json(&body),
                )
                .await?;
            emit(json_out, &r, print_boot);
        }
        BmcCommand::Media { machine, action } => {
            let id = api.machine_id(&machine).await?;
            let path = format!("/machines/{id}/media");
            let rb = match action {
                MediaCommand::Insert { url } => {
                    api.req(Method::POST, &path).json(&json!({ "image": url }))
                }
                MediaCommand::Eject => api.req(Method::DELETE, &path),
                MediaCommand::Status => api.req(Method::GET, &path),
            };
            let (_, r) = api.send(rb).await?;
            emit(json_out, &r, print_media);
        }
        BmcCommand::Capabilities { machine, refresh } => {
            let id = api.machine_id(&machine).await?;
            let path = format!("/machines/{id}/bmc/capabilities");
            let method = if refresh { Method::POST } else { Method::GET };
            let (_, r) = api.send(api.req(method, &path)).await?;
            emit(json_out, &r, print_capabilities);
        }
    }
    Ok(())
}
