//! The server's own commands: `plinth serve` (start every front door, say where they listen, stop
//! on Ctrl-C or SIGTERM), `plinth migrate` and `plinth secret-key`.
//!
//! Imports `app` (which starts the server), `config`, `store::redact_url` and `cli::output`.

use serde_json::json;

use super::database::{self, Access, Settings};
use super::output::say;

/// Run the server until Ctrl-C or SIGTERM.
pub async fn serve(settings: &Settings, json_out: bool) -> anyhow::Result<()> {
    let config = &settings.config;
    // Refused before anything is opened or bound: the key is a setting.
    config.require_secret_key()?;
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
    let database = crate::store::redact_url(&config.database_url);
    if json_out {
        eprintln!(
            "{}",
            json!({"serving": {
                "http": format!("http://{addr}"), "database": database,
                "settings": settings.file.to_string(), "dhcp": running.dhcp,
                "tftp": running.tftp_addr.map(|a| a.to_string()),
                "images": running.images_addr.map(|a| format!("http://{a}/images/")),
                "network_boots": running.bootable,
            }})
        );
    } else {
        eprintln!(
            "plinth: serving HTTP on http://{addr} (API /api/v1, /healthz, /metrics, /boot.ipxe); database {database}; \
             DHCP {dhcp}; TFTP {tftp}; image door {images}; network-boots {boots}; settings: {}",
            settings.file
        );
    }
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

/// `plinth migrate`: apply pending migrations and exit. Needs no secret key.
pub async fn migrate(settings: &Settings, json_out: bool) -> anyhow::Result<()> {
    database::store(settings, Access::Write, "migrate", json_out).await?;
    let database = crate::store::redact_url(&settings.config.database_url);
    if json_out {
        say(json!({ "migrated": database }));
    } else {
        eprintln!("migrations applied to {database}");
    }
    Ok(())
}

/// `plinth secret-key`: a new random key on stdout.
pub fn secret_key(json_out: bool) {
    let key = crate::service::SecretBox::generate_key_text();
    if json_out {
        say(json!({ "key": key }));
    } else {
        say(key);
    }
}
