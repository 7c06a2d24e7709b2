//! `StoreError`, the one error every store port returns. Imports `domain` only.

use crate::domain::Conflict;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The row does not exist.
    #[error("not found")]
    NotFound,
    /// Optimistic concurrency: the row moved on.
    #[error("version {expected} is stale; current is {current}")]
    VersionMismatch {
        /// Version the caller based its change on.
        expected: i64,
        /// Version in the database.
        current: i64,
    },
    /// A uniqueness constraint refused the write.
    #[error("unique values already taken")]
    Conflict(Vec<Conflict>),
    /// The database itself failed (connection, I/O, a constraint we did not expect).
    #[error("database: {0}")]
    Backend(String),
}
