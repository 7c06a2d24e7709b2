//! `StoreHealth` in SQL: one round trip on the readers' pool. Compiled once per dialect
//! (`super::Db`).

use async_trait::async_trait;

use super::Store;
use crate::service::ports::{StoreError, StoreHealth};

#[async_trait]
impl StoreHealth for Store {
    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
    }
}
