//! `plinth config ...`: Talos machine configs. `generate`, `patch` and `validate` work on files
//! (no server, no database); `render` and `diff` read a machine's config from the database, as
//! `plinth serve` would serve it (rendered configs carry cluster secrets and go to stdout, the
//! operator's terminal, never a log; diffs have secret values redacted).
//!
//! Imports `cli::database`, `cli::output`, `talos`, `domain` and the config service.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::json;

use super::database::{self, Access, Settings, SettingsArgs};
use super::output::{say, say_raw, JsonArg};
use crate::service::machine_config::config_diff;

/// `plinth config ...`: output and the command.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Output.
    #[command(flatten)]
    pub out: JsonArg,
    /// What to do.
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// `plinth config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Apply patches to a machine config file and print the result, as `talosctl machineconfig
    /// patch` does: strategic merge patches (typed merge rules, `$patch: delete`) or RFC 6902 JSON
    /// patches (refused on multi-document configs, as Talos does).
    Patch {
        /// The machine config (multi-document YAML).
        file: PathBuf,
        /// A patch: `@FILE` or inline YAML/JSON; repeat to apply several in order.
        #[arg(long = "patch", short = 'p', required = true)]
        patches: Vec<String>,
        /// Write here instead of stdout.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
    },
    /// Validate a machine config against the Talos JSON schema of its version and Talos's own rules.
    Validate {
        /// The machine config.
        file: PathBuf,
        /// Target Talos version, e.g. v1.11.6.
        #[arg(long)]
        version: String,
        /// The JSON schema of that version (config.schema.json from the Talos release); by
        /// default the schema of that release embedded in Plinth.
        #[arg(long)]
        schema: Option<PathBuf>,
    },
    /// Generate the base machine config of a role from a secrets bundle, natively, in the shape
    /// `talosctl gen config` writes for that Talos release, and print it. Control-plane configs
    /// carry the cluster's private keys: keep them out of Git.
    Generate {
        /// The secrets bundle (from `plinth cluster init` or `talosctl gen secrets`).
        #[arg(long)]
        secrets: PathBuf,
        /// Cluster name.
        #[arg(long)]
        name: String,
        /// Control-plane endpoint, e.g. https://10.0.0.10:6443.
        #[arg(long)]
        endpoint: String,
        /// Target Talos version, e.g. v1.11.6.
        #[arg(long)]
        talos_version: String,
        /// `controlplane` or `worker`.
        #[arg(long)]
        role: String,
        /// Kubernetes version (default: that of the Talos release).
        #[arg(long)]
        kubernetes_version: Option<String>,
        /// Installer image (default: ghcr.io/siderolabs/installer:<talos-version>).
        #[arg(long)]
        install_image: Option<String>,
        /// Install disk, e.g. /dev/sda (default: none, left to the machine's facts).
        #[arg(long)]
        install_disk: Option<String>,
    },
    /// Print the config Plinth would serve a machine now (from the database; it carries the
    /// cluster's secrets). Warnings and the install disk go to stderr.
    Render {
        /// The machine (id, host name, MAC, serial, asset tag or SMBIOS UUID).
        machine: String,
        /// Settings and database.
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Compare a machine's config now with the one it was last served (secrets redacted).
    Diff {
        /// The machine.
        machine: String,
        /// Settings and database.
        #[command(flatten)]
        settings: SettingsArgs,
    },
}

impl ConfigCommand {
    /// The settings flags of the commands that read the database (and so the settings).
    pub fn settings(&self) -> Option<&SettingsArgs> {
        match self {
            ConfigCommand::Render { settings, .. } | ConfigCommand::Diff { settings, .. } => {
                Some(settings)
            }
            _ => None,
        }
    }
}

/// Run `plinth config ...`; `settings` is given for the commands that use the database.
pub async fn run(settings: Option<&Settings>, args: ConfigArgs) -> anyhow::Result<()> {
    use crate::talos::{patch, validate, MachineConfig, TalosVersion};
    let json_out = args.out.json;
    match args.command {
        ConfigCommand::Render { machine, .. } => {
            render(database::required(settings)?, &machine, json_out).await?;
        }
        ConfigCommand::Diff { machine, .. } => {
            diff(database::required(settings)?, &machine, json_out).await?;
        }
        ConfigCommand::Patch {
            file,
            patches,
            output,
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let cfg = MachineConfig::parse(&text).with_context(|| format!("{}", file.display()))?;
            let mut loaded = Vec::new();
            for p in &patches {
                let patch = match p.strip_prefix('@') {
                    Some(path) => patch::load_patch_file(std::path::Path::new(path))
                        .with_context(|| format!("patch {path}"))?,
                    None => patch::load_patch(p).context("inline patch")?,
                };
                loaded.push(patch);
            }
            let out = patch::apply(&cfg, &loaded)?.to_yaml()?;
            match output {
                Some(o) => {
                    std::fs::write(&o, out)
                        .with_context(|| format!("cannot write {}", o.display()))?;
                    if json_out {
                        say(json!({ "written": o }));
                    }
                }
                None if json_out => say(json!({ "yaml": out })),
                None => say(out.trim_end()),
            }
        }
        ConfigCommand::Validate {
            file,
            version,
            schema,
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let cfg = MachineConfig::parse(&text).with_context(|| format!("{}", file.display()))?;
            let version: TalosVersion = version
                .parse()
                .map_err(|e| anyhow::anyhow!("--version: {e}"))?;
            let result = match &schema {
                Some(schema) => validate::validate_with_schema_file(&cfg, schema, version),
                None => validate::validate_embedded(&cfg, version),
            };
            match result {
                Ok(warnings) if json_out => {
                    say(json!({
                        "file": file, "version": version.to_string(), "valid": true,
                        "warnings": warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        "errors": [],
                    }));
                }
                Ok(warnings) => {
                    for w in &warnings {
                        eprintln!("warning: {w}");
                    }
                    say(format!(
                        "{}: valid for Talos {version} ({} warning(s))",
                        file.display(),
                        warnings.len()
                    ));
                }
                Err(validate::ValidateError::Invalid(report)) => {
                    if json_out {
                        say(json!({
                            "file": file, "version": version.to_string(), "valid": false,
                            "warnings": report.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
                            "errors": report.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        }));
                    } else {
                        for w in &report.warnings {
                            eprintln!("warning: {w}");
                        }
                        for e in &report.errors {
                            eprintln!("error: {e}");
                        }
                    }
                    bail!(
                        "{}: {} error(s); this config would not be served",
                        file.display(),
                        report.errors.len()
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
        ConfigCommand::Generate {
            secrets,
            name,
            endpoint,
            talos_version,
            role,
            kubernetes_version,
            install_image,
            install_disk,
        } => {
            use crate::domain::Role;
            use crate::talos::generate::{generate, GenerateOptions};
            use crate::talos::secrets::SecretsBundle;
            let version: TalosVersion = talos_version
                .parse()
                .map_err(|e| anyhow::anyhow!("--talos-version: {e}"))?;
            let role = match role.trim().to_ascii_lowercase().as_str() {
                "controlplane" | "control-plane" => Role::ControlPlane,
                "worker" => Role::Worker,
                other => bail!("--role: `{other}` is not one of: controlplane, worker"),
            };
            let text = std::fs::read_to_string(&secrets)
                .with_context(|| format!("cannot read {}", secrets.display()))?;
            let bundle =
                SecretsBundle::parse(&text).with_context(|| format!("{}", secrets.display()))?;
            let opts = GenerateOptions {
                kubernetes_version,
                install_image,
                install_disk,
                ..GenerateOptions::new(name, endpoint, version)
            };
            let yaml = generate(&bundle, role, &opts)?.to_yaml()?;
            if json_out {
                say(json!({ "yaml": yaml }));
            } else {
                say(yaml.trim_end());
            }
        }
    }
    Ok(())
}

/// `plinth config render MACHINE`: the config Plinth would serve now, on stdout; warnings on
/// stderr (all in one object with `--json`).
async fn render(settings: &Settings, machine: &str, json_out: bool) -> anyhow::Result<()> {
    let (configs, inventory) =
        database::services(settings, Access::Read, "config render", json_out).await?;
    let m = crate::service::apply::resolve(&inventory, machine).await?;
    let r = configs
        .render_machine(&m)
        .await
        .with_context(|| format!("machine {machine}"))?;
    if json_out {
        say(json!({
            "machine": m.hostname.clone().unwrap_or_else(|| m.id.to_string()),
            "id": m.id.to_string(),
            "sha256": r.sha256,
            "install_disk": r.install_disk,
            "warnings": r.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "yaml": r.yaml,
        }));
        return Ok(());
    }
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(d) = &r.install_disk {
        eprintln!("install disk: {d}");
    }
    eprintln!("sha256: {}", r.sha256);
    say_raw(&r.yaml);
    Ok(())
}

/// `plinth config diff MACHINE`: what changed since the config was last served (secrets
/// redacted). Exit status 0 either way; "no difference" is said on stderr.
async fn diff(settings: &Settings, machine: &str, json_out: bool) -> anyhow::Result<()> {
    let (configs, inventory) =
        database::services(settings, Access::Read, "config diff", json_out).await?;
    let m = crate::service::apply::resolve(&inventory, machine).await?;
    let now = configs
        .render_machine(&m)
        .await
        .with_context(|| format!("machine {machine}"))?;
    let served = configs.last_served(m.id).await?;
    let label = m.hostname.clone().unwrap_or_else(|| m.id.to_string());
    let d = config_diff(
        served.as_ref().map(|(y, _)| y.as_str()),
        Some(&now.yaml),
        &label,
    );
    if json_out {
        say(json!({
            "machine": label,
            "id": m.id.to_string(),
            "served_at": served.as_ref().map(|(_, at)| at),
            "changed": !d.is_empty(),
            "diff": d,
        }));
        return Ok(());
    }
    match &served {
        None => eprintln!("{label}: no config has been served yet; showing the whole config"),
        Some((_, at)) => eprintln!("{label}: comparing with the config served at {at}"),
    }
    if d.is_empty() {
        eprintln!("{label}: no difference");
    } else {
        say_raw(&d);
    }
    Ok(())
}
