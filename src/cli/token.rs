//! `plinth token create|list|revoke`: API tokens, minted and revoked directly in the database (no
//! server needed). A token's secret is printed once, on stdout, and never stored.
//!
//! Imports `cli::database`, `cli::output` and the token service.

use anyhow::Context;
use clap::Subcommand;

use super::output::say;
use crate::service::{ApiRole, Tokens};

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
pub async fn run(config: &crate::config::Config, cmd: TokenCommand) -> anyhow::Result<()> {
    let tokens = Tokens::new(super::database::store(config).await?);
    match cmd {
        TokenCommand::Create {
            role,
            name,
            expires_in_days,
        } => {
            let role: ApiRole = role.parse().map_err(anyhow::Error::msg).context("--role")?;
            let name = name.unwrap_or_else(|| role.to_string());
            let expires =
                expires_in_days.map(|d| chrono::Utc::now() + chrono::Duration::days(i64::from(d)));
            let (secret, _) = tokens.create(&name, role, expires, "cli").await?;
            say(secret);
        }
        TokenCommand::List => {
            for t in tokens.list().await? {
                let state = if t.revoked { "revoked" } else { "live" };
                let exp = t
                    .expires_at
                    .map(|e| e.to_rfc3339())
                    .unwrap_or_else(|| "never".into());
                say(format!(
                    "{}\t{}\t{}\t{state}\texpires {exp}",
                    t.id, t.name, t.role
                ));
            }
        }
        TokenCommand::Revoke { id } => {
            let id = id.parse().context("token id must be a UUID")?;
            if !tokens.revoke(id, "cli").await? {
                anyhow::bail!("no live token {id}");
            }
            eprintln!("revoked {id}");
        }
    }
    Ok(())
}
