//! Wiring: the only place that names concrete types. Opens the store, loads the secret key, binds
//! the sockets, and runs the front doors under one cancellation token. `spawn` returns the bound
//! addresses, used by `main` and by tests alike.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SecretKeySource, SECRET_KEY_ENV};
use crate::http::{self, AppState};
use crate::service::{Inventory, InventoryStore, SecretBox, Tokens};
use crate::store::{self, StoreOptions};

/// A running server.
pub struct Running {
    /// Where the HTTP front door listens.
    pub http_addr: SocketAddr,
    /// Cancel to shut everything down.
    pub shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Running {
    /// Wait until every task ends (after `shutdown` is cancelled, or on the first failure).
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut result = Ok(());
        while let Some(done) = self.tasks.join_next().await {
            let r = done.map_err(anyhow::Error::from).and_then(|r| r);
            if let Err(e) = r {
                self.shutdown.cancel();
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }

    /// Cancel and wait.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// Open the configured store, creating the data directory for SQLite.
pub async fn open_store(config: &Config, migrate: bool) -> anyhow::Result<Arc<dyn InventoryStore>> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data directory {}", config.data_dir.display()))?;
    let opts = StoreOptions {
        url: config.database_url.clone(),
        max_connections: config.max_connections,
        migrate,
    };
    store::open(&opts).await.with_context(|| {
        format!(
            "cannot open database {}",
            store::redact_url(&config.database_url)
        )
    })
}

/// Load the secret key from the environment, the key file, or the data directory (creating it
/// there, mode 0600, on first start).
pub fn secret_box(config: &Config) -> anyhow::Result<SecretBox> {
    let text = match &config.secret_key {
        SecretKeySource::Env => std::env::var(SECRET_KEY_ENV)
            .with_context(|| format!("{SECRET_KEY_ENV} is not valid UTF-8"))?,
        SecretKeySource::File(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read secrets.key_file {}", p.display()))?,
        SecretKeySource::DataDir(p) => match std::fs::read_to_string(p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = SecretBox::generate_key_text();
                write_private(p, &key)
                    .with_context(|| format!("cannot create secret key {}", p.display()))?;
                tracing::info!(path = %p.display(), "generated a new secret key; back it up: without it stored BMC passwords cannot be read");
                key
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read secret key {}", p.display()))
            }
        },
    };
    SecretBox::from_text(&text).context("secret key")
}

fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// Open everything and start serving.
pub async fn spawn(config: &Config) -> anyhow::Result<Running> {
    let store = open_store(config, true).await?;
    let secrets = secret_box(config)?;
    let listener = tokio::net::TcpListener::bind(config.http_listen)
        .await
        .with_context(|| format!("cannot listen on {} (http.listen)", config.http_listen))?;
    let http_addr = listener.local_addr()?;
    let state = AppState {
        inventory: Inventory::new(store.clone(), secrets),
        tokens: Tokens::new(store),
        metrics: Arc::new(crate::metrics::Metrics::new()),
        max_body_bytes: config.max_body_bytes,
    };
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let router = http::router(state);
    let stop = shutdown.clone();
    tasks.spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .context("HTTP server")
    });
    Ok(Running {
        http_addr,
        shutdown,
        tasks,
    })
}
