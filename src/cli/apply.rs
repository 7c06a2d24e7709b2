//! `plinth apply DIR [--dry-run]`: load a declarative inventory directory (clusters, profiles,
//! sites, racks, machines) into the database, printing what changes and the diff of every
//! machine's config (secrets redacted). Needs no server.
//!
//! Imports `cli::database`, `cli::output`, `declare` and the apply use case.

use std::path::Path;

use anyhow::{bail, Context};

use super::database;
use super::output::say;
use crate::config::Config;

/// `plinth apply DIR [--dry-run]`.
pub async fn run(config: &Config, dir: &Path, dry_run: bool) -> anyhow::Result<()> {
    let declared = match crate::declare::load(dir) {
        Ok(d) => d,
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
            }
            bail!(
                "{} problem(s) in {}; nothing was applied",
                errors.len(),
                dir.display()
            );
        }
    };
    let (configs, inventory) = database::services(config).await?;
    let report = crate::service::apply::apply(&configs, &inventory, declared, dry_run, "cli")
        .await
        .context("apply")?;
    for (object, action) in &report.objects {
        say(format!("{:<9} {object}", action.as_str()));
    }
    for (_, diff) in &report.config_diffs {
        say(diff.trim_end());
    }
    for n in &report.notes {
        eprintln!("note: {n}");
    }
    if !report.errors.is_empty() {
        for e in &report.errors {
            eprintln!("error: {e}");
        }
        bail!(
            "{} machine config(s) would not render or validate; nothing was applied",
            report.errors.len()
        );
    }
    let changes = report.changes();
    if dry_run {
        eprintln!(
            "dry run: {changes} change(s), {} machine config(s) would change; nothing was written",
            report.config_diffs.len()
        );
    } else {
        eprintln!(
            "applied: {changes} change(s), {} machine config(s) changed",
            report.config_diffs.len()
        );
    }
    Ok(())
}
