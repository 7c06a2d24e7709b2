//! `ReinstallStore` in SQL: one row per machine, moved on with a compare-and-set on its stage,
//! each move with its event. Compiled once per dialect (`super::Db`).

use async_trait::async_trait;
use sqlx::Row as _;

use super::events::commit_with_event;
use super::{Row, Store};
use crate::domain::MachineId;
use crate::service::ports::{NewEvent, Reinstall, ReinstallStore, Stage, StoreError};
use crate::store::parse_enum;

const REINSTALL_COLS: &str =
    "machine_id, stage, stage_started_at, stage_deadline, wipe, automatic, \
    attempt, event_mark, node_address, requested_by, started_at, finished_at, error, cancelled_by";

fn reinstall_row(r: &Row) -> Result<Reinstall, StoreError> {
    let stage: String = r.try_get("stage")?;
    let attempt: i32 = r.try_get("attempt")?;
    Ok(Reinstall {
        machine_id: MachineId(r.try_get("machine_id")?),
        stage: parse_enum("stage", &stage)?,
        stage_started_at: r.try_get("stage_started_at")?,
        stage_deadline: r.try_get("stage_deadline")?,
        wipe: r.try_get("wipe")?,
        automatic: r.try_get("automatic")?,
        attempt: u32::try_from(attempt).unwrap_or(1),
        event_mark: r.try_get("event_mark")?,
        node_address: r.try_get("node_address")?,
        requested_by: r.try_get("requested_by")?,
        started_at: r.try_get("started_at")?,
        finished_at: r.try_get("finished_at")?,
        error: r.try_get("error")?,
        cancelled_by: r.try_get("cancelled_by")?,
    })
}

#[async_trait]
impl ReinstallStore for Store {
    async fn reinstall(&self, id: MachineId) -> Result<Option<Reinstall>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {REINSTALL_COLS} FROM reinstalls WHERE machine_id = $1"
        ))
        .bind(id.0)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(reinstall_row).transpose()
    }

    async fn active_reinstalls(&self) -> Result<Vec<Reinstall>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {REINSTALL_COLS} FROM reinstalls WHERE stage NOT IN ('done', 'failed', 'cancelled') ORDER BY started_at"
        ))
        .fetch_all(&self.read)
        .await
        ?;
        rows.iter().map(reinstall_row).collect()
    }

    async fn start_reinstall(&self, r: &Reinstall, event: &NewEvent) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(&format!(
            "INSERT INTO reinstalls ({REINSTALL_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT (machine_id) DO UPDATE SET stage = excluded.stage, stage_started_at = excluded.stage_started_at, \
             stage_deadline = excluded.stage_deadline, wipe = excluded.wipe, automatic = excluded.automatic, \
             attempt = excluded.attempt, event_mark = excluded.event_mark, node_address = excluded.node_address, \
             requested_by = excluded.requested_by, started_at = excluded.started_at, finished_at = excluded.finished_at, \
             error = excluded.error, cancelled_by = excluded.cancelled_by \
             WHERE reinstalls.stage IN ('done', 'failed', 'cancelled')"
        ))
        .bind(r.machine_id.0)
        .bind(r.stage.as_str())
        .bind(r.stage_started_at)
        .bind(r.stage_deadline)
        .bind(r.wipe)
        .bind(r.automatic)
        .bind(i32::try_from(r.attempt).unwrap_or(i32::MAX))
        .bind(r.event_mark)
        .bind(&r.node_address)
        .bind(&r.requested_by)
        .bind(r.started_at)
        .bind(r.finished_at)
        .bind(&r.error)
        .bind(&r.cancelled_by)
        .execute(&mut *tx)
        .await
        ?;
        commit_with_event(tx, res.rows_affected(), event).await
    }

    async fn advance_reinstall(
        &self,
        r: &Reinstall,
        from: Stage,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(
            "UPDATE reinstalls SET stage = $1, stage_started_at = $2, stage_deadline = $3, node_address = $4, \
             finished_at = $5, error = $6, cancelled_by = $7 WHERE machine_id = $8 AND stage = $9",
        )
        .bind(r.stage.as_str())
        .bind(r.stage_started_at)
        .bind(r.stage_deadline)
        .bind(&r.node_address)
        .bind(r.finished_at)
        .bind(&r.error)
        .bind(&r.cancelled_by)
        .bind(r.machine_id.0)
        .bind(from.as_str())
        .execute(&mut *tx)
        .await
        ?;
        commit_with_event(tx, res.rows_affected(), event).await
    }
}
