//! CLI commands that work on machine configs in the database directly (like `plinth token`, no
//! server needed, run where the data directory or the database and the secret key are):
//! `plinth apply DIR [--dry-run]`, `plinth config render MACHINE`, `plinth config diff MACHINE`.
//! Rendered configs go to stdout (they carry cluster secrets: that is the operator's terminal, not
//! a log); diffs have secret values redacted.

use std::path::Path;

use anyhow::{bail, Context};

use crate::cli::say;
use crate::config::Config;
use crate::service::machine_config::config_diff;
use crate::service::{ConfigService, Inventory};

async fn services(config: &Config) -> anyhow::Result<(ConfigService, Inventory)> {
    let stores = crate::app::open_store(config, true).await?;
    let secrets = crate::app::secret_box(config)?;
    Ok((
        crate::app::config_service(&stores, secrets.clone(), config.talos_schema_dir.clone()),
        crate::app::inventory(&stores, secrets),
    ))
}

/// `plinth apply DIR [--dry-run]`.
pub async fn apply(config: &Config, dir: &Path, dry_run: bool) -> anyhow::Result<()> {
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
    let (configs, inventory) = services(config).await?;
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

/// `plinth config render MACHINE`: the config Plinth would serve now, on stdout; warnings on
/// stderr.
pub async fn render(config: &Config, machine: &str) -> anyhow::Result<()> {
    let (configs, inventory) = services(config).await?;
    let m = crate::service::apply::resolve(&inventory, machine).await?;
    let r = configs
        .render_machine(&m)
        .await
        .with_context(|| format!("machine {machine}"))?;
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(d) = &r.install_disk {
        eprintln!("install disk: {d}");
    }
    eprintln!("sha256: {}", r.sha256);
    print!("{}", r.yaml);
    Ok(())
}

/// `plinth config diff MACHINE`: what changed since the config was last served (secrets
/// redacted). Exit status 0 either way; "no difference" is said on stderr.
pub async fn diff(config: &Config, machine: &str) -> anyhow::Result<()> {
    let (configs, inventory) = services(config).await?;
    let m = crate::service::apply::resolve(&inventory, machine).await?;
    let now = configs
        .render_machine(&m)
        .await
        .with_context(|| format!("machine {machine}"))?;
    let served = configs.last_served(m.id).await?;
    let label = m.hostname.clone().unwrap_or_else(|| m.id.to_string());
    match &served {
        None => eprintln!("{label}: no config has been served yet; showing the whole config"),
        Some((_, at)) => eprintln!("{label}: comparing with the config served at {at}"),
    }
    let d = config_diff(
        served.as_ref().map(|(y, _)| y.as_str()),
        Some(&now.yaml),
        &label,
    );
    if d.is_empty() {
        eprintln!("{label}: no difference");
    } else {
        print!("{d}");
    }
    Ok(())
}
