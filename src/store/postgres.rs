//! PostgreSQL store: one pool for reads and writes. Migrations take PostgreSQL's advisory lock, so
//! several instances starting at once migrate once. DHCP lease writes and the small writes of every
//! boot go through the group commit (`group_commit`), on connections of their own: many writes,
//! one commit.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Pool;

use super::group_commit::GroupCommit;
use super::StoreOptions;
use crate::service::ports::StoreError;

// Every file of `sql/` is compiled once per dialect on purpose (see `store/mod.rs`): clippy's
// duplicate_mod is about a file loaded twice by mistake.
#[allow(clippy::duplicate_mod)]
#[path = "sql/batch.rs"]
mod batch;
#[allow(clippy::duplicate_mod)]
#[path = "sql/bmc.rs"]
mod bmc;
#[allow(clippy::duplicate_mod)]
#[path = "sql/configs.rs"]
mod configs;
#[allow(clippy::duplicate_mod)]
#[path = "sql/events.rs"]
mod events;
#[allow(clippy::duplicate_mod)]
#[path = "sql/health.rs"]
mod health;
#[allow(clippy::duplicate_mod)]
#[path = "sql/leases.rs"]
mod leases;
#[allow(clippy::duplicate_mod)]
#[path = "sql/machines.rs"]
mod machines;
#[allow(clippy::duplicate_mod)]
#[path = "sql/reinstalls.rs"]
mod reinstalls;
#[allow(clippy::duplicate_mod)]
#[path = "sql/snapshots.rs"]
mod snapshots;
#[allow(clippy::duplicate_mod)]
#[path = "sql/talos_state.rs"]
mod talos_state;

#[allow(clippy::duplicate_mod)]
#[path = "sql/tokens.rs"]
mod tokens;
#[allow(clippy::duplicate_mod)]
#[path = "sql/upgrades.rs"]
mod upgrades;
#[allow(clippy::duplicate_mod)]
#[path = "sql/write.rs"]
mod write;

/// The database of this dialect: every file of `sql/` is compiled for it.
type Db = sqlx::Postgres;
/// A row of `Db`.
type Row = sqlx::postgres::PgRow;
/// A connection of `Db`.
type Connection = sqlx::PgConnection;
/// The migrations of this dialect, embedded in the binary.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");
/// Whether sqlx's table of applied migrations exists (a count, 0 or 1).
const MIGRATIONS_TABLE_EXISTS: &str =
    "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = '_sqlx_migrations' AND table_schema = current_schema()";
/// A transaction of `Db`.
type Tx<'a> = sqlx::Transaction<'a, Db>;
/// The store the files of `sql/` implement the ports for.
type Store = PgStore;
/// A turn at the writer (PostgreSQL has none to take: always `None`).
type Turn<'a> = tokio::sync::SemaphorePermit<'a>;

/// The PostgreSQL implementation of the store ports.
#[derive(Clone, Debug)]
pub struct PgStore {
    write: Pool<sqlx::Postgres>,
    read: Pool<sqlx::Postgres>,
    /// DHCP's own connections (lease look-ups and the lease group commit): a DISCOVER never
    /// queues behind the boot scripts, configs and API requests that share `read`.
    lease_read: Pool<sqlx::Postgres>,
    group_commit: GroupCommit,
}

/// Connections of DHCP's pool: the group commit's writers and the look-ups (two per DORA).
const LEASE_CONNECTIONS: u32 = 12;
/// Group-commit writers: transactions under way at once. With one, every lease write waited for
/// the transaction before it to commit: `bench/dhcp.sh` at 500 DORA/s (2026-12-02, a loaded
/// machine) showed 24 writes per transaction, 24 ms from begin to commit and 22 ms of queue wait,
/// one writer always busy, so the lease writes (an offer and an ACK per DORA) capped the rate
/// near 500 DORA/s. Several writers overlap their statements and their commits' WAL flushes
/// (PostgreSQL groups concurrent commits into one flush itself).
const LEASE_WRITERS: usize = 4;

impl PgStore {
    /// Connect and migrate.
    pub async fn open(opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = PgConnectOptions::from_str(&opts.url)?.application_name("plinth");
        // No ping before each use: sqlx already pings every connection as it goes back to the
        // pool and drops a broken one there, and the ping before use doubled the round trips of
        // every query (the DHCP path makes one or two per message). A connection that breaks while
        // idle (a PostgreSQL restart) fails one query, which callers treat as a store error.
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections.max(2))
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(connect.clone())
            .await?;
        if opts.migrate {
            MIGRATOR
                .run(&pool)
                .await
                .map_err(|e| StoreError::Backend(format!("migration: {e}")))?;
        }
        let lease_read = PgPoolOptions::new()
            .max_connections(LEASE_CONNECTIONS)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(connect);
        Ok(Self {
            group_commit: GroupCommit::spawn(
                batch::Batch {
                    pool: lease_read.clone(),
                    view: None,
                },
                LEASE_WRITERS,
            ),
            write: pool.clone(),
            read: pool,
            lease_read,
        })
    }

    /// PostgreSQL has no single writer to queue for: writers take no turn (see the SQLite
    /// store's).
    async fn write_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        None
    }

    /// Several instances may allocate from one PostgreSQL lease table.
    const SHARED: bool = true;

    /// Other instances write the shared lease table: no view of it in memory (see `lease_view`).
    fn lease_view(&self) -> Option<&super::lease_view::LeaseView> {
        None
    }

    /// Nor of the shared inventory (see `inventory_view`).
    fn inventory_view(&self) -> Option<&super::inventory_view::InventoryView> {
        None
    }

    /// No inventory view to reload.
    fn refresh_inventory(&self) {}
}
