//! `plinth cluster init`: a new cluster's secrets bundle, generated natively into a file only its
//! owner can read. Needs no server and no database.
//!
//! Imports `domain` and `talos` only.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::json;

use super::output::{say, JsonArg};

/// `plinth cluster ...`: output and the command.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Output.
    #[command(flatten)]
    pub out: JsonArg,
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
    },
}

/// Run `plinth cluster ...`.
pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    match args.command {
        ClusterCommand::Init {
            name,
            endpoint,
            out,
        } => {
            crate::domain::machine::check_hostname(&name)
                .map_err(|e| anyhow::anyhow!("cluster name: {e}"))?;
            let rest = endpoint
                .strip_prefix("https://")
                .ok_or_else(|| anyhow::anyhow!("--endpoint: `{endpoint}` must be an https:// URL such as https://10.0.0.10:6443"))?;
            if rest.split('/').next().is_none_or(str::is_empty) {
                bail!("--endpoint: `{endpoint}` has no host");
            }
            let bundle = crate::talos::secrets::SecretsBundle::generate()?;
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
            if args.out.json {
                say(json!({"cluster": name, "endpoint": endpoint, "path": out, "mode": "0600"}));
            } else {
                eprintln!("secrets bundle for cluster {name} ({endpoint}) written to {} (mode 0600); keep it out of Git", out.display());
            }
        }
    }
    Ok(())
}
