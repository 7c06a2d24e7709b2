//! `ConfigStore` in SQL: declared clusters, profiles and groups (JSON specs, sealed secrets),
//! machine patches and served configs, provisioning windows. The boot's small writes (a window's
//! token, the record of a served config) go through the group commit (`super::batch`), which runs
//! `window_token` and `served_config` inside its transaction. Compiled once per dialect
//! (`super::Db`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row as _;

use super::events::{commit_with_event, insert_events};
use super::{Row, Store, Tx};
use crate::domain::MachineId;
use crate::service::ports::{
    Approval, ClusterRecord, ConfigStore, ConfigWrite, GroupSpec, MachinePatches, NewEvent,
    ProfileSpec, ProvisionWindow, ServedConfig, StoreError,
};
use crate::store::group_commit::WriteOp;
use crate::store::json_err;

/// Hand the open window of `id` the token of this boot, minted for `ip`; false when no window is
/// open.
pub(super) async fn window_token(
    tx: &mut Tx<'_>,
    id: MachineId,
    token_sha256: &str,
    ip: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let r = sqlx::query(
        "UPDATE provision_windows SET token_sha256 = $1, token_minted_at = $2, token_ip = $3, \
         token_used_at = NULL WHERE machine_id = $4 AND closed_at IS NULL AND expires_at > $2",
    )
    .bind(token_sha256)
    .bind(now)
    .bind(ip)
    .bind(id.0)
    .execute(&mut **tx)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Use the window token `token_sha256` of `id` at `now`: true only the first time, while it is
/// still the window's token.
pub(super) async fn use_token(
    tx: &mut Tx<'_>,
    id: MachineId,
    token_sha256: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let r = sqlx::query(
        "UPDATE provision_windows SET token_used_at = $1 \
         WHERE machine_id = $2 AND token_sha256 = $3 AND token_used_at IS NULL",
    )
    .bind(now)
    .bind(id.0)
    .bind(token_sha256)
    .execute(&mut **tx)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Record the config served to `id` (sealed).
pub(super) async fn served_config(
    tx: &mut Tx<'_>,
    id: MachineId,
    served: &ServedConfig,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO machine_configs (machine_id, served_config, served_sha256, served_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (machine_id) DO UPDATE SET served_config = excluded.served_config, \
         served_sha256 = excluded.served_sha256, served_at = excluded.served_at",
    )
    .bind(id.0)
    .bind(&served.sealed)
    .bind(&served.sha256)
    .bind(served.at)
    .execute(&mut **tx)
    .await
    ?;
    Ok(())
}

const WINDOW_COLS: &str = "machine_id, opened_at, expires_at, opened_by, wipe, token_sha256, \
    token_minted_at, closed_at, close_reason, token_ip, token_used_at";

fn window_row(r: &Row) -> Result<ProvisionWindow, StoreError> {
    Ok(ProvisionWindow {
        machine_id: MachineId(r.try_get("machine_id")?),
        opened_at: r.try_get("opened_at")?,
        expires_at: r.try_get("expires_at")?,
        opened_by: r.try_get("opened_by")?,
        wipe: r.try_get("wipe")?,
        token_sha256: r.try_get("token_sha256")?,
        token_minted_at: r.try_get("token_minted_at")?,
        closed_at: r.try_get("closed_at")?,
        close_reason: r.try_get("close_reason")?,
        token_ip: r.try_get("token_ip")?,
        token_used_at: r.try_get("token_used_at")?,
    })
}

#[async_trait]
impl ConfigStore for Store {
    async fn put_config_objects(
        &self,
        w: &ConfigWrite,
        events: &[NewEvent],
    ) -> Result<(), StoreError> {
        let now = Utc::now();
        let (_turn, mut tx) = self.begin_write().await?;
        for c in &w.clusters {
            let (cp, wk) = match &c.sealed_base {
                Some((a, b)) => (Some(a.clone()), Some(b.clone())),
                None => (None, None),
            };
            sqlx::query(
                "INSERT INTO clusters (name, spec, secrets, base_controlplane, base_worker, secrets_sha256, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, \
                 secrets = excluded.secrets, base_controlplane = excluded.base_controlplane, \
                 base_worker = excluded.base_worker, secrets_sha256 = excluded.secrets_sha256, \
                 updated_at = excluded.updated_at",
            )
            .bind(&c.spec.name)
            .bind(serde_json::to_string(&c.spec).map_err(json_err)?)
            .bind(c.sealed_bundle.clone())
            .bind(cp)
            .bind(wk)
            .bind(&c.secrets_sha256)
            .bind(now)
            .execute(&mut *tx)
            .await
            ?;
        }
        for p in &w.profiles {
            sqlx::query(
                "INSERT INTO profiles (name, spec, updated_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at",
            )
            .bind(&p.name)
            .bind(serde_json::to_string(p).map_err(json_err)?)
            .bind(now)
            .execute(&mut *tx)
            .await
            ?;
        }
        for g in &w.groups {
            sqlx::query(
                "INSERT INTO config_groups (kind, name, spec, updated_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (kind, name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at",
            )
            .bind(g.kind.as_str())
            .bind(&g.name)
            .bind(serde_json::to_string(g).map_err(json_err)?)
            .bind(now)
            .execute(&mut *tx)
            .await
            ?;
        }
        for (id, mp) in &w.machine_patches {
            sqlx::query(
                "INSERT INTO machine_configs (machine_id, patches) VALUES ($1, $2) \
                 ON CONFLICT (machine_id) DO UPDATE SET patches = excluded.patches",
            )
            .bind(id.0)
            .bind(serde_json::to_string(mp).map_err(json_err)?)
            .execute(&mut *tx)
            .await?;
        }
        let refs: Vec<&NewEvent> = events.iter().collect();
        insert_events(&mut tx, &refs).await?;
        Ok(tx.commit().await?)
    }

    async fn clusters(&self) -> Result<Vec<ClusterRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT spec, secrets, base_controlplane, base_worker, secrets_sha256 FROM clusters ORDER BY name",
        )
        .fetch_all(&self.read)
        .await
        ?;
        rows.iter()
            .map(|r| {
                let spec: String = r.try_get("spec")?;
                let cp: Option<Vec<u8>> = r.try_get("base_controlplane")?;
                let wk: Option<Vec<u8>> = r.try_get("base_worker")?;
                Ok(ClusterRecord {
                    spec: serde_json::from_str(&spec).map_err(json_err)?,
                    sealed_bundle: r.try_get("secrets")?,
                    sealed_base: cp.zip(wk),
                    secrets_sha256: r.try_get("secrets_sha256")?,
                })
            })
            .collect()
    }

    async fn profiles(&self) -> Result<Vec<ProfileSpec>, StoreError> {
        let rows: Vec<String> = sqlx::query_scalar("SELECT spec FROM profiles ORDER BY name")
            .fetch_all(&self.read)
            .await?;
        rows.iter()
            .map(|s| serde_json::from_str(s).map_err(json_err))
            .collect()
    }

    async fn groups(&self) -> Result<Vec<GroupSpec>, StoreError> {
        let rows: Vec<String> =
            sqlx::query_scalar("SELECT spec FROM config_groups ORDER BY kind, name")
                .fetch_all(&self.read)
                .await?;
        rows.iter()
            .map(|s| serde_json::from_str(s).map_err(json_err))
            .collect()
    }

    async fn machine_config(
        &self,
        id: MachineId,
    ) -> Result<(MachinePatches, Option<ServedConfig>), StoreError> {
        let row = sqlx::query(
            "SELECT patches, served_config, served_sha256, served_at FROM machine_configs WHERE machine_id = $1",
        )
        .bind(id.0)
        .fetch_optional(&self.read)
        .await
        ?;
        let Some(r) = row else {
            return Ok((MachinePatches::default(), None));
        };
        let patches: String = r.try_get("patches")?;
        let sealed: Option<Vec<u8>> = r.try_get("served_config")?;
        let sha: Option<String> = r.try_get("served_sha256")?;
        let at: Option<DateTime<Utc>> = r.try_get("served_at")?;
        let served = match (sealed, sha, at) {
            (Some(sealed), Some(sha256), Some(at)) => Some(ServedConfig { sealed, sha256, at }),
            _ => None,
        };
        Ok((serde_json::from_str(&patches).map_err(json_err)?, served))
    }

    async fn all_machine_patches(&self) -> Result<Vec<(MachineId, MachinePatches)>, StoreError> {
        let rows = sqlx::query("SELECT machine_id, patches FROM machine_configs")
            .fetch_all(&self.read)
            .await?;
        rows.iter()
            .map(|r| {
                let p: String = r.try_get("patches")?;
                Ok((
                    MachineId(r.try_get("machine_id")?),
                    serde_json::from_str(&p).map_err(json_err)?,
                ))
            })
            .collect()
    }

    async fn record_served(
        &self,
        id: MachineId,
        token_sha256: &str,
        served: &ServedConfig,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        self.group_commit
            .write(WriteOp::Served {
                id,
                token_sha256: token_sha256.to_string(),
                served: served.clone(),
                event: event.clone(),
            })
            .await
    }

    async fn put_window(&self, w: &ProvisionWindow, event: &NewEvent) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(&format!(
            "INSERT INTO provision_windows ({WINDOW_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (machine_id) DO UPDATE SET opened_at = excluded.opened_at, \
             expires_at = excluded.expires_at, opened_by = excluded.opened_by, wipe = excluded.wipe, \
             token_sha256 = excluded.token_sha256, token_minted_at = excluded.token_minted_at, \
             closed_at = excluded.closed_at, close_reason = excluded.close_reason, \
             token_ip = excluded.token_ip, token_used_at = excluded.token_used_at"
        ))
        .bind(w.machine_id.0)
        .bind(w.opened_at)
        .bind(w.expires_at)
        .bind(&w.opened_by)
        .bind(w.wipe)
        .bind(&w.token_sha256)
        .bind(w.token_minted_at)
        .bind(w.closed_at)
        .bind(&w.close_reason)
        .bind(&w.token_ip)
        .bind(w.token_used_at)
        .execute(&mut *tx)
        .await
        ?;
        insert_events(&mut tx, &[event]).await?;
        Ok(tx.commit().await?)
    }

    async fn window(&self, id: MachineId) -> Result<Option<ProvisionWindow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {WINDOW_COLS} FROM provision_windows WHERE machine_id = $1"
        ))
        .bind(id.0)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(window_row).transpose()
    }

    async fn set_window_token(
        &self,
        id: MachineId,
        token_sha256: &str,
        ip: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.group_commit
            .write(WriteOp::WindowToken {
                id,
                token_sha256: token_sha256.to_string(),
                ip: ip.to_string(),
                now,
            })
            .await
    }

    async fn close_window(
        &self,
        id: MachineId,
        now: DateTime<Utc>,
        reason: &str,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let r = sqlx::query(
            "UPDATE provision_windows SET closed_at = $1, close_reason = $2, token_sha256 = NULL \
             WHERE machine_id = $3 AND closed_at IS NULL",
        )
        .bind(now)
        .bind(reason)
        .bind(id.0)
        .execute(&mut *tx)
        .await?;
        commit_with_event(tx, r.rows_affected(), event).await
    }

    async fn approval(&self, id: MachineId) -> Result<Option<Approval>, StoreError> {
        let r = sqlx::query(
            "SELECT approval_code_sha256, approved_at, approved_by FROM provision_windows \
             WHERE machine_id = $1 AND closed_at IS NULL",
        )
        .bind(id.0)
        .fetch_optional(&self.read)
        .await?;
        Ok(match r {
            Some(r) => Some(Approval {
                code_sha256: r.try_get("approval_code_sha256")?,
                approved_at: r.try_get("approved_at")?,
                approved_by: r.try_get("approved_by")?,
            }),
            None => None,
        })
    }

    async fn set_approval_code(
        &self,
        id: MachineId,
        code_sha256: &str,
    ) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let r = sqlx::query(
            "UPDATE provision_windows SET approval_code_sha256 = $1, approved_at = NULL, \
             approved_by = NULL WHERE machine_id = $2 AND closed_at IS NULL",
        )
        .bind(code_sha256)
        .bind(id.0)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
    }

    async fn approve(
        &self,
        id: MachineId,
        code_sha256: &str,
        now: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let r = sqlx::query(
            "UPDATE provision_windows SET approved_at = $1, approved_by = $2 \
             WHERE machine_id = $3 AND closed_at IS NULL AND approved_at IS NULL \
             AND approval_code_sha256 = $4",
        )
        .bind(now)
        .bind(&event.actor)
        .bind(id.0)
        .bind(code_sha256)
        .execute(&mut *tx)
        .await?;
        commit_with_event(tx, r.rows_affected(), event).await
    }
}
