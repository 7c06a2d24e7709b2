//! `SnapshotStore` in SQL: a row per etcd snapshot (inserted with its event before the node is
//! asked, its outcome written after), the per-cluster snapshot turn (one instance at a time: an
//! upsert that only replaces an expired turn or the same instance's), and each cluster's one
//! recovery (a row keyed by the cluster). Compiled once per dialect (`super::Db`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row as _;
use uuid::Uuid;

use super::events::{commit_with_event, insert_events};
use super::{Row, Store};
use crate::service::ports::snapshots::{
    RecoveryRecord, RecoveryState, SnapshotOutcome, SnapshotRecord, SnapshotState, SnapshotStore,
};
use crate::service::ports::{NewEvent, StoreError};
use crate::store::{json_err, parse_enum};

const COLS: &str = "id, cluster, state, store, object, instance, requested_by, started_at, \
    finished_at, verified_at, taken_from, taken_from_address, talos_version, kubernetes_version, \
    nodes, size_bytes, stored_bytes, sha256, revision, key_fingerprint, error";

const RECOVERY_COLS: &str = "cluster, attempt_id, snapshot_id, node, node_address, instance, \
    requested_by, forced, state, claimed_at, finished_at, detail";

fn snapshot_row(r: &Row) -> Result<SnapshotRecord, StoreError> {
    let state: String = r.try_get("state")?;
    let nodes: String = r.try_get("nodes")?;
    Ok(SnapshotRecord {
        id: r.try_get("id")?,
        cluster: r.try_get("cluster")?,
        state: parse_enum::<SnapshotState>("state", &state)?,
        store: r.try_get("store")?,
        object: r.try_get("object")?,
        instance: r.try_get("instance")?,
        requested_by: r.try_get("requested_by")?,
        started_at: r.try_get("started_at")?,
        finished_at: r.try_get("finished_at")?,
        verified_at: r.try_get("verified_at")?,
        taken_from: r.try_get("taken_from")?,
        taken_from_address: r.try_get("taken_from_address")?,
        talos_version: r.try_get("talos_version")?,
        kubernetes_version: r.try_get("kubernetes_version")?,
        nodes: serde_json::from_str(&nodes).map_err(json_err)?,
        size_bytes: r.try_get("size_bytes")?,
        stored_bytes: r.try_get("stored_bytes")?,
        sha256: r.try_get("sha256")?,
        revision: r.try_get("revision")?,
        key_fingerprint: r.try_get("key_fingerprint")?,
        error: r.try_get("error")?,
    })
}

fn recovery_row(r: &Row) -> Result<RecoveryRecord, StoreError> {
    let state: String = r.try_get("state")?;
    Ok(RecoveryRecord {
        cluster: r.try_get("cluster")?,
        attempt_id: r.try_get("attempt_id")?,
        snapshot_id: r.try_get("snapshot_id")?,
        node: r.try_get("node")?,
        node_address: r.try_get("node_address")?,
        instance: r.try_get("instance")?,
        requested_by: r.try_get("requested_by")?,
        forced: r.try_get("forced")?,
        state: parse_enum::<RecoveryState>("state", &state)?,
        claimed_at: r.try_get("claimed_at")?,
        finished_at: r.try_get("finished_at")?,
        detail: r.try_get("detail")?,
    })
}

#[async_trait]
impl SnapshotStore for Store {
    async fn take_snapshot_turn(
        &self,
        cluster: &str,
        instance: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(
            "INSERT INTO etcd_snapshot_turns (cluster, instance, until) VALUES ($1, $2, $3) \
             ON CONFLICT (cluster) DO UPDATE SET instance = excluded.instance, until = excluded.until \
             WHERE etcd_snapshot_turns.until < $4 OR etcd_snapshot_turns.instance = excluded.instance",
        )
        .bind(cluster)
        .bind(instance)
        .bind(until)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(res.rows_affected() > 0)
    }

    async fn release_snapshot_turn(&self, cluster: &str, instance: &str) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query("DELETE FROM etcd_snapshot_turns WHERE cluster = $1 AND instance = $2")
            .bind(cluster)
            .bind(instance)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn insert_snapshot(
        &self,
        r: &SnapshotRecord,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        let nodes = serde_json::to_string(&r.nodes).map_err(json_err)?;
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(&format!(
            "INSERT INTO etcd_snapshots ({COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
             $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)"
        ))
        .bind(r.id)
        .bind(&r.cluster)
        .bind(r.state.as_str())
        .bind(&r.store)
        .bind(&r.object)
        .bind(&r.instance)
        .bind(&r.requested_by)
        .bind(r.started_at)
        .bind(r.finished_at)
        .bind(r.verified_at)
        .bind(&r.taken_from)
        .bind(&r.taken_from_address)
        .bind(&r.talos_version)
        .bind(&r.kubernetes_version)
        .bind(nodes)
        .bind(r.size_bytes)
        .bind(r.stored_bytes)
        .bind(&r.sha256)
        .bind(r.revision)
        .bind(&r.key_fingerprint)
        .bind(&r.error)
        .execute(&mut *tx)
        .await?;
        insert_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn finish_snapshot(
        &self,
        id: Uuid,
        o: &SnapshotOutcome,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        let verified_at = (o.state == SnapshotState::Verified).then_some(o.at);
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(
            "UPDATE etcd_snapshots SET state = $1, finished_at = $2, verified_at = $3, \
             size_bytes = $4, stored_bytes = $5, sha256 = $6, revision = $7, error = $8 \
             WHERE id = $9 AND state = 'taking'",
        )
        .bind(o.state.as_str())
        .bind(o.at)
        .bind(verified_at)
        .bind(o.size_bytes)
        .bind(o.stored_bytes)
        .bind(&o.sha256)
        .bind(o.revision)
        .bind(&o.error)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        commit_with_event(tx, res.rows_affected(), event).await
    }

    async fn mark_snapshot_deleted(&self, id: Uuid, event: &NewEvent) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(
            "UPDATE etcd_snapshots SET state = 'deleted' WHERE id = $1 AND state IN ('verified', 'failed')",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        commit_with_event(tx, res.rows_affected(), event).await
    }

    async fn snapshots(
        &self,
        cluster: &str,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLS} FROM etcd_snapshots WHERE cluster = $1 \
             ORDER BY started_at DESC, id DESC LIMIT $2"
        ))
        .bind(cluster)
        .bind(i64::from(limit))
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(snapshot_row).collect()
    }

    async fn snapshot(&self, id: Uuid) -> Result<Option<SnapshotRecord>, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLS} FROM etcd_snapshots WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.read)
            .await?;
        row.as_ref().map(snapshot_row).transpose()
    }

    async fn claim_recovery(
        &self,
        r: &RecoveryRecord,
        event: &NewEvent,
    ) -> Result<Option<RecoveryRecord>, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(&format!(
            "INSERT INTO cluster_recoveries ({RECOVERY_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, \
             $8, $9, $10, $11, $12) ON CONFLICT (cluster) DO NOTHING"
        ))
        .bind(&r.cluster)
        .bind(r.attempt_id)
        .bind(r.snapshot_id)
        .bind(&r.node)
        .bind(&r.node_address)
        .bind(&r.instance)
        .bind(&r.requested_by)
        .bind(r.forced)
        .bind(r.state.as_str())
        .bind(r.claimed_at)
        .bind(r.finished_at)
        .bind(&r.detail)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0 {
            let row = sqlx::query(&format!(
                "SELECT {RECOVERY_COLS} FROM cluster_recoveries WHERE cluster = $1"
            ))
            .bind(&r.cluster)
            .fetch_one(&mut *tx)
            .await?;
            return recovery_row(&row).map(Some);
        }
        insert_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(None)
    }

    async fn finish_recovery(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        state: RecoveryState,
        detail: &str,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        super::talos_state::end_attempt(
            self,
            "cluster_recoveries",
            cluster,
            attempt_id,
            Some((state.as_str(), detail, at)),
            event,
        )
        .await
    }

    async fn release_recovery(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        super::talos_state::end_attempt(
            self,
            "cluster_recoveries",
            cluster,
            attempt_id,
            None,
            event,
        )
        .await
    }

    async fn recovery(&self, cluster: &str) -> Result<Option<RecoveryRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {RECOVERY_COLS} FROM cluster_recoveries WHERE cluster = $1"
        ))
        .bind(cluster)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(recovery_row).transpose()
    }
}
