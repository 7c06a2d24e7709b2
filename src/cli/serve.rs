//! The server's own commands: `plinth serve` (start every front door, say where they listen, stop
//! on Ctrl-C or SIGTERM), `plinth migrate` and `plinth secret-key`.
//!
//! Imports `app` (which starts the server), `config`, `store::redact_url` and `cli::output`.

use super::output::say;
use crate::config::Config;

/// Run the server until Ctrl-C or SIGTERM.
pub async fn serve(config: &Config) -> anyhow::Result<()> {
    let running = crate::app::spawn(config).await?;
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
        crate::store::redact_url(&config.database_url)
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

/// `plinth migrate`: apply pending migrations and exit.
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    crate::app::open_store(config, true).await?;
    eprintln!(
        "migrations applied to {}",
        crate::store::redact_url(&config.database_url)
    );
    Ok(())
}

/// `plinth secret-key`: a new random key on stdout.
pub fn secret_key() {
    say(crate::service::SecretBox::generate_key_text());
}
