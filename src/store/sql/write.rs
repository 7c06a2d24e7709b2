//! A writer's turn: every write that does not go through the group commit takes its turn at the
//! writer first (`Store::write_turn`: SQLite's one writer connection, nothing on PostgreSQL), and
//! holds it until its transaction ends. Compiled once per dialect (`super::Db`).

use super::{Db, Store, Turn, Tx};
use crate::service::ports::StoreError;

impl Store {
    /// A writer's transaction, after its turn at the writer (see `write_turn`; the turn
    /// is held until the transaction ends).
    pub(super) async fn begin_write(&self) -> Result<(Option<Turn<'_>>, Tx<'static>), StoreError> {
        let turn = self.write_turn().await;
        let tx = self.write.begin().await?;
        Ok((turn, tx))
    }

    /// A writer's connection, after its turn at the writer.
    pub(super) async fn write_conn(
        &self,
    ) -> Result<(Option<Turn<'_>>, sqlx::pool::PoolConnection<Db>), StoreError> {
        let turn = self.write_turn().await;
        let conn = self.write.acquire().await?;
        Ok((turn, conn))
    }
}
