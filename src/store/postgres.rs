//! PostgreSQL store: one pool for reads and writes. Migrations take PostgreSQL's advisory lock, so
//! several instances starting at once migrate once. DHCP lease writes and the small writes of every
//! boot go through the group commit (`group_commit`), on connections of their own: many writes,
//! one commit.
//!
//! DHCP reads no row on its way: each instance holds the lease table (`lease_view`) and what DHCP
//! asks the inventory (`inventory_view`) in memory. Other instances write the same tables, so the
//! lease view follows the table (`follow_leases`: the rows written since its last read, every
//! [`LEASE_FOLLOW`]) and the inventory view ages out as on SQLite. Neither decides anything: every
//! offer and every ACK is still the conditional upsert, committed before it is sent, and the
//! table's primary key and row locks still refuse an address another instance holds. A view some
//! milliseconds behind can only make an instance try an address that is no longer free (refused,
//! and the next one tried) or offer a client another address than the one another instance just
//! gave it (its REQUEST then binds that one and ends the other).

use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Pool;

use super::group_commit::GroupCommit;
use super::inventory_view::{InventoryView, WriteGuard};
use super::lease_view::LeaseView;
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
/// A turn at the writer: PostgreSQL has no single writer to wait for, but the inventory view
/// learns that a write ended.
type Turn<'a> = WriteGuard<'a>;

/// The PostgreSQL implementation of the store ports.
#[derive(Clone, Debug)]
pub struct PgStore {
    write: Pool<sqlx::Postgres>,
    read: Pool<sqlx::Postgres>,
    /// DHCP's own connections (lease look-ups and the lease group commit): a DISCOVER never
    /// queues behind the boot scripts, configs and API requests that share `read`.
    lease_read: Pool<sqlx::Postgres>,
    group_commit: GroupCommit,
    /// The lease table, following other instances' writes (see the module's paragraph).
    leases: Arc<LeaseView>,
    /// The inventory facts DHCP asks for, at a generation.
    inventory: Arc<InventoryView>,
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
        // DHCP's statements find their rows by index, never by reading the table: the lease table
        // starts empty and grows by thousands of rows a second under a boot storm, faster than
        // autovacuum's statistics follow, and with a table it believed tiny the planner read
        // the whole table for the statement that expires a batch's other leases (`bench/dhcp.sh`
        // at 2000 DORA/s, 2026-12-05: 4,502 sequential scans reading 35.3 million rows in 11 s,
        // PostgreSQL 72% of the machine's CPU samples).
        let lease_read = PgPoolOptions::new()
            .max_connections(LEASE_CONNECTIONS)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(connect.options([("enable_seqscan", "off")]));
        let leases = Arc::new(LeaseView::default());
        let inventory = Arc::new(InventoryView::new());
        if opts.migrate || leases::migrated(&pool).await? {
            // The oldest transaction running before the table is read: whatever commits after
            // the read was stamped at or after it.
            let since = oldest_running(&pool).await?;
            leases.apply(leases::all_leases(&pool).await?);
            tokio::spawn(follow_leases(
                lease_read.clone(),
                Arc::downgrade(&leases),
                since,
            ));
            leases::load_inventory(&pool, &inventory).await?;
        }
        Ok(Self {
            group_commit: GroupCommit::spawn(
                batch::Batch {
                    pool: lease_read.clone(),
                    view: leases.clone(),
                    exact: false,
                },
                LEASE_WRITERS,
            ),
            write: pool.clone(),
            read: pool,
            lease_read,
            leases,
            inventory,
        })
    }

    /// PostgreSQL has no single writer to queue for: a write takes no turn, it only tells the
    /// inventory view when it ended (see the SQLite store's).
    async fn write_turn(&self) -> Option<WriteGuard<'_>> {
        Some(self.inventory.writing())
    }

    /// Several instances may allocate from one PostgreSQL lease table.
    const SHARED: bool = true;
}

/// How often, at the most, the lease view reads what was written since its last read. A view
/// this much behind the table costs a refused claim now and then, never a wrong grant (see the
/// module's paragraph).
const LEASE_FOLLOW: Duration = Duration::from_millis(100);

/// The oldest transaction running now (every row written by a transaction not yet committed
/// is stamped at or after it), as PostgreSQL's text of an `xid8`.
async fn oldest_running(pool: &Pool<sqlx::Postgres>) -> Result<String, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
            .fetch_one(pool)
            .await?,
    )
}

/// Keep `view` following the lease table until the store is dropped: every [`LEASE_FOLLOW`]
/// (or twenty times the last read's duration, if longer), the rows stamped at or after the
/// oldest transaction that was running at the previous read. Those include rows this instance
/// wrote itself, so a row read just before this instance's own newer write of it and applied
/// just after is put right by the next read. A failed read is retried from the same point.
async fn follow_leases(pool: Pool<sqlx::Postgres>, view: Weak<LeaseView>, mut since: String) {
    let mut gap = LEASE_FOLLOW;
    let mut warned: Option<Instant> = None;
    let rows_since = format!(
        "SELECT {} FROM dhcp_leases WHERE write_xid >= $1::xid8",
        leases::LEASE_COLS
    );
    loop {
        tokio::time::sleep(gap).await;
        let Some(view) = view.upgrade() else { return };
        let began = Instant::now();
        let read = async {
            let next = oldest_running(&pool).await?;
            let rows = sqlx::query(&rows_since)
                .bind(&since)
                .fetch_all(&pool)
                .await?;
            let rows = rows
                .iter()
                .map(leases::lease_row)
                .collect::<Result<Vec<_>, StoreError>>()?;
            Ok::<_, StoreError>((next, rows))
        };
        match read.await {
            Ok((next, rows)) => {
                view.apply(rows);
                since = next;
            }
            Err(e) => {
                if warned.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                    warned = Some(Instant::now());
                    tracing::warn!(error = %e, "lease view: other instances' writes not read; retrying");
                }
            }
        }
        gap = LEASE_FOLLOW.max(began.elapsed() * 20);
    }
}
