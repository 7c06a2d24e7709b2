//! sqlx implementations of `InventoryStore` for SQLite (the embedded default) and PostgreSQL (several
//! Plinth instances sharing one inventory). Both are generated from one body of SQL in `sql.rs`; the
//! dialects differ only in their migrations and connection set-up.
//!
//! Must not import `http`, `bmc` or any front door.

mod group_commit;
mod postgres;
mod sql;
mod sqlite;
mod talos_state;

use std::sync::Arc;

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

use crate::service::{InventoryStore, StoreError};

/// Which database a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `sqlite://path` (or `sqlite:path`).
    Sqlite,
    /// `postgres://` or `postgresql://`.
    Postgres,
}

impl Dialect {
    /// The dialect of a database URL, if it is one we speak.
    pub fn of_url(url: &str) -> Option<Dialect> {
        if url.starts_with("sqlite:") {
            Some(Dialect::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Dialect::Postgres)
        } else {
            None
        }
    }
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

/// Open (and migrate) the store a URL names.
pub async fn open(opts: &StoreOptions) -> Result<Arc<dyn InventoryStore>, StoreError> {
    match Dialect::of_url(&opts.url) {
        Some(Dialect::Sqlite) => Ok(Arc::new(SqliteStore::open(opts).await?)),
        Some(Dialect::Postgres) => Ok(Arc::new(PgStore::open(opts).await?)),
        None => Err(StoreError::Backend(format!(
            "unsupported database URL `{}`: use sqlite://PATH or postgres://USER@HOST/DB",
            redact_url(&opts.url)
        ))),
    }
}

/// A database URL with its password replaced, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

fn backend(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => StoreError::Conflict(Vec::new()),
        _ => StoreError::Backend(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }
}
