//! `plinth image ...`: the Talos image cache in the data directory (import, pull from an Image
//! Factory with progress, list, remove). Needs no server.
//!
//! Imports `images`, `domain` and `cli::output`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::json;

use super::database::{self, Access, Settings, SettingsArgs};
use super::output::{say, table, JsonArg};
use crate::domain::dhcp::Arch;
use crate::images::{initramfs_name, kernel_name, ImageCache};

/// `plinth image ...`: where the data directory is, output, and the command.
#[derive(Debug, Args)]
pub struct ImageArgs {
    /// Settings and data directory.
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Output.
    #[command(flatten)]
    pub out: JsonArg,
    /// What to do.
    #[command(subcommand)]
    pub command: ImageCommand,
}

/// `plinth image ...`.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Import a kernel and initramfs (air-gapped sites): verified, written atomically.
    Import {
        /// Talos version, e.g. v1.11.6.
        #[arg(long)]
        version: String,
        /// amd64 or arm64.
        #[arg(long, default_value = "amd64")]
        arch: String,
        /// Image Factory schematic id (default: the vanilla schematic).
        #[arg(long, default_value = crate::images::VANILLA_SCHEMATIC)]
        schematic: String,
        /// Kernel file.
        #[arg(long)]
        kernel: PathBuf,
        /// Initramfs file.
        #[arg(long)]
        initramfs: PathBuf,
    },
    /// Download a kernel and initramfs from an Image Factory into the cache, with progress
    /// (verified, written atomically; files already cached are kept).
    Pull {
        /// Talos version, e.g. v1.11.6.
        #[arg(long)]
        version: String,
        /// amd64 or arm64.
        #[arg(long, default_value = "amd64")]
        arch: String,
        /// Image Factory schematic id (default: the vanilla schematic).
        #[arg(long, default_value = crate::images::VANILLA_SCHEMATIC)]
        schematic: String,
        /// Image Factory base URL (default: [images].factory_url, else the public factory).
        #[arg(long)]
        factory: Option<String>,
    },
    /// List cached images.
    List,
    /// Remove a cached version.
    Rm {
        /// Talos version.
        #[arg(long)]
        version: String,
        /// Schematic id (default: vanilla).
        #[arg(long, default_value = crate::images::VANILLA_SCHEMATIC)]
        schematic: String,
    },
}

/// Run `plinth image ...` against the cache in the configured data directory.
pub async fn run(settings: &Settings, args: ImageArgs) -> anyhow::Result<()> {
    let json_out = args.out.json;
    let (access, name) = match &args.command {
        ImageCommand::Import { .. } => (Access::Write, "image import"),
        ImageCommand::Pull { .. } => (Access::Write, "image pull"),
        ImageCommand::List => (Access::Read, "image list"),
        ImageCommand::Rm { .. } => (Access::Write, "image rm"),
    };
    let cache = database::image_cache(settings, access, name, json_out)?;
    let config = &settings.config;
    match args.command {
        ImageCommand::Import {
            version,
            arch,
            schematic,
            kernel,
            initramfs,
        } => import(
            &cache, &version, &arch, &schematic, &kernel, &initramfs, json_out,
        ),
        ImageCommand::Pull {
            version,
            arch,
            schematic,
            factory,
        } => {
            let factory = factory
                .or(config.image_factory.clone())
                .unwrap_or_else(|| "https://factory.talos.dev".into());
            pull(&cache, &factory, &version, &arch, &schematic, json_out).await
        }
        ImageCommand::List => list(&cache, json_out),
        ImageCommand::Rm { version, schematic } => {
            let n = cache.remove(&schematic, &version)?;
            if n == 0 {
                bail!("no cached files for {schematic}/{version}");
            }
            if json_out {
                say(json!({"removed": n, "schematic": schematic, "version": version}));
            } else {
                say(format!("removed {n} file(s) of {schematic}/{version}"));
            }
            Ok(())
        }
    }
}

fn arch_of(arch: &str) -> anyhow::Result<Arch> {
    match arch {
        "amd64" | "x86_64" => Ok(Arch::Amd64),
        "arm64" | "aarch64" => Ok(Arch::Arm64),
        other => bail!("--arch: `{other}` is not amd64 or arm64"),
    }
}

/// `plinth image pull`: download with a progress bar on stderr.
async fn pull(
    cache: &ImageCache,
    factory: &str,
    version: &str,
    arch: &str,
    schematic: &str,
    json_out: bool,
) -> anyhow::Result<()> {
    let arch = arch_of(arch)?;
    let puller = crate::images::ImagePuller::new(cache.clone(), factory)?;
    type Bars = std::collections::HashMap<String, indicatif::ProgressBar>;
    let bars: std::sync::Arc<std::sync::Mutex<Bars>> = std::sync::Arc::default();
    let style = indicatif::ProgressStyle::with_template(
        "{msg:22} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    let b = bars.clone();
    let progress: crate::images::Progress = std::sync::Arc::new(move |name, done, total| {
        let mut bars = b.lock().unwrap_or_else(|p| p.into_inner());
        let bar = bars.entry(name.to_string()).or_insert_with(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                total,
                indicatif::ProgressDrawTarget::stderr(),
            );
            bar.set_style(style.clone());
            bar.set_message(name.to_string());
            bar
        });
        bar.set_position(done);
    });
    let files = puller
        .pull(schematic, version, arch, Some(progress))
        .await
        .with_context(|| format!("pulling Talos {version} ({schematic}) from {factory}"))?;
    for bar in bars.lock().unwrap_or_else(|p| p.into_inner()).values() {
        bar.finish();
    }
    if json_out {
        let files: Vec<_> = files
            .into_iter()
            .map(|(f, downloaded)| {
                let mut v = serde_json::to_value(&f).unwrap_or_default();
                v["downloaded"] = json!(downloaded);
                v
            })
            .collect();
        say(serde_json::to_string_pretty(&files)?);
        return Ok(());
    }
    for (f, downloaded) in files {
        say(format!(
            "{} {}/{}/{} ({} bytes, sha256 {})",
            if downloaded { "pulled" } else { "cached" },
            f.schematic,
            f.version,
            f.name,
            f.size,
            f.sha256
        ));
    }
    Ok(())
}

/// `plinth image import`: a kernel and initramfs from files.
fn import(
    cache: &ImageCache,
    version: &str,
    arch: &str,
    schematic: &str,
    kernel: &Path,
    initramfs: &Path,
    json_out: bool,
) -> anyhow::Result<()> {
    let arch = arch_of(arch)?;
    let mut imported = Vec::new();
    for (name, src) in [
        (kernel_name(arch), kernel),
        (initramfs_name(arch), initramfs),
    ] {
        let f = cache.import(schematic, version, &name, src)?;
        if !json_out {
            say(format!(
                "imported {}/{}/{} ({} bytes, sha256 {})",
                f.schematic, f.version, f.name, f.size, f.sha256
            ));
        }
        imported.push(f);
    }
    if json_out {
        say(serde_json::to_string_pretty(&imported)?);
    }
    Ok(())
}

/// `plinth image list`.
fn list(cache: &ImageCache, json: bool) -> anyhow::Result<()> {
    let files = cache.list();
    if json {
        say(serde_json::to_string_pretty(&files)?);
    } else {
        let mut t = table();
        t.set_header(["SCHEMATIC", "VERSION", "FILE", "BYTES", "SHA256"]);
        for f in &files {
            t.add_row([
                f.schematic.clone(),
                f.version.clone(),
                f.name.clone(),
                f.size.to_string(),
                f.sha256.clone(),
            ]);
        }
        say(&t);
    }
    Ok(())
}
