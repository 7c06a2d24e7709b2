//! The `plinth` binary: parse the command line, load the configuration, set up logging, and hand
//! over to `app` (server) or `cli` (client commands). Nothing else.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use plinth::cli::{Cli, Command, TokenCommand};
use plinth::config::{Config, LogFormat};
use plinth::service::ApiRole;

fn telemetry(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log_level));
    use std::io::IsTerminal;
    // Colours only on a terminal: escape codes in a log file or journal hide the fields.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match config.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
            return;
        }
    }
    let _ = ctrl_c.await;
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let overrides = cli.overrides();
    let load = || Config::load(cli.config.as_deref(), &overrides).map_err(anyhow::Error::from);
    match cli.command {
        Command::Serve { .. } => {
            let config = load()?;
            telemetry(&config);
            let running = plinth::app::spawn(&config).await?;
            let addr = running.http_addr;
            let dhcp = if running.dhcp.is_empty() {
                "off".to_string()
            } else {
                running.dhcp.join(", ")
            };
            let tftp = running
                .tftp_addr
                .map_or_else(|| "off".to_string(), |a| a.to_string());
            let images = running
                .images_addr
                .map_or_else(|| "off".to_string(), |a| format!("http://{a}/images/"));
            let boots = if running.bootable.is_empty() {
                format!("none (no iPXE binaries in {})", config.ipxe_dir.display())
            } else {
                running.bootable.join(", ")
            };
            eprintln!(
                "plinth: serving HTTP on http://{addr} (API /api/v1, /healthz, /metrics, /boot.ipxe); database {}; \
                 DHCP {dhcp}; TFTP {tftp}; image door {images}; network-boots {boots}",
                plinth::store::redact_url(&config.database_url)
            );
            tracing::info!(http = %addr, "plinth started");
            let stop = running.shutdown.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                tracing::info!("shutting down");
                stop.cancel();
            });
            running.wait().await
        }
        Command::Migrate => {
            let config = load()?;
            plinth::app::open_store(&config, true).await?;
            eprintln!(
                "migrations applied to {}",
                plinth::store::redact_url(&config.database_url)
            );
            Ok(())
        }
        Command::Token(t) => {
            let config = load()?;
            let stores = plinth::app::open_store(&config, true).await?;
            let tokens = plinth::app::tokens(&stores);
            match t {
                TokenCommand::Create {
                    role,
                    name,
                    expires_in_days,
                } => {
                    let role: ApiRole =
                        role.parse().map_err(anyhow::Error::msg).context("--role")?;
                    let name = name.unwrap_or_else(|| role.to_string());
                    let expires = expires_in_days
                        .map(|d| chrono::Utc::now() + chrono::Duration::days(i64::from(d)));
                    let (secret, _) = tokens.create(&name, role, expires, "cli").await?;
                    println!("{secret}");
                }
                TokenCommand::List => {
                    for t in tokens.list().await? {
                        let state = if t.revoked { "revoked" } else { "live" };
                        let exp = t
                            .expires_at
                            .map(|e| e.to_rfc3339())
                            .unwrap_or_else(|| "never".into());
                        println!("{}\t{}\t{}\t{state}\texpires {exp}", t.id, t.name, t.role);
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
        Command::SecretKey => {
            println!("{}", plinth::service::SecretBox::generate_key_text());
            Ok(())
        }
        Command::Machine(args) => plinth::cli::machine(args).await,
        Command::Bmc(args) => plinth::cli_bmc::bmc(args).await,
        Command::Cluster(cmd) => plinth::cli_cluster::run(cmd).await,
        Command::Config(plinth::cli::ConfigCommand::Render { machine }) => {
            plinth::cli_config::render(&load()?, &machine).await
        }
        Command::Config(plinth::cli::ConfigCommand::Diff { machine }) => {
            plinth::cli_config::diff(&load()?, &machine).await
        }
        Command::Config(cmd) => plinth::cli::config(cmd),
        Command::Apply { dir, dry_run } => {
            let config = load()?;
            plinth::cli_config::apply(&config, &dir, dry_run).await
        }
        Command::Image(plinth::cli::ImageCommand::Pull {
            version,
            arch,
            schematic,
            factory,
        }) => {
            let config = load()?;
            let factory = factory
                .or(config.image_factory.clone())
                .unwrap_or_else(|| "https://factory.talos.dev".into());
            plinth::cli::image_pull(
                &plinth::images::ImageCache::new(config.data_dir.join("images")),
                &factory,
                &version,
                &arch,
                &schematic,
            )
            .await
        }
        Command::Image(cmd) => {
            let config = load()?;
            plinth::cli::image(
                &plinth::images::ImageCache::new(config.data_dir.join("images")),
                cmd,
            )
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plinth: {e:#}");
            ExitCode::FAILURE
        }
    }
}
