//! PostgreSQL store: one pool for reads and writes. Migrations take PostgreSQL's advisory lock, so
//! several instances starting at once migrate once.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Pool;

use super::{backend, StoreOptions};
use crate::service::StoreError;

/// The PostgreSQL implementation of `InventoryStore`.
#[derive(Clone, Debug)]
pub struct PgStore {
    write: Pool<sqlx::Postgres>,
    read: Pool<sqlx::Postgres>,
}

impl PgStore {
    /// Connect and migrate.
    pub async fn open(opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = PgConnectOptions::from_str(&opts.url)
            .map_err(backend)?
            .application_name("plinth");
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections.max(2))
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(connect)
            .await
            .map_err(backend)?;
        if opts.migrate {
            sqlx::migrate!("migrations/postgres")
                .run(&pool)
                .await
                .map_err(|e| StoreError::Backend(format!("migration: {e}")))?;
        }
        Ok(Self {
            write: pool.clone(),
            read: pool,
        })
    }
}

crate::store::sql::sql_store!(PgStore, sqlx::Postgres);
