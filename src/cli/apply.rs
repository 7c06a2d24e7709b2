//! `plinth apply DIR [--dry-run] [--diff]`: load a declarative inventory directory (clusters,
//! profiles, sites, racks, machines) into the database. Prints a summary: each object's action
//! with counts, and for each machine whether its config changes; `--diff` adds the diff of every
//! changed config (secrets redacted). Needs no server.
//!
//! Imports `cli::database`, `cli::output`, `declare` and the apply use case.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;

use super::database::{self, Access, Settings, SettingsArgs};
use super::output::{say, JsonArg};
use crate::service::apply::{Action, ApplyReport};

/// `plinth apply ...`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The directory (see inventory/ in the repository).
    pub dir: PathBuf,
    /// Show what would change; write nothing (and create no database).
    #[arg(long)]
    pub dry_run: bool,
    /// Print the diff of every machine config that changes, not only the summary.
    #[arg(long)]
    pub diff: bool,
    /// Settings and database.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Output.
    #[command(flatten)]
    pub out: JsonArg,
}

/// Each machine the report names and whether its config changes, in name order.
fn machines(report: &ApplyReport) -> BTreeMap<String, bool> {
    let mut out: BTreeMap<String, bool> = report
        .objects
        .iter()
        .filter_map(|(o, _)| o.strip_prefix("Machine "))
        .map(|m| (m.to_string(), false))
        .collect();
    for (m, _) in &report.config_diffs {
        out.insert(m.clone(), true);
    }
    out
}

/// How many objects take each action.
fn count(report: &ApplyReport, action: Action) -> usize {
    report.objects.iter().filter(|(_, a)| *a == action).count()
}

fn print_json(report: &ApplyReport, args: &ApplyArgs) {
    let machines = machines(report);
    let mut v = json!({
        "dry_run": args.dry_run,
        "applied": report.applied,
        "objects": report.objects.iter().map(|(o, a)| json!({"object": o, "action": a.as_str()})).collect::<Vec<_>>(),
        "counts": {
            "create": count(report, Action::Create),
            "update": count(report, Action::Update),
            "unchanged": count(report, Action::Unchanged),
        },
        "machines": machines.iter().map(|(m, c)| json!({"machine": m, "config_changes": c})).collect::<Vec<_>>(),
        "config_changes": report.config_diffs.len(),
        "notes": report.notes,
        "errors": report.errors,
    });
    if args.diff {
        v["diffs"] = report
            .config_diffs
            .iter()
            .map(|(m, d)| (m.clone(), json!(d)))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    say(serde_json::to_string_pretty(&v).unwrap_or_default());
}

fn print_text(report: &ApplyReport, args: &ApplyArgs) {
    for (object, action) in &report.objects {
        say(format!("{:<9} {object}", action.as_str()));
    }
    let machines = machines(report);
    for (m, changes) in &machines {
        let what = if *changes { "changes" } else { "unchanged" };
        say(format!("config    {what:<9} {m}"));
    }
    say(format!(
        "{} object(s): {} new, {} changed, {} unchanged; {} of {} machine config(s) change{}",
        report.objects.len(),
        count(report, Action::Create),
        count(report, Action::Update),
        count(report, Action::Unchanged),
        report.config_diffs.len(),
        machines.len(),
        if args.diff || report.config_diffs.is_empty() {
            ""
        } else {
            " (--diff shows how)"
        }
    ));
    if args.diff {
        for (_, diff) in &report.config_diffs {
            say(diff.trim_end());
        }
    }
    for n in &report.notes {
        eprintln!("note: {n}");
    }
    for e in &report.errors {
        eprintln!("error: {e}");
    }
}

/// Run `plinth apply DIR`.
pub async fn run(settings: &Settings, args: ApplyArgs) -> anyhow::Result<()> {
    let json_out = args.out.json;
    let declared = match crate::declare::load(&args.dir) {
        Ok(d) => d,
        Err(errors) => {
            let list = errors
                .iter()
                .map(|e| format!("\n  {e}"))
                .collect::<String>();
            if !json_out {
                for e in &errors {
                    eprintln!("error: {e}");
                }
            }
            bail!(
                "{} problem(s) in {}; nothing was applied{}",
                errors.len(),
                args.dir.display(),
                if json_out { list } else { String::new() }
            );
        }
    };
    let (access, name) = if args.dry_run {
        (Access::Read, "apply --dry-run")
    } else {
        (Access::Write, "apply")
    };
    let (configs, inventory) = database::services(settings, access, name, json_out).await?;
    let report = crate::service::apply::apply(&configs, &inventory, declared, args.dry_run, "cli")
        .await
        .context("apply")?;
    if json_out {
        print_json(&report, &args);
    } else {
        print_text(&report, &args);
    }
    if !report.errors.is_empty() {
        let machines: usize = report.errors.iter().map(|e| e.machines.len()).sum();
        bail!(
            "{machines} machine config(s) would not render or validate ({} cause(s) above); nothing was applied",
            report.errors.len()
        );
    }
    if json_out {
        return Ok(());
    }
    let changes = report.changes();
    if args.dry_run {
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
