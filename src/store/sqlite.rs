//! SQLite store: one writer connection (SQLite serialises writers anyway; one connection avoids
//! SQLITE_BUSY on lock upgrades) and a pool of readers, WAL journal, `synchronous=FULL` so that a
//! committed write survives a crash or power loss, foreign keys on. DHCP lease writes and the
//! small writes of every boot go through the group commit (`group_commit`) on the writer
//! connection: many writes, one fsync. Other writers take turns (`writers`), so a lease commit
//! waits behind at most one of them.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Pool;

use super::group_commit::GroupCommit;
use super::inventory_view::InventoryView;
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
type Db = sqlx::Sqlite;
/// A row of `Db`.
type Row = sqlx::sqlite::SqliteRow;
/// A connection of `Db`.
type Connection = sqlx::SqliteConnection;
/// The migrations of this dialect, embedded in the binary.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");
/// Whether sqlx's table of applied migrations exists (a count, 0 or 1).
const MIGRATIONS_TABLE_EXISTS: &str =
    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'";
/// A transaction of `Db`.
type Tx<'a> = sqlx::Transaction<'a, Db>;
/// The store the files of `sql/` implement the ports for.
type Store = SqliteStore;
/// A turn at the writer (see `SqliteStore::write_turn`).
type Turn<'a> = WriteTurn<'a>;

/// A turn at the one writer connection: when it ends (after its transaction), the inventory's
/// generation moves on, so the in-memory inventory facts stop answering until reloaded.
pub(crate) struct WriteTurn<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    _writing: super::inventory_view::WriteGuard<'a>,
}

/// Connections of the DHCP readers' pool, opened as load asks for them. Every look-up waits for
/// a connection (sqlx runs each SQLite connection on a thread of its own): at 4000 DORA/s
/// (`bench/dhcp.sh`, 2026-12-02) 4 readers dropped 10% of exchanges, 8 dropped 0.23%, 16 0.06%.
const LEASE_READERS: u32 = 16;

/// Create the database file `path`, mode 0600 (readable by Plinth's user only: it holds token
/// hashes, leases and sealed secrets), unless it exists; SQLite then opens it as an empty database.
fn private_file(path: &std::path::Path) -> Result<(), StoreError> {
    if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" || path.exists() {
        return Ok(());
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::Backend(format!(
            "cannot create database file {}: {e}",
            path.display()
        ))),
    }
}

/// Take group and others' access away from an existing file of the database.
fn tighten(path: &std::path::Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::metadata(path) else {
            return Ok(());
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o700)).map_err(
                |e| {
                    StoreError::Backend(format!(
                        "database file {} has mode {mode:04o} and cannot be made private \
                         (`chmod 600 {}`): {e}",
                        path.display(),
                        path.display()
                    ))
                },
            )?;
            tracing::warn!(path = %path.display(), mode = format!("{mode:04o}"), "database file was readable by group or others: now 0600");
        }
    }
    Ok(())
}

/// The SQLite implementation of the store ports.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    write: Pool<sqlx::Sqlite>,
    read: Pool<sqlx::Sqlite>,
    /// Readers for DHCP's lease look-ups only: a DISCOVER never queues behind the boot scripts,
    /// configs and API reads that share `read`.
    lease_read: Pool<sqlx::Sqlite>,
    /// Turns at the one writer connection for everything but DHCP's lease commits: those
    /// writers take a turn here one at a time, so the group commit of leases (which takes no turn)
    /// waits behind at most one of them instead of behind every script, config and timeline
    /// write of a boot storm (each an fsync; an ACK waits for its lease's commit).
    writers: std::sync::Arc<tokio::sync::Semaphore>,
    group_commit: GroupCommit,
    /// The committed lease rows, for DHCP's look-ups (changed by the group commit only).
    leases: std::sync::Arc<LeaseView>,
    /// The inventory facts DHCP asks for, at a generation.
    inventory: std::sync::Arc<InventoryView>,
}

impl SqliteStore {
    /// Open (creating the file if needed) and migrate.
    pub async fn open(opts: &StoreOptions) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(&opts.url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let file = connect.get_filename().to_path_buf();
        private_file(&file)?;
        // No ping before each use: a SQLite connection is a file handle that cannot hang up, and
        // the ping is a round trip to the connection's worker thread, as costly as the query
        // (sqlx still pings once as a connection goes back to the pool).
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(connect.clone())
            .await?;
        if opts.migrate {
            MIGRATOR
                .run(&write)
                .await
                .map_err(|e| StoreError::Backend(format!("migration: {e}")))?;
        }
        let read = SqlitePoolOptions::new()
            .max_connections(opts.max_connections.max(1))
            .test_before_acquire(false)
            .connect_with(connect.clone().read_only(true))
            .await?;
        let lease_read = SqlitePoolOptions::new()
            .max_connections(LEASE_READERS)
            .test_before_acquire(false)
            .connect_lazy_with(connect.read_only(true));
        // SQLite makes `-wal` and `-shm` with the database file's mode; tighten any made looser
        // (by an older Plinth, or by hand).
        for suffix in ["", "-wal", "-shm"] {
            let mut p = file.clone().into_os_string();
            p.push(suffix);
            tighten(std::path::Path::new(&p))?;
        }
        let migrated = opts.migrate || leases::migrated(&read).await?;
        let rows = match migrated {
            true => leases::all_leases(&read).await?,
            false => Vec::new(),
        };
        let leases = std::sync::Arc::new(LeaseView::load(rows));
        let inventory = std::sync::Arc::new(InventoryView::new());
        if migrated {
            leases::load_inventory(&read, &inventory).await?;
        }
        let group_commit = GroupCommit::spawn(
            batch::Batch {
                pool: write.clone(),
                view: leases.clone(),
                exact: true,
            },
            1,
        );
        Ok(Self {
            write,
            read,
            lease_read,
            writers: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
            group_commit,
            leases,
            inventory,
        })
    }

    /// A turn at the writer (see `writers`).
    async fn write_turn(&self) -> Option<WriteTurn<'_>> {
        let permit = self.writers.acquire().await.ok()?;
        Some(WriteTurn {
            _permit: permit,
            _writing: self.inventory.writing(),
        })
    }

    /// One process owns a SQLite file: no other instance allocates from its lease table.
    const SHARED: bool = false;

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
