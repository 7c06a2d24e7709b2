//! `UpgradeStore` in SQL: rollouts and their nodes. One active rollout per cluster is a partial
//! unique index (`ON CONFLICT DO NOTHING`, then the holder is read back); the driver's writes are
//! conditional on its lease and on the step it read, each with its event, in one transaction; the
//! end of a done rollout rewrites the cluster's inventory record (`talosVersion`, `schematicId`,
//! `installImage` in the stored spec) in the same transaction. Compiled once per dialect
//! (`super::Db`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row as _;
use uuid::Uuid;

use super::events::insert_events;
use super::{Row, Store, Tx};
use crate::domain::MachineId;
use crate::service::ports::upgrades::{
    ClusterVersionUpdate, NodeStep, Rollout, RolloutEnd, RolloutNode, RolloutState, UpgradeStore,
};
use crate::service::ports::{NewEvent, StoreError};
use crate::store::{json_err, parse_enum};

const ROLLOUT_COLS: &str =
    "id, cluster, to_version, schematic_id, installer, state, requested_by, \
    owner, lease_until, node_timeout_seconds, max_workers_per_rack, snapshot, created_at, \
    updated_at, finished_at, error";

const NODE_COLS: &str = "rollout_id, machine_id, position, batch, name, role, rack, address, \
    from_version, method, installer, step, boot_id, started_at, deadline, finished_at, seen";

fn rollout_row(r: &Row) -> Result<Rollout, StoreError> {
    let state: String = r.try_get("state")?;
    let timeout: i64 = r.try_get("node_timeout_seconds")?;
    let per_rack: i32 = r.try_get("max_workers_per_rack")?;
    let snapshot: Option<String> = r.try_get("snapshot")?;
    Ok(Rollout {
        id: r.try_get("id")?,
        cluster: r.try_get("cluster")?,
        to_version: r.try_get("to_version")?,
        schematic_id: r.try_get("schematic_id")?,
        installer: r.try_get("installer")?,
        state: parse_enum("state", &state)?,
        requested_by: r.try_get("requested_by")?,
        owner: r.try_get("owner")?,
        lease_until: r.try_get("lease_until")?,
        node_timeout_seconds: u64::try_from(timeout).unwrap_or(0),
        max_workers_per_rack: u32::try_from(per_rack).unwrap_or(1),
        snapshot: snapshot
            .map(|s| serde_json::from_str(&s))
            .transpose()
            .map_err(json_err)?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        finished_at: r.try_get("finished_at")?,
        error: r.try_get("error")?,
    })
}

fn node_row(r: &Row) -> Result<RolloutNode, StoreError> {
    let role: String = r.try_get("role")?;
    let method: String = r.try_get("method")?;
    let step: String = r.try_get("step")?;
    let position: i32 = r.try_get("position")?;
    let batch: i32 = r.try_get("batch")?;
    Ok(RolloutNode {
        machine_id: MachineId(r.try_get("machine_id")?),
        position: u32::try_from(position).unwrap_or(0),
        batch: u32::try_from(batch).unwrap_or(0),
        name: r.try_get("name")?,
        role: parse_enum("role", &role)?,
        rack: r.try_get("rack")?,
        address: r.try_get("address")?,
        from_version: r.try_get("from_version")?,
        method: parse_enum("method", &method)?,
        installer: r.try_get("installer")?,
        step: parse_enum("step", &step)?,
        boot_id: r.try_get("boot_id")?,
        started_at: r.try_get("started_at")?,
        deadline: r.try_get("deadline")?,
        finished_at: r.try_get("finished_at")?,
        seen: r.try_get("seen")?,
    })
}

fn to_i32(what: &str, v: u32) -> Result<i32, StoreError> {
    i32::try_from(v).map_err(|_| StoreError::Backend(format!("{what} {v} is out of range")))
}

impl Store {
    async fn nodes_of(&self, id: Uuid) -> Result<Vec<RolloutNode>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {NODE_COLS} FROM upgrade_nodes WHERE rollout_id = $1 ORDER BY position"
        ))
        .bind(id)
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(node_row).collect()
    }
}

/// The cluster's stored spec with the versions a done rollout leaves (a JSON edit of the three
/// fields: the rest, sealed patches included, stays byte for byte what `plinth apply` wrote).
async fn update_cluster(tx: &mut Tx<'_>, u: &ClusterVersionUpdate) -> Result<(), StoreError> {
    let row = sqlx::query("SELECT spec FROM clusters WHERE name = $1")
        .bind(&u.cluster)
        .fetch_optional(&mut **tx)
        .await?;
    let Some(row) = row else {
        return Err(StoreError::NotFound);
    };
    let text: String = row.try_get("spec")?;
    let mut spec: serde_json::Value = serde_json::from_str(&text).map_err(json_err)?;
    let Some(o) = spec.as_object_mut() else {
        return Err(StoreError::Backend(format!(
            "the stored spec of cluster {} is not an object",
            u.cluster
        )));
    };
    o.insert("talosVersion".into(), u.talos_version.clone().into());
    if let Some(s) = &u.schematic_id {
        o.insert("schematicId".into(), s.clone().into());
    }
    if let Some(i) = &u.install_image {
        o.insert("installImage".into(), i.clone().into());
    }
    sqlx::query("UPDATE clusters SET spec = $1, updated_at = $2 WHERE name = $3")
        .bind(serde_json::to_string(&spec).map_err(json_err)?)
        .bind(Utc::now())
        .bind(&u.cluster)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[async_trait]
impl UpgradeStore for Store {
    async fn create_rollout(
        &self,
        r: &Rollout,
        nodes: &[RolloutNode],
        event: &NewEvent,
    ) -> Result<Option<Rollout>, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let snapshot = r
            .snapshot
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(json_err)?;
        let res = sqlx::query(&format!(
            "INSERT INTO upgrade_rollouts ({ROLLOUT_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
             $9, $10, $11, $12, $13, $14, $15, $16) ON CONFLICT DO NOTHING"
        ))
        .bind(r.id)
        .bind(&r.cluster)
        .bind(&r.to_version)
        .bind(&r.schematic_id)
        .bind(&r.installer)
        .bind(r.state.as_str())
        .bind(&r.requested_by)
        .bind(&r.owner)
        .bind(r.lease_until)
        .bind(i64::try_from(r.node_timeout_seconds).unwrap_or(i64::MAX))
        .bind(to_i32("max_workers_per_rack", r.max_workers_per_rack)?)
        .bind(snapshot)
        .bind(r.created_at)
        .bind(r.updated_at)
        .bind(r.finished_at)
        .bind(&r.error)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0 {
            let row = sqlx::query(&format!(
                "SELECT {ROLLOUT_COLS} FROM upgrade_rollouts WHERE cluster = $1 \
                 AND state IN ('running', 'paused')"
            ))
            .bind(&r.cluster)
            .fetch_optional(&mut *tx)
            .await?;
            return match row {
                Some(row) => rollout_row(&row).map(Some),
                None => Err(StoreError::Conflict(Vec::new())),
            };
        }
        for n in nodes {
            sqlx::query(&format!(
                "INSERT INTO upgrade_nodes ({NODE_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
                 $9, $10, $11, $12, $13, $14, $15, $16, $17)"
            ))
            .bind(r.id)
            .bind(n.machine_id.0)
            .bind(to_i32("position", n.position)?)
            .bind(to_i32("batch", n.batch)?)
            .bind(&n.name)
            .bind(n.role.as_str())
            .bind(&n.rack)
            .bind(&n.address)
            .bind(&n.from_version)
            .bind(n.method.as_str())
            .bind(&n.installer)
            .bind(n.step.as_str())
            .bind(&n.boot_id)
            .bind(n.started_at)
            .bind(n.deadline)
            .bind(n.finished_at)
            .bind(&n.seen)
            .execute(&mut *tx)
            .await?;
        }
        insert_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(None)
    }

    async fn rollout(&self, id: Uuid) -> Result<Option<(Rollout, Vec<RolloutNode>)>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ROLLOUT_COLS} FROM upgrade_rollouts WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.read)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let r = rollout_row(&row)?;
        let nodes = self.nodes_of(r.id).await?;
        Ok(Some((r, nodes)))
    }

    async fn latest_rollout(
        &self,
        cluster: &str,
    ) -> Result<Option<(Rollout, Vec<RolloutNode>)>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ROLLOUT_COLS} FROM upgrade_rollouts WHERE cluster = $1 \
             ORDER BY created_at DESC LIMIT 1"
        ))
        .bind(cluster)
        .fetch_optional(&self.read)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let r = rollout_row(&row)?;
        let nodes = self.nodes_of(r.id).await?;
        Ok(Some((r, nodes)))
    }

    async fn active_rollouts(&self) -> Result<Vec<Rollout>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {ROLLOUT_COLS} FROM upgrade_rollouts WHERE state IN ('running', 'paused') \
             ORDER BY created_at"
        ))
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(rollout_row).collect()
    }

    async fn claim_rollout(
        &self,
        id: Uuid,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(
            "UPDATE upgrade_rollouts SET owner = $1, lease_until = $2 WHERE id = $3 \
             AND state = 'running' AND (owner IS NULL OR owner = $1 OR lease_until < $4)",
        )
        .bind(owner)
        .bind(until)
        .bind(id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(res.rows_affected() == 1)
    }

    async fn renew_rollout(
        &self,
        id: Uuid,
        owner: &str,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(
            "UPDATE upgrade_rollouts SET lease_until = $1 WHERE id = $2 AND owner = $3 \
             AND state IN ('running', 'paused')",
        )
        .bind(until)
        .bind(id)
        .bind(owner)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(res.rows_affected() == 1)
    }

    async fn release_rollout(&self, id: Uuid, owner: &str) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(
            "UPDATE upgrade_rollouts SET owner = NULL, lease_until = NULL WHERE id = $1 \
             AND owner = $2",
        )
        .bind(id)
        .bind(owner)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn advance_node(
        &self,
        id: Uuid,
        owner: &str,
        n: &RolloutNode,
        from: NodeStep,
        event: Option<&NewEvent>,
    ) -> Result<bool, StoreError> {
        // A node leaves `pending` only while the rollout runs; a node in flight moves on while
        // it is paused too (a pause stops the next node, never the one being upgraded).
        let states = if from == NodeStep::Pending {
            "('running')"
        } else {
            "('running', 'paused')"
        };
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(&format!(
            "UPDATE upgrade_nodes SET step = $1, boot_id = $2, started_at = $3, deadline = $4, \
             finished_at = $5, seen = $6 WHERE rollout_id = $7 AND machine_id = $8 AND step = $9 \
             AND EXISTS (SELECT 1 FROM upgrade_rollouts WHERE id = $7 AND owner = $10 \
             AND state IN {states})"
        ))
        .bind(n.step.as_str())
        .bind(&n.boot_id)
        .bind(n.started_at)
        .bind(n.deadline)
        .bind(n.finished_at)
        .bind(&n.seen)
        .bind(id)
        .bind(n.machine_id.0)
        .bind(from.as_str())
        .bind(owner)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0 {
            return Ok(false);
        }
        sqlx::query("UPDATE upgrade_rollouts SET updated_at = $1 WHERE id = $2")
            .bind(Utc::now())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if let Some(e) = event {
            insert_events(&mut tx, &[e]).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn set_rollout_state(
        &self,
        id: Uuid,
        from: &[RolloutState],
        to: RolloutState,
        note: Option<&str>,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<Option<Rollout>, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let row = sqlx::query("SELECT state FROM upgrade_rollouts WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let state: String = row.try_get("state")?;
        let current: RolloutState = parse_enum("state", &state)?;
        if !from.contains(&current) {
            return Ok(None);
        }
        let ended = !to.is_active();
        let res = sqlx::query(
            "UPDATE upgrade_rollouts SET state = $1, updated_at = $2, \
             finished_at = CASE WHEN $3 THEN $2 ELSE finished_at END, \
             error = COALESCE($4, error) WHERE id = $5 AND state = $6",
        )
        .bind(to.as_str())
        .bind(at)
        .bind(ended)
        .bind(note)
        .bind(id)
        .bind(current.as_str())
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0 {
            return Ok(None);
        }
        if to == RolloutState::Aborted {
            sqlx::query(
                "UPDATE upgrade_nodes SET step = 'aborted', finished_at = $1, \
                 seen = 'the rollout was aborted at step ' || step || \
                 COALESCE('; last seen: ' || seen, '') \
                 WHERE rollout_id = $2 AND step IN ('upgrading', 'rebooting', 'verifying')",
            )
            .bind(at)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        insert_events(&mut tx, &[event]).await?;
        let row = sqlx::query(&format!(
            "SELECT {ROLLOUT_COLS} FROM upgrade_rollouts WHERE id = $1"
        ))
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        let r = rollout_row(&row)?;
        tx.commit().await?;
        Ok(Some(r))
    }

    async fn end_rollout(
        &self,
        id: Uuid,
        owner: &str,
        end: &RolloutEnd,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let res = sqlx::query(
            "UPDATE upgrade_rollouts SET state = $1, error = $2, finished_at = $3, updated_at = $3, \
             owner = NULL, lease_until = NULL WHERE id = $4 AND owner = $5 \
             AND state IN ('running', 'paused')",
        )
        .bind(end.state.as_str())
        .bind(&end.error)
        .bind(end.at)
        .bind(id)
        .bind(owner)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0 {
            return Ok(false);
        }
        if let (RolloutState::Done, Some(u)) = (end.state, &end.update) {
            update_cluster(&mut tx, u).await?;
        }
        insert_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(true)
    }
}
