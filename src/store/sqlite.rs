//! SQLite store: one writer connection (SQLite serialises writers anyway; one connection avoids
//! SQLITE_BUSY on lock upgrades) and a pool of readers, WAL journal, `synchronous=FULL` so that a
//! committed write survives a crash or power loss, foreign keys on.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Pool;

use super::{backend, StoreOptions};
use crate::service::StoreError;

/// The SQLite implementation of `InventoryStore`.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    write: Pool<sqlx::Sqlite>,
    read: Pool<sqlx::Sqlite>,
}

impl SqliteStore {
    /// Open (creating the file if needed) and migrate.
    pub async fn open(opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(&opts.url)
            .map_err(backend)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(connect.clone())
            .await
            .map_err(backend)?;
        if opts.migrate {
            sqlx::migrate!("migrations/sqlite")
                .run(&write)
                .await
                .map_err(|e| StoreError::Backend(format!("migration: {e}")))?;
        }
        let read = SqlitePoolOptions::new()
            .max_connections(opts.max_connections.max(1))
            .connect_with(connect.read_only(true))
            .await
            .map_err(backend)?;
        Ok(Self { write, read })
    }

    /// Apply pending migrations only.
    pub async fn migrate(url: &str) -> Result<(), StoreError> {
        Self::open(&StoreOptions {
            url: url.to_string(),
            max_connections: 1,
            migrate: true,
        })
        .await
        .map(|_| ())
    }
}

crate::store::sql::sql_store!(SqliteStore, sqlx::Sqlite);
