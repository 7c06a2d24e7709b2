//! sqlx implementations of the store ports (`service::ports`) for SQLite (the embedded default)
//! and PostgreSQL (several Plinth instances sharing one inventory).
//!
//! Layout: the SQL of each port is one plain-Rust file in `sql/` (`machines.rs`, `events.rs`,
//! `tokens.rs`, `leases.rs`, `bmc.rs`, `configs.rs`, `reinstalls.rs`, `talos_state.rs`, `upgrades.rs`,
//! `health.rs`, the group
//! commit's `batch.rs`, the writer's turn in `write.rs`). Each dialect module (`sqlite.rs`,
//! `postgres.rs`) names its database (`type Db = sqlx::Sqlite`), declares its store type and
//! connection set-up, and includes every file of `sql/` as a submodule of its own
//! (`#[path = "sql/machines.rs"] mod machines;`), so each file is compiled twice with concrete
//! types: one copy of every statement (both dialects accept `$N` placeholders, `RETURNING`,
//! `ON CONFLICT` and partial indexes), no higher-ranked sqlx bounds, and code rustfmt formats and
//! rust-analyzer sees. `sql/` is not a module of its own: only the dialects include it. The
//! dialects differ in their migrations, pools and writer turns.
//!
//! Imports `domain` and `service::ports`; must not import the use cases, `http`, `bmc` or any
//! front door.

mod group_commit;
mod inventory_view;
mod lease_view;
mod postgres;
mod sqlite;

use std::sync::Arc;

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

pub use crate::domain::database::{redact_url, Dialect};
use crate::service::ports::{StoreError, Stores};

/// Rows per multi-row INSERT: 19 columns x 500 stays under SQLite's and PostgreSQL's bind limits.
const CHUNK: usize = 500;

/// Escape `%`, `_` and `\` for a `LIKE ... ESCAPE '\'` pattern.
fn like_pattern(q: &str) -> String {
    let mut out = String::from("%");
    for c in q.trim().to_lowercase().chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// A text column that holds one of an enum's spellings.
fn parse_enum<T: std::str::FromStr<Err = String>>(col: &str, v: &str) -> Result<T, StoreError> {
    v.parse()
        .map_err(|e| StoreError::Backend(format!("column {col}: {e}")))
}

/// A JSON column that does not parse (or a value that does not serialise).
fn json_err(e: serde_json::Error) -> StoreError {
    StoreError::Backend(format!("stored JSON: {e}"))
}

/// Connection settings.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Database URL.
    pub url: String,
    /// Pool size (PostgreSQL; SQLite readers).
    pub max_connections: u32,
    /// Apply pending migrations on open.
    pub migrate: bool,
}

/// Open (and migrate) the store a URL names: one handle per port, all on that database.
pub async fn open(opts: &StoreOptions) -> Result<Stores, StoreError> {
    match Dialect::of_url(&opts.url) {
        Some(Dialect::Sqlite) => Ok(Stores::of(Arc::new(SqliteStore::open(opts).await?))),
        Some(Dialect::Postgres) => Ok(Stores::of(Arc::new(PgStore::open(opts).await?))),
        None => Err(StoreError::Backend(format!(
            "unsupported database URL `{}`: use sqlite://PATH or postgres://USER@HOST/DB",
            redact_url(&opts.url)
        ))),
    }
}

/// A database error as the ports see it: a unique violation is a conflict (the service finds
/// out who holds what), anything else a backend failure.
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Database(d) if d.is_unique_violation() => StoreError::Conflict(Vec::new()),
            _ => StoreError::Backend(e.to_string()),
        }
    }
}
