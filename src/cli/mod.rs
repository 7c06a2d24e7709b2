//! The command line. `Cli` is what `plinth` parses; each command group lives in a file of its
//! own: the server's commands (`serve`, `migrate`, `secret-key`), the commands that work on the
//! database or data directory directly (`token`, `apply`, `config render|diff`, `image`), files
//! only (`cluster init`, `config generate|patch|validate`), and the groups that talk to a running
//! server's API (`machine`, `bmc`), which share `ApiArgs` (server, token, `--json`) and one
//! client. Output helpers (lines, JSON, tables) are in `output`.
//!
//! Arrows inside: every group may import `api`, `output`, `events` and `database`; groups never
//! import each other. Outside: `app` (to start the server and open the store), `config`, `domain`,
//! `declare`, `images`, `talos` and the services the commands call.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::{Config, Overrides};

pub mod api;
pub mod apply;
pub mod bmc;
pub mod cluster;
pub mod config;
mod database;
mod events;
pub mod image;
pub mod machine;
mod output;
pub mod serve;
pub mod token;

pub use api::{describe_error, ApiArgs, ApiClient};
pub use machine::set_patch;

/// Plinth: bare-metal provisioning for Talos Linux.
#[derive(Debug, Parser)]
#[command(name = "plinth", version, about)]
pub struct Cli {
    /// TOML configuration file (see plinth.example.toml). Without one, the embedded defaults apply.
    #[arg(long, global = true, env = "PLINTH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory (SQLite database, generated secret key, caches).
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// Database URL: sqlite://PATH or postgres://USER@HOST/DB.
    #[arg(long, global = true, env = "PLINTH_DATABASE_URL")]
    pub database_url: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve {
        /// HTTP listen address, e.g. 0.0.0.0:8080.
        #[arg(long)]
        http: Option<String>,
    },
    /// Apply pending database migrations and exit.
    Migrate,
    /// Manage API tokens directly in the database (no server needed).
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Print a new random secret key (for secrets.key_file or PLINTH_SECRET_KEY).
    SecretKey,
    /// Register and manage machines through the API of a running server.
    Machine(Box<machine::MachineArgs>),
    /// Drive a machine's BMC (power, one-time boot, virtual media) through the API.
    Bmc(Box<bmc::BmcArgs>),
    /// Manage the Talos image cache in the data directory (no server needed).
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Talos clusters.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Talos machine configs: generate, patch and validate files; render and diff a machine's.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Load a declarative inventory directory (clusters, profiles, sites, racks, machines) into
    /// the database; prints what changes and the diff of every machine's config (secrets redacted).
    Apply {
        /// The directory (see inventory/ in the repository).
        dir: PathBuf,
        /// Show what would change; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

impl Command {
    /// Whether the command reads the settings (the configuration file and the flags that override
    /// it): the server's commands and those that open the database or the data directory.
    pub fn uses_settings(&self) -> bool {
        match self {
            Command::Serve { .. }
            | Command::Migrate
            | Command::Token(_)
            | Command::Image(_)
            | Command::Apply { .. } => true,
            Command::Config(c) => c.uses_database(),
            Command::SecretKey | Command::Machine(_) | Command::Bmc(_) | Command::Cluster(_) => {
                false
            }
        }
    }
}

impl Cli {
    /// Overrides for `Config::load`.
    pub fn overrides(&self) -> Overrides {
        let http = match &self.command {
            Command::Serve { http } => http.clone(),
            _ => None,
        };
        Overrides {
            data_dir: self.data_dir.clone(),
            http,
            database_url: self.database_url.clone(),
        }
    }

    /// The validated settings when the command uses them, else `None`.
    pub fn settings(&self) -> anyhow::Result<Option<Config>> {
        if !self.command.uses_settings() {
            return Ok(None);
        }
        Ok(Some(Config::load(
            self.config.as_deref(),
            &self.overrides(),
        )?))
    }
}

/// The settings of a command that uses them (`Cli::settings` loads them for exactly those).
fn required(settings: Option<&Config>) -> anyhow::Result<&Config> {
    settings.context("this command needs the settings, and they were not loaded")
}

/// Run the chosen command with the settings `Cli::settings` loaded for it.
pub async fn run(command: Command, settings: Option<&Config>) -> anyhow::Result<()> {
    match command {
        Command::Serve { .. } => serve::serve(required(settings)?).await,
        Command::Migrate => serve::migrate(required(settings)?).await,
        Command::SecretKey => {
            serve::secret_key();
            Ok(())
        }
        Command::Token(cmd) => token::run(required(settings)?, cmd).await,
        Command::Machine(args) => machine::run(args).await,
        Command::Bmc(args) => bmc::run(args).await,
        Command::Cluster(cmd) => cluster::run(cmd),
        Command::Config(cmd) => config::run(settings, cmd).await,
        Command::Apply { dir, dry_run } => apply::run(required(settings)?, &dir, dry_run).await,
        Command::Image(cmd) => image::run(required(settings)?, cmd).await,
    }
}
