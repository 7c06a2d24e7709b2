//! `TalosStateStore` in SQL: each cluster's one bootstrap (a row keyed by the cluster, claimed
//! with its event in one transaction before the call, its outcome written after), what each node
//! reported when its install was verified, and each cluster's last health report. Compiled once
//! per dialect (`super::Db`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row as _;
use uuid::Uuid;

use super::events::{commit_with_event, insert_events};
use super::{Row, Store};
use crate::domain::MachineId;
use crate::service::ports::talos_state::{
    BootstrapRecord, BootstrapState, NodeVerification, TalosStateStore,
};
use crate::service::ports::{NewEvent, StoreError};
use crate::store::parse_enum;

const COLS: &str = "cluster, attempt_id, machine_id, node, node_address, instance, \
    requested_by, state, claimed_at, finished_at, detail";

fn bootstrap_row(r: &Row) -> Result<BootstrapRecord, StoreError> {
    let state: String = r.try_get("state")?;
    let machine: Option<Uuid> = r.try_get("machine_id")?;
    Ok(BootstrapRecord {
        cluster: r.try_get("cluster")?,
        attempt_id: r.try_get("attempt_id")?,
        machine_id: machine.map(MachineId),
        node: r.try_get("node")?,
        node_address: r.try_get("node_address")?,
        instance: r.try_get("instance")?,
        requested_by: r.try_get("requested_by")?,
        state: parse_enum::<BootstrapState>("state", &state)?,
        claimed_at: r.try_get("claimed_at")?,
        finished_at: r.try_get("finished_at")?,
        detail: r.try_get("detail")?,
    })
}

/// Ends the attempt `attempt_id` of `cluster` in `table` (`cluster_bootstraps` or
/// `cluster_recoveries`: the one permitted call of each kind) while it is still `calling`:
/// with `Some((state, detail, at))` it records how the call ended, with `None` it deletes the
/// claim (the call was never made). The event is written in the same transaction; `false`
/// when the attempt was not calling any more.
pub(super) async fn end_attempt(
    store: &Store,
    table: &'static str,
    cluster: &str,
    attempt_id: Uuid,
    finished: Option<(&str, &str, DateTime<Utc>)>,
    event: &NewEvent,
) -> Result<bool, StoreError> {
    let (_turn, mut tx) = store.begin_write().await?;
    let res = match finished {
        Some((state, detail, at)) => {
            sqlx::query(&format!(
                "UPDATE {table} SET state = $1, finished_at = $2, detail = $3 \
                 WHERE cluster = $4 AND attempt_id = $5 AND state = 'calling'"
            ))
            .bind(state)
            .bind(at)
            .bind(detail)
            .bind(cluster)
            .bind(attempt_id)
            .execute(&mut *tx)
            .await?
        }
        None => {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE cluster = $1 AND attempt_id = $2 AND state = 'calling'"
            ))
            .bind(cluster)
            .bind(attempt_id)
            .execute(&mut *tx)
            .await?
        }
    };
    commit_with_event(tx, res.rows_affected(), event).await
}

#[async_trait]
impl TalosStateStore for Store {
    async fn claim_bootstrap(
        &self,
        b: &BootstrapRecord,
        event: &NewEvent,
    ) -> Result<Option<BootstrapRecord>, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(&format!(
            "INSERT INTO cluster_bootstraps ({COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (cluster) DO NOTHING"
        ))
        .bind(&b.cluster)
        .bind(b.attempt_id)
        .bind(b.machine_id.map(|m| m.0))
        .bind(&b.node)
        .bind(&b.node_address)
        .bind(&b.instance)
        .bind(&b.requested_by)
        .bind(b.state.as_str())
        .bind(b.claimed_at)
        .bind(b.finished_at)
        .bind(&b.detail)
        .execute(&mut *tx)
        .await
        ?;
        if res.rows_affected() == 0 {
            let row = sqlx::query(&format!(
                "SELECT {COLS} FROM cluster_bootstraps WHERE cluster = $1"
            ))
            .bind(&b.cluster)
            .fetch_one(&mut *tx)
            .await?;
            return bootstrap_row(&row).map(Some);
        }
        insert_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(None)
    }

    async fn finish_bootstrap(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        state: BootstrapState,
        detail: &str,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        end_attempt(
            self,
            "cluster_bootstraps",
            cluster,
            attempt_id,
            Some((state.as_str(), detail, at)),
            event,
        )
        .await
    }

    async fn release_bootstrap(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        end_attempt(self, "cluster_bootstraps", cluster, attempt_id, None, event).await
    }

    async fn cluster_bootstrap(
        &self,
        cluster: &str,
    ) -> Result<Option<BootstrapRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLS} FROM cluster_bootstraps WHERE cluster = $1"
        ))
        .bind(cluster)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(bootstrap_row).transpose()
    }

    async fn record_verification(
        &self,
        v: &NodeVerification,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO talos_nodes (machine_id, address, talos_version, cert_sha256, verified_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (machine_id) DO UPDATE SET address = excluded.address, \
             talos_version = excluded.talos_version, cert_sha256 = excluded.cert_sha256, \
             verified_at = excluded.verified_at",
        )
        .bind(v.machine_id.0)
        .bind(&v.address)
        .bind(&v.talos_version)
        .bind(&v.cert_sha256)
        .bind(v.verified_at)
        .execute(&mut *tx)
        .await
        ?;
        insert_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn verifications(&self) -> Result<Vec<NodeVerification>, StoreError> {
        let rows = sqlx::query(
            "SELECT machine_id, address, talos_version, cert_sha256, verified_at FROM talos_nodes \
             ORDER BY verified_at",
        )
        .fetch_all(&self.read)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(NodeVerification {
                    machine_id: MachineId(r.try_get("machine_id")?),
                    address: r.try_get("address")?,
                    talos_version: r.try_get("talos_version")?,
                    cert_sha256: r.try_get("cert_sha256")?,
                    verified_at: r.try_get("verified_at")?,
                })
            })
            .collect()
    }

    async fn put_health(
        &self,
        cluster: &str,
        report: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO cluster_health (cluster, report, checked_at) VALUES ($1, $2, $3) \
             ON CONFLICT (cluster) DO UPDATE SET report = excluded.report, checked_at = excluded.checked_at",
        )
        .bind(cluster)
        .bind(report)
        .bind(at)
        .execute(&mut *tx)
        .await
        ?;
        tx.commit().await?;
        Ok(())
    }

    async fn cluster_health(
        &self,
        cluster: &str,
    ) -> Result<Option<(String, DateTime<Utc>)>, StoreError> {
        let row = sqlx::query("SELECT report, checked_at FROM cluster_health WHERE cluster = $1")
            .bind(cluster)
            .fetch_optional(&self.read)
            .await?;
        match row {
            Some(r) => Ok(Some((r.try_get("report")?, r.try_get("checked_at")?))),
            None => Ok(None),
        }
    }
}
