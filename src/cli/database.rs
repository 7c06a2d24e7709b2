//! The database and secret key of the commands that work on them directly, without a server
//! (`token`, `apply`, `config render|diff`): opened from the same settings as `plinth serve`.
//!
//! Imports `app` (which names the concrete store), `config` and the services it hands out.

use crate::config::Config;
use crate::service::{ConfigService, Inventory};

/// The config service and the inventory on the configured database and secret key.
pub(crate) async fn services(config: &Config) -> anyhow::Result<(ConfigService, Inventory)> {
    let store = crate::app::open_store(config, true).await?;
    let secrets = crate::app::secret_box(config)?;
    Ok((
        ConfigService::new(
            store.clone(),
            secrets.clone(),
            config.talos_schema_dir.clone(),
        ),
        Inventory::new(store, secrets),
    ))
}

/// The configured store, migrated (created first for SQLite).
pub(crate) async fn store(
    config: &Config,
) -> anyhow::Result<std::sync::Arc<dyn crate::service::InventoryStore>> {
    crate::app::open_store(config, true).await
}
