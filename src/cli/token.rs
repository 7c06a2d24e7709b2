//! `plinth token create|list|revoke`: API tokens, minted and revoked directly in the database (no
//! server needed). A token's secret is printed once, on stdout, and never stored.
//!
//! Imports `cli::database`, `cli::output` and the token service (built by `app::tokens`).

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;

use super::database::{self, Access, Settings, SettingsArgs};
use super::output::{say, table, JsonArg};
use crate::service::ApiRole;

/// `plinth token ...`: where the database is, output, and the command.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// Settings and database.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Output.
    #[command(flatten)]
    pub out: JsonArg,
    /// What to do.
    #[command(subcommand)]
    pub command: TokenCommand,
}

/// `plinth token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Mint a token and print it (only the token, once) on stdout.
    Create {
        /// viewer, operator or admin.
        #[arg(long)]
        role: String,
        /// Name, shown as the actor of events (default: the role).
        #[arg(long)]
        name: Option<String>,
        /// Expire after this many days.
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token by id.
    Revoke {
        /// Token id.
        id: String,
    },
}

/// Run `plinth token ...` on the configured database.
pub async fn run(settings: &Settings, args: TokenArgs) -> anyhow::Result<()> {
    let json_out = args.out.json;
    let (access, name) = match &args.command {
        TokenCommand::Create { .. } => (Access::Write, "token create"),
        TokenCommand::List => (Access::Read, "token list"),
        TokenCommand::Revoke { .. } => (Access::Write, "token revoke"),
    };
    let tokens = crate::app::tokens(&database::store(settings, access, name, json_out).await?);
    match args.command {
        TokenCommand::Create {
            role,
            name,
            expires_in_days,
        } => {
            let role: ApiRole = role.parse().map_err(anyhow::Error::msg).context("--role")?;
            let name = name.unwrap_or_else(|| role.to_string());
            let expires =
                expires_in_days.map(|d| chrono::Utc::now() + chrono::Duration::days(i64::from(d)));
            let (secret, info) = tokens.create(&name, role, expires, "cli").await?;
            if json_out {
                let mut v = serde_json::to_value(&info)?;
                v["token"] = json!(secret);
                say(serde_json::to_string_pretty(&v)?);
            } else {
                say(secret);
            }
        }
        TokenCommand::List => {
            let list = tokens.list().await?;
            if json_out {
                say(serde_json::to_string_pretty(&list)?);
            } else {
                let mut t = table();
                t.set_header(["NAME", "ROLE", "STATE", "EXPIRES", "ID"]);
                for tok in &list {
                    t.add_row([
                        tok.name.clone(),
                        tok.role.to_string(),
                        if tok.revoked { "revoked" } else { "live" }.to_string(),
                        tok.expires_at
                            .map(|e| e.to_rfc3339())
                            .unwrap_or_else(|| "never".into()),
                        tok.id.to_string(),
                    ]);
                }
                say(&t);
            }
        }
        TokenCommand::Revoke { id } => {
            let id = id.parse().context("token id must be a UUID")?;
            if !tokens.revoke(id, "cli").await? {
                anyhow::bail!("no live token {id}");
            }
            if json_out {
                say(json!({ "revoked": id }));
            } else {
                eprintln!("revoked {id}");
            }
        }
    }
    Ok(())
}
