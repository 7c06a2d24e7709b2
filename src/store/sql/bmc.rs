//! `BmcCapabilityStore` in SQL: the probed capabilities of each machine's BMC, one row per
//! machine, written with its event. Compiled once per dialect (`super::Db`).

use async_trait::async_trait;
use sqlx::Row as _;

use super::events::insert_events;
use super::{Row, Store};
use crate::domain::MachineId;
use crate::service::ports::bmc::{Capabilities, EtagSupport, MediaLocation};
use crate::service::ports::{BmcCapabilityStore, CapabilityRecord, NewEvent, StoreError};
use crate::store::parse_enum;

const CAPS_COLS: &str =
    "machine_id, bmc_url, vendor, model, quirks, redfish_version, sessions, auth, \
    reset_types, boot_targets, boot_mode_settable, virtual_media, etag_offered, etag_weak, \
    if_match_required, tls_mode, probed_at, last_error, attempted_at";

fn caps_row(r: &Row) -> Result<CapabilityRecord, StoreError> {
    let list = |col: &str| -> Result<Vec<String>, StoreError> {
        let text: Option<String> = r.try_get(col)?;
        match text {
            None => Ok(Vec::new()),
            Some(t) => serde_json::from_str(&t)
                .map_err(|e| StoreError::Backend(format!("column {col}: {e}"))),
        }
    };
    let auth: Option<String> = r.try_get("auth")?;
    let capabilities = match auth {
        None => None,
        Some(auth) => {
            let media: Option<String> = r.try_get("virtual_media")?;
            let tls: Option<String> = r.try_get("tls_mode")?;
            let flag = |col: &str| -> Result<bool, StoreError> {
                let v: Option<bool> = r.try_get(col)?;
                Ok(v.unwrap_or(false))
            };
            Some(Capabilities {
                vendor: r.try_get("vendor")?,
                model: r.try_get("model")?,
                quirks: r.try_get("quirks")?,
                redfish_version: r.try_get("redfish_version")?,
                sessions: flag("sessions")?,
                auth,
                reset_types: list("reset_types")?,
                boot_targets: list("boot_targets")?,
                boot_mode_settable: flag("boot_mode_settable")?,
                virtual_media: match media.as_deref() {
                    None => None,
                    Some("system") => Some(MediaLocation::System),
                    Some("manager") => Some(MediaLocation::Manager),
                    Some(other) => {
                        return Err(StoreError::Backend(format!(
                            "column virtual_media: `{other}`"
                        )))
                    }
                },
                etag: EtagSupport {
                    offered: flag("etag_offered")?,
                    weak: flag("etag_weak")?,
                    if_match_required: flag("if_match_required")?,
                },
                tls: parse_enum("tls_mode", tls.as_deref().unwrap_or("verify"))?,
            })
        }
    };
    Ok(CapabilityRecord {
        machine_id: MachineId(r.try_get("machine_id")?),
        bmc_url: r.try_get("bmc_url")?,
        capabilities,
        probed_at: r.try_get("probed_at")?,
        last_error: r.try_get("last_error")?,
        attempted_at: r.try_get("attempted_at")?,
        stale: false,
    })
}

#[async_trait]
impl BmcCapabilityStore for Store {
    async fn put_bmc_capabilities(
        &self,
        rec: &CapabilityRecord,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        let c = rec.capabilities.as_ref();
        let json_list =
            |v: &[String]| serde_json::to_string(v).map_err(|e| StoreError::Backend(e.to_string()));
        let reset_types = c.map(|c| json_list(&c.reset_types)).transpose()?;
        let boot_targets = c.map(|c| json_list(&c.boot_targets)).transpose()?;
        let media = c.and_then(|c| c.virtual_media).map(|m| match m {
            MediaLocation::System => "system",
            MediaLocation::Manager => "manager",
        });
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(&format!(
            "INSERT INTO bmc_capabilities ({CAPS_COLS}) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) \
             ON CONFLICT (machine_id) DO UPDATE SET bmc_url = excluded.bmc_url, vendor = excluded.vendor, \
             model = excluded.model, quirks = excluded.quirks, redfish_version = excluded.redfish_version, \
             sessions = excluded.sessions, auth = excluded.auth, reset_types = excluded.reset_types, \
             boot_targets = excluded.boot_targets, boot_mode_settable = excluded.boot_mode_settable, \
             virtual_media = excluded.virtual_media, etag_offered = excluded.etag_offered, \
             etag_weak = excluded.etag_weak, if_match_required = excluded.if_match_required, \
             tls_mode = excluded.tls_mode, probed_at = excluded.probed_at, last_error = excluded.last_error, \
             attempted_at = excluded.attempted_at"
        ))
        .bind(rec.machine_id.0)
        .bind(&rec.bmc_url)
        .bind(c.and_then(|c| c.vendor.clone()))
        .bind(c.and_then(|c| c.model.clone()))
        .bind(c.and_then(|c| c.quirks.clone()))
        .bind(c.and_then(|c| c.redfish_version.clone()))
        .bind(c.map(|c| c.sessions))
        .bind(c.map(|c| c.auth.clone()))
        .bind(reset_types)
        .bind(boot_targets)
        .bind(c.map(|c| c.boot_mode_settable))
        .bind(media)
        .bind(c.map(|c| c.etag.offered))
        .bind(c.map(|c| c.etag.weak))
        .bind(c.map(|c| c.etag.if_match_required))
        .bind(c.map(|c| c.tls.as_str()))
        .bind(rec.probed_at)
        .bind(&rec.last_error)
        .bind(rec.attempted_at)
        .execute(&mut *tx)
        .await
        ?;
        insert_events(&mut tx, &[event]).await?;
        Ok(tx.commit().await?)
    }

    async fn bmc_capabilities(
        &self,
        id: MachineId,
    ) -> Result<Option<CapabilityRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {CAPS_COLS} FROM bmc_capabilities WHERE machine_id = $1"
        ))
        .bind(id.0)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(caps_row).transpose()
    }
}
