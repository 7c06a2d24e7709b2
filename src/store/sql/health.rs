//! `StoreHealth` in SQL: a round trip on the readers' pool, the heartbeat upsert that proves the
//! writer works, and the secret key's fingerprint (one row). Compiled once per dialect
//! (`super::Db`).

use async_trait::async_trait;
use chrono::Utc;
use sqlx::Row as _;

use super::Store;
use crate::service::ports::{CommitObserver, MigrationGap, StoreError, StoreHealth};

#[async_trait]
impl StoreHealth for Store {
    fn observe_commits(&self, observer: std::sync::Arc<dyn CommitObserver>) {
        self.group_commit.observe(observer);
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
    }

    async fn write_probe(&self, instance: &str) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO heartbeats (instance, beat_at) VALUES ($1, $2) \
             ON CONFLICT (instance) DO UPDATE SET beat_at = excluded.beat_at",
        )
        .bind(instance)
        .bind(Utc::now())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn key_fingerprint(&self) -> Result<Option<String>, StoreError> {
        let r = sqlx::query("SELECT fingerprint FROM secret_key_fingerprint WHERE id = 1")
            .fetch_optional(&self.write)
            .await?;
        Ok(match r {
            Some(r) => Some(r.try_get("fingerprint")?),
            None => None,
        })
    }

    async fn claim_key_fingerprint(&self, fingerprint: &str) -> Result<String, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO secret_key_fingerprint (id, fingerprint, recorded_at) VALUES (1, $1, $2) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(fingerprint)
        .bind(Utc::now())
        .execute(&mut *tx)
        .await?;
        let on_record: String =
            sqlx::query("SELECT fingerprint FROM secret_key_fingerprint WHERE id = 1")
                .fetch_one(&mut *tx)
                .await?
                .try_get("fingerprint")?;
        tx.commit().await?;
        Ok(on_record)
    }

    async fn holds_sealed_values(&self) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM bmcs WHERE password_ciphertext IS NOT NULL) \
             OR EXISTS (SELECT 1 FROM clusters) \
             OR EXISTS (SELECT 1 FROM machine_configs WHERE served_config IS NOT NULL \
                        OR patches LIKE '%plinth-sealed:%') \
             OR EXISTS (SELECT 1 FROM profiles WHERE spec LIKE '%plinth-sealed:%') \
             OR EXISTS (SELECT 1 FROM config_groups WHERE spec LIKE '%plinth-sealed:%') AS sealed",
        )
        .fetch_one(&self.write)
        .await?;
        Ok(r.try_get("sealed")?)
    }

    async fn migration_gap(&self) -> Result<MigrationGap, StoreError> {
        let tables: i64 = sqlx::query_scalar(super::MIGRATIONS_TABLE_EXISTS)
            .fetch_one(&self.read)
            .await?;
        let applied: Vec<i64> = if tables > 0 {
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_all(&self.read)
                .await?
        } else {
            Vec::new()
        };
        let known: Vec<(i64, String)> = super::MIGRATOR
            .iter()
            .map(|m| (m.version, m.description.to_string()))
            .collect();
        Ok(MigrationGap {
            known: known.len(),
            pending: known
                .iter()
                .filter(|(v, _)| !applied.contains(v))
                .map(|(v, d)| format!("{v:04}_{}", d.replace(' ', "_")))
                .collect(),
            unknown: applied
                .iter()
                .copied()
                .filter(|v| !known.iter().any(|(k, _)| k == v))
                .collect(),
        })
    }
}
