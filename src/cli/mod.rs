//! The command line. `Cli` is what `plinth` parses; each command group lives in a file of its
//! own: the server's commands (`serve`, `migrate`, `secret-key`), the commands that work on the
//! database or data directory directly (`token`, `apply`, `config render|diff`, `image`), files
//! only (`cluster init`, `config generate|patch|validate`), the groups that talk to a running
//! server's API (`machine`, `bmc`, `cluster bootstrap|talosconfig|kubeconfig|health`), which
//! share `ApiArgs` (server, token, `--json`) and one client (`api`), `doctor` (checks what an
//! operator gets wrong; reads only) and `completion`. Output helpers (lines, JSON, tables) are in `output`; how the
//! database is found and opened is in `database`. Every command takes `--json`, and under it an
//! error is `{"error": {...}}` on stderr.
//!
//! Arrows inside: every group may import `api`, `output`, `events` and `database`; groups never
//! import each other, nor this file (which imports them all). Outside: `app` (to start the server
//! and open the store), `config`, `domain`, `declare`, `images`, `talos`, `store` (only to redact
//! a database URL for display) and the services the commands call.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, CommandFactory, Parser, Subcommand};
use serde_json::json;

use crate::config::{
    env_value, Config, Overrides, SettingsFile, CONFIG_ENV, DATABASE_URL_ENV, SYSTEM_CONFIG,
};

pub mod api;
pub mod apply;
pub mod bmc;
pub mod cluster;
pub mod config;
mod database;
pub mod doctor;
mod events;
pub mod image;
pub mod machine;
mod output;
pub mod serve;
pub mod token;

pub use api::{describe_error, ApiArgs, ApiClient, ApiFailure};
pub use database::{Settings, SettingsArgs};
pub use machine::set_patch;
pub use output::JsonArg;

/// Plinth: bare-metal provisioning for Talos Linux.
#[derive(Debug, Parser)]
#[command(name = "plinth", version, about)]
pub struct Cli {
    /// Settings file, data directory and database, for the commands that use them.
    #[command(flatten)]
    pub settings: TopSettingsArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `SettingsArgs` given before the command; commands that use no settings (`machine`, `bmc`,
/// `cluster`, `config patch` ...) do not show them in their help, and ignore them here.
#[derive(Debug, Clone, Default, Args)]
pub struct TopSettingsArgs {
    /// Settings file (TOML); see `plinth serve --help`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory; see `plinth serve --help`.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Database URL; see `plinth serve --help`.
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve {
        /// HTTP listen address, e.g. 0.0.0.0:8080.
        #[arg(long)]
        http: Option<String>,
        /// Settings and database.
        #[command(flatten)]
        settings: SettingsArgs,
        /// Output.
        #[command(flatten)]
        out: JsonArg,
    },
    /// Apply pending database migrations and exit (no secret key needed).
    Migrate {
        /// Settings and database.
        #[command(flatten)]
        settings: SettingsArgs,
        /// Output.
        #[command(flatten)]
        out: JsonArg,
    },
    /// Manage API tokens directly in the database (no server needed).
    Token(token::TokenArgs),
    /// Print a new random secret key (for secrets.key_file or PLINTH_SECRET_KEY).
    SecretKey {
        /// Output.
        #[command(flatten)]
        out: JsonArg,
    },
    /// Register and manage machines through the API of a running server.
    Machine(Box<machine::MachineArgs>),
    /// Drive a machine's BMC (power, one-time boot, virtual media) through the API.
    Bmc(Box<bmc::BmcArgs>),
    /// Manage the Talos image cache in the data directory (no server needed).
    Image(image::ImageArgs),
    /// Talos clusters: create a cluster's secrets bundle.
    Cluster(cluster::ClusterArgs),
    /// Talos machine configs: generate, patch and validate config files, and render or diff the
    /// config of a machine in the database.
    Config(config::ConfigArgs),
    /// Load a declarative inventory directory (clusters, profiles, sites, racks, machines) into
    /// the database; prints what changes (per object and per machine config) and, with `--diff`,
    /// the diff of every machine's config (secrets redacted).
    Apply(apply::ApplyArgs),
    /// Check the settings, network, ports, capabilities, iPXE binaries, database, secret key,
    /// Talos images and BMCs, one line per check with the fix; reads only, and exits non-zero
    /// when a check fails.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script: `source <(plinth completion bash)`.
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
        /// Output.
        #[command(flatten)]
        out: JsonArg,
    },
}

impl Command {
    /// Whether `--json` was asked for.
    pub fn json(&self) -> bool {
        match self {
            Command::Serve { out, .. }
            | Command::Migrate { out, .. }
            | Command::SecretKey { out }
            | Command::Completion { out, .. } => out.json,
            Command::Token(a) => a.out.json,
            Command::Image(a) => a.out.json,
            Command::Cluster(a) => a.api.json,
            Command::Config(a) => a.out.json,
            Command::Apply(a) => a.out.json,
            Command::Doctor(a) => a.out.json,
            Command::Machine(a) => a.api.json,
            Command::Bmc(a) => a.api.json,
        }
    }

    /// The settings flags given after the command, for the commands that use the settings.
    fn settings_args(&self) -> Option<&SettingsArgs> {
        match self {
            Command::Serve { settings, .. } | Command::Migrate { settings, .. } => Some(settings),
            Command::Token(a) => Some(&a.settings),
            Command::Image(a) => Some(&a.settings),
            Command::Apply(a) => Some(&a.settings),
            Command::Doctor(a) => Some(&a.settings),
            Command::Config(a) => a.command.settings(),
            Command::SecretKey { .. }
            | Command::Machine(_)
            | Command::Bmc(_)
            | Command::Cluster(_)
            | Command::Completion { .. } => None,
        }
    }
}

impl Cli {
    /// The settings flags, wherever on the line they were given, and the overrides they make.
    fn settings_flags(&self) -> SettingsArgs {
        let top = &self.settings;
        let outer = SettingsArgs {
            config: top.config.clone(),
            data_dir: top.data_dir.clone(),
            database_url: top.database_url.clone(),
        };
        match self.command.settings_args() {
            Some(inner) => inner.clone().or(&outer),
            None => outer,
        }
    }

    /// Overrides for `Config::load`: the flags, then `PLINTH_DATABASE_URL`.
    pub fn overrides(&self) -> Overrides {
        let flags = self.settings_flags();
        let http = match &self.command {
            Command::Serve { http, .. } => http.clone(),
            _ => None,
        };
        Overrides {
            data_dir: flags.data_dir.filter(|d| !d.as_os_str().is_empty()),
            http,
            database_url: flags
                .database_url
                .filter(|u| !u.is_empty())
                .or_else(|| env_value(DATABASE_URL_ENV)),
        }
    }

    /// The validated settings when the command uses them, else `None`. Found as `plinth serve`
    /// finds them: `--config`, `PLINTH_CONFIG`, `/etc/plinth/plinth.toml` when it exists, the
    /// embedded defaults; then the flags.
    pub fn settings(&self) -> anyhow::Result<Option<Settings>> {
        if self.command.settings_args().is_none() {
            // Given before a command that does not use them (`alias plinth='plinth --config F'`
            // then `plinth machine list`): nothing to read.
            return Ok(None);
        }
        let flags = self.settings_flags();
        let file = SettingsFile::locate(flags.config.as_deref());
        if let Some(p) = file.path().filter(|p| !p.exists()) {
            bail!(
                "the settings file {} does not exist (settings: {file}); without --config and {CONFIG_ENV}, Plinth reads {SYSTEM_CONFIG} when it exists, else uses the embedded defaults",
                p.display()
            );
        }
        let config = Config::load(file.path(), &self.overrides())?;
        Ok(Some(Settings { config, file }))
    }
}

/// Run the chosen command with the settings `Cli::settings` loaded for it.
pub async fn run(command: Command, settings: Option<&Settings>) -> anyhow::Result<()> {
    match command {
        Command::Serve { out, .. } => serve::serve(database::required(settings)?, out.json).await,
        Command::Migrate { out, .. } => {
            serve::migrate(database::required(settings)?, out.json).await
        }
        Command::SecretKey { out } => {
            serve::secret_key(out.json);
            Ok(())
        }
        Command::Token(a) => token::run(database::required(settings)?, a).await,
        Command::Machine(args) => machine::run(args).await,
        Command::Bmc(args) => bmc::run(args).await,
        Command::Cluster(a) => cluster::run(a).await,
        Command::Config(a) => config::run(settings, a).await,
        Command::Apply(a) => apply::run(database::required(settings)?, a).await,
        Command::Image(a) => image::run(database::required(settings)?, a).await,
        Command::Doctor(a) => doctor::run(Ok(settings.cloned()), &a).await,
        Command::Completion { shell, .. } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "plinth", &mut out);
            output::say_raw(&String::from_utf8_lossy(&out));
            Ok(())
        }
    }
}

/// Print an error as the command line shows it: `plinth: ...` on stderr, or under `--json` one
/// `{"error": {...}}` object on stderr (an API error as the server gave it, with its status).
pub fn report_error(json_out: bool, e: &anyhow::Error) {
    if !json_out {
        eprintln!("plinth: {e:#}");
        return;
    }
    let body = match e.chain().find_map(|c| c.downcast_ref::<ApiFailure>()) {
        Some(f) => {
            let mut err = match &f.body["error"] {
                serde_json::Value::Object(o) => serde_json::Value::Object(o.clone()),
                _ => json!({"code": "http_error", "message": f.body}),
            };
            err["status"] = json!(f.status);
            err["text"] = json!(format!("{e:#}"));
            json!({ "error": err })
        }
        None => json!({"error": {"code": "failed", "message": format!("{e:#}")}}),
    };
    eprintln!("{body}");
}

/// Handle a command line clap refused: help and version print as usual; a usage error is
/// `{"error": {"code": "usage", ...}}` on stderr when `--json` is on the line. Returns the exit
/// status.
pub fn report_usage(e: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    let json_out = std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    if !json_out
        || matches!(
            e.kind(),
            ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        )
    {
        let _ = e.print();
        return e.exit_code();
    }
    let text = e.render().to_string();
    let message = text
        .lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("error: ")
        .to_string();
    eprintln!(
        "{}",
        json!({"error": {"code": "usage", "message": message, "text": text.trim_end()}})
    );
    e.exit_code()
}
