//! `EventStore` in SQL: the append-only event log. `insert_events` is the one INSERT of events,
//! used inside the transactions of every other write that records an event. Compiled once per
//! dialect (`super::Db`).

use async_trait::async_trait;
use chrono::Utc;
use sqlx::{QueryBuilder, Row as _};
use uuid::Uuid;

use super::{Db, Store, Tx};
use crate::domain::MachineId;
use crate::service::ports::{Event, EventFilter, EventStore, NewEvent, StoreError};
use crate::store::group_commit::WriteOp;
use crate::store::CHUNK;

/// End a write transaction whose one statement changed `changed` rows: when it changed any, record
/// `event` in the same transaction and commit; when it changed none, drop the transaction (rolled
/// back) and record nothing. Whether it changed any.
pub(super) async fn commit_with_event(
    mut tx: Tx<'_>,
    changed: u64,
    event: &NewEvent,
) -> Result<bool, StoreError> {
    if changed == 0 {
        return Ok(false);
    }
    insert_events(&mut tx, &[event]).await?;
    tx.commit().await?;
    Ok(true)
}

pub(super) async fn insert_events(tx: &mut Tx<'_>, events: &[&NewEvent]) -> Result<(), StoreError> {
    let now = Utc::now();
    for chunk in events.chunks(CHUNK) {
        let mut q =
            QueryBuilder::<Db>::new("INSERT INTO events (machine_id, kind, actor, detail, at) ");
        q.push_values(chunk, |mut b, e| {
            b.push_bind(e.machine_id.map(|m| m.0))
                .push_bind(e.kind.clone())
                .push_bind(e.actor.clone())
                .push_bind(sqlx::types::Json(e.detail.clone()))
                .push_bind(now);
        });
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

#[async_trait]
impl EventStore for Store {
    async fn append_event(&self, event: &NewEvent) -> Result<(), StoreError> {
        self.group_commit
            .write(WriteOp::Event(event.clone()))
            .await
            .map(|_| ())
    }

    async fn append_events(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let all: Vec<&NewEvent> = events.iter().collect();
        let (_turn, mut tx) = self.begin_write().await?;
        insert_events(&mut tx, &all).await?;
        Ok(tx.commit().await?)
    }

    async fn list_events(&self, f: &EventFilter) -> Result<Vec<Event>, StoreError> {
        // The machine's name as people use it (`Machine::display_name`), read with the event (a
        // machine removed since has none): host name, else serial, else its boot (or first) MAC,
        // else its SMBIOS UUID.
        let mut q = QueryBuilder::<Db>::new(
            "SELECT e.id, e.machine_id, e.kind, e.actor, e.detail, e.at, \
             m.hostname AS m_hostname, m.serial AS m_serial, m.smbios_uuid AS m_uuid, \
             (SELECT i.mac FROM interfaces i WHERE i.machine_id = e.machine_id \
              ORDER BY i.boot DESC, i.position LIMIT 1) AS m_mac \
             FROM events e LEFT JOIN machines m ON m.id = e.machine_id WHERE 1 = 1",
        );
        if let Some(m) = f.machine_id {
            q.push(" AND e.machine_id = ").push_bind(m.0);
        }
        if let Some(k) = &f.kind_prefix {
            let mut pat = String::new();
            for c in k.chars() {
                if matches!(c, '%' | '_' | '\\') {
                    pat.push('\\');
                }
                pat.push(c);
            }
            pat.push('%');
            q.push(" AND e.kind LIKE ")
                .push_bind(pat)
                .push(" ESCAPE '\\'");
        }
        if let Some(a) = f.after_id {
            q.push(" AND e.id > ").push_bind(a);
        }
        // The newest `limit` events, returned oldest first.
        let limit = i64::from(f.limit.clamp(1, 10_000));
        if f.after_id.is_some() {
            q.push(" ORDER BY e.id ASC LIMIT ").push_bind(limit);
        } else {
            q.push(" ORDER BY e.id DESC LIMIT ").push_bind(limit);
        }
        let rows = q.build().fetch_all(&self.read).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mid: Option<Uuid> = r.try_get("machine_id")?;
            let detail: sqlx::types::Json<serde_json::Value> = r.try_get("detail")?;
            let hostname: Option<String> = r.try_get("m_hostname")?;
            let serial: Option<String> = r.try_get("m_serial")?;
            let mac: Option<String> = r.try_get("m_mac")?;
            let uuid: Option<Uuid> = r.try_get("m_uuid")?;
            out.push(Event {
                id: r.try_get("id")?,
                machine_id: mid.map(MachineId),
                machine: hostname
                    .or(serial)
                    .or(mac)
                    .or_else(|| uuid.map(|u| u.to_string())),
                kind: r.try_get("kind")?,
                actor: r.try_get("actor")?,
                detail: detail.0,
                at: r.try_get("at")?,
            });
        }
        if f.after_id.is_none() {
            out.reverse();
        }
        Ok(out)
    }

    async fn last_event_id(&self) -> Result<i64, StoreError> {
        let id: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM events")
            .fetch_one(&self.read)
            .await?;
        Ok(id.unwrap_or(0))
    }
}
