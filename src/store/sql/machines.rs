//! `MachineStore` in SQL: machines with their NICs, disks and BMC records. A machine and its
//! children are read with one query per table for a whole page, and written with multi-row
//! INSERTs; every change is one transaction with its event, guarded by the machine's version.
//! Compiled once per dialect (`super::Db`).

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::Utc;
use sqlx::{QueryBuilder, Row as _};
use uuid::Uuid;

use super::events::insert_events;
use super::{Connection, Db, Row, Store, Tx};
use crate::domain::{
    mac, spec_diff, Bmc, Disk, DiskType, Interface, LifecycleState, Machine, MachineId, MachineRef,
    Role, UniqueKey,
};
use crate::service::ports::{
    ImportBatches, MachineFilter, MachinePage, MachineRecord, MachineSort, MachineStore, NewEvent,
    PasswordChange, StoreError,
};
use crate::store::{like_pattern, parse_enum, CHUNK};

const MACHINE_COLS: &str = "m.id, m.hostname, m.smbios_uuid, m.serial, m.asset_tag, \
    m.manufacturer, m.model, m.site, m.rack, m.rack_unit, m.role, m.cluster, m.profile, \
    m.state, m.state_reason, m.state_by, m.manual_hold, m.created_at, m.updated_at, m.version";

fn machine_row(r: &Row) -> Result<Machine, StoreError> {
    let role: Option<String> = r.try_get("role")?;
    let state: String = r.try_get("state")?;
    let unit: Option<i32> = r.try_get("rack_unit")?;
    Ok(Machine {
        id: MachineId(r.try_get("id")?),
        hostname: r.try_get("hostname")?,
        smbios_uuid: r.try_get("smbios_uuid")?,
        serial: r.try_get("serial")?,
        asset_tag: r.try_get("asset_tag")?,
        manufacturer: r.try_get("manufacturer")?,
        model: r.try_get("model")?,
        site: r.try_get("site")?,
        rack: r.try_get("rack")?,
        rack_unit: unit.and_then(|u| u16::try_from(u).ok()),
        role: role
            .map(|v: String| parse_enum::<Role>("role", &v))
            .transpose()?,
        cluster: r.try_get("cluster")?,
        profile: r.try_get("profile")?,
        state: parse_enum("state", &state)?,
        state_reason: r.try_get("state_reason")?,
        state_by: r.try_get("state_by")?,
        manual_hold: r.try_get("manual_hold")?,
        interfaces: Vec::new(),
        disks: Vec::new(),
        bmc: None,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        version: r.try_get("version")?,
    })
}

/// Fill in NICs, disks and BMCs of `machines` with three queries.
async fn attach(conn: &mut Connection, machines: &mut [Machine]) -> Result<(), StoreError> {
    if machines.is_empty() {
        return Ok(());
    }
    let index: HashMap<Uuid, usize> = machines
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id.0, i))
        .collect();
    let ids: Vec<Uuid> = machines.iter().map(|m| m.id.0).collect();
    for chunk in ids.chunks(CHUNK) {
        let mut q = QueryBuilder::<Db>::new(
            "SELECT machine_id, mac, ipv4, boot, name FROM interfaces WHERE machine_id IN (",
        );
        let mut sep = q.separated(", ");
        for id in chunk {
            sep.push_bind(*id);
        }
        q.push(") ORDER BY machine_id, position");
        for r in q.build().fetch_all(&mut *conn).await? {
            let mid: Uuid = r.try_get("machine_id")?;
            let mac: String = r.try_get("mac")?;
            let ip: Option<String> = r.try_get("ipv4")?;
            let nic = Interface {
                mac: mac
                    .parse()
                    .map_err(|e: mac::MacParseError| StoreError::Backend(e.to_string()))?,
                ipv4: ip.map(|s| s.parse()).transpose().map_err(
                    |e: std::net::AddrParseError| StoreError::Backend(format!("column ipv4: {e}")),
                )?,
                boot: r.try_get("boot")?,
                name: r.try_get("name")?,
            };
            if let Some(i) = index.get(&mid) {
                machines[*i].interfaces.push(nic);
            }
        }
        let mut q = QueryBuilder::<Db>::new(
            "SELECT machine_id, serial, wwid, model, size_bytes, disk_type, bus_path, data_disk \
             FROM disks WHERE machine_id IN (",
        );
        let mut sep = q.separated(", ");
        for id in chunk {
            sep.push_bind(*id);
        }
        q.push(") ORDER BY machine_id, position");
        for r in q.build().fetch_all(&mut *conn).await? {
            let mid: Uuid = r.try_get("machine_id")?;
            let size: Option<i64> = r.try_get("size_bytes")?;
            let kind: Option<String> = r.try_get("disk_type")?;
            let disk = Disk {
                serial: r.try_get("serial")?,
                wwid: r.try_get("wwid")?,
                model: r.try_get("model")?,
                size_bytes: size.map(|s| s as u64),
                disk_type: kind
                    .map(|v: String| parse_enum::<DiskType>("disk_type", &v))
                    .transpose()?,
                bus_path: r.try_get("bus_path")?,
                data_disk: r.try_get("data_disk")?,
            };
            if let Some(i) = index.get(&mid) {
                machines[*i].disks.push(disk);
            }
        }
        let mut q = QueryBuilder::<Db>::new(
            "SELECT machine_id, url, username, password_ciphertext IS NOT NULL AS has_password, \
             tls_mode, fingerprint FROM bmcs WHERE machine_id IN (",
        );
        let mut sep = q.separated(", ");
        for id in chunk {
            sep.push_bind(*id);
        }
        q.push(")");
        for r in q.build().fetch_all(&mut *conn).await? {
            let mid: Uuid = r.try_get("machine_id")?;
            let tls: String = r.try_get("tls_mode")?;
            let bmc = Bmc {
                url: r.try_get("url")?,
                username: r.try_get("username")?,
                tls: parse_enum("tls_mode", &tls)?,
                fingerprint: r.try_get("fingerprint")?,
                has_password: r.try_get("has_password")?,
            };
            if let Some(i) = index.get(&mid) {
                machines[*i].bmc = Some(bmc);
            }
        }
    }
    Ok(())
}

/// One machine with its children, read on one connection (inside a transaction when given one).
async fn load_one(conn: &mut Connection, id: Uuid) -> Result<Option<Machine>, StoreError> {
    let sql = format!("SELECT {MACHINE_COLS} FROM machines m WHERE m.id = $1");
    let Some(row) = sqlx::query(&sql)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let mut ms = vec![machine_row(&row)?];
    attach(conn, &mut ms).await?;
    Ok(ms.pop())
}

async fn load_one_tx(tx: &mut Tx<'_>, id: Uuid) -> Result<Machine, StoreError> {
    load_one(tx, id).await?.ok_or(StoreError::NotFound)
}

/// Insert machines (rows of `machines`, then their children) with multi-row INSERTs.
async fn insert_machines(
    tx: &mut Tx<'_>,
    rows: &[(MachineId, LifecycleState, &MachineRecord)],
) -> Result<(), StoreError> {
    let now = Utc::now();
    for chunk in rows.chunks(CHUNK) {
        let mut q = QueryBuilder::<Db>::new(
            "INSERT INTO machines (id, hostname, smbios_uuid, serial, asset_tag, manufacturer, model, \
             site, rack, rack_unit, role, cluster, profile, state, state_reason, created_at, updated_at, \
             version, search_text) ",
        );
        q.push_values(chunk, |mut b, (id, state, rec)| {
            let s = &rec.spec;
            b.push_bind(id.0)
                .push_bind(s.hostname.clone())
                .push_bind(s.smbios_uuid)
                .push_bind(s.serial.clone())
                .push_bind(s.asset_tag.clone())
                .push_bind(s.manufacturer.clone())
                .push_bind(s.model.clone())
                .push_bind(s.site.clone())
                .push_bind(s.rack.clone())
                .push_bind(s.rack_unit.map(i32::from))
                .push_bind(s.role.map(|r| r.as_str()))
                .push_bind(s.cluster.clone())
                .push_bind(s.profile.clone())
                .push_bind(state.as_str())
                .push_bind(None::<String>)
                .push_bind(now)
                .push_bind(now)
                .push_bind(1_i64)
                .push_bind(s.search_text());
        });
        q.build().execute(&mut **tx).await?;
    }
    let specs: Vec<(MachineId, &MachineRecord)> = rows.iter().map(|(id, _, r)| (*id, *r)).collect();
    insert_children(tx, &specs).await
}

async fn insert_children(
    tx: &mut Tx<'_>,
    rows: &[(MachineId, &MachineRecord)],
) -> Result<(), StoreError> {
    let nics: Vec<(Uuid, i32, &Interface)> = rows
        .iter()
        .flat_map(|(id, r)| {
            r.spec
                .interfaces
                .iter()
                .enumerate()
                .map(move |(i, n)| (id.0, i as i32, n))
        })
        .collect();
    for chunk in nics.chunks(CHUNK) {
        let mut q = QueryBuilder::<Db>::new(
            "INSERT INTO interfaces (machine_id, position, mac, ipv4, boot, name) ",
        );
        q.push_values(chunk, |mut b, (id, pos, n)| {
            b.push_bind(*id)
                .push_bind(*pos)
                .push_bind(n.mac.to_string())
                .push_bind(n.ipv4.map(|i| i.to_string()))
                .push_bind(n.boot)
                .push_bind(n.name.clone());
        });
        q.build().execute(&mut **tx).await?;
    }
    let disks: Vec<(Uuid, i32, &Disk)> = rows
        .iter()
        .flat_map(|(id, r)| {
            r.spec
                .disks
                .iter()
                .enumerate()
                .map(move |(i, d)| (id.0, i as i32, d))
        })
        .collect();
    for chunk in disks.chunks(CHUNK) {
        let mut q = QueryBuilder::<Db>::new(
            "INSERT INTO disks (machine_id, position, serial, wwid, model, size_bytes, disk_type, bus_path, data_disk) ",
        );
        q.push_values(chunk, |mut b, (id, pos, d)| {
            b.push_bind(*id)
                .push_bind(*pos)
                .push_bind(d.serial.clone())
                .push_bind(d.wwid.clone())
                .push_bind(d.model.clone())
                .push_bind(d.size_bytes.map(|s| s as i64))
                .push_bind(d.disk_type.map(|t| t.as_str()))
                .push_bind(d.bus_path.clone())
                .push_bind(d.data_disk);
        });
        q.build().execute(&mut **tx).await?;
    }
    for (id, rec) in rows {
        let Some(b) = &rec.spec.bmc else { continue };
        let sealed: Option<Vec<u8>> = match &rec.password {
            PasswordChange::Set(c) => Some(c.clone()),
            PasswordChange::Clear => None,
            PasswordChange::Keep => None,
        };
        sqlx::query(
            "INSERT INTO bmcs (machine_id, url, username, password_ciphertext, tls_mode, fingerprint) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id.0)
        .bind(&b.url)
        .bind(&b.username)
        .bind(sealed)
        .bind(b.tls.as_str())
        .bind(&b.fingerprint)
        .execute(&mut **tx)
        .await
        ?;
    }
    Ok(())
}

async fn current_version(tx: &mut Tx<'_>, id: Uuid, expected: i64) -> Result<(), StoreError> {
    let v: Option<i64> = sqlx::query_scalar("SELECT version FROM machines WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    match v {
        None => Err(StoreError::NotFound),
        Some(current) if current != expected => {
            Err(StoreError::VersionMismatch { expected, current })
        }
        Some(_) => Ok(()),
    }
}

fn push_filter(q: &mut QueryBuilder<'_, Db>, f: &MachineFilter) {
    q.push(" WHERE 1 = 1");
    if let Some(s) = f.state {
        q.push(" AND m.state = ").push_bind(s.as_str());
    }
    if let Some(s) = &f.site {
        q.push(" AND m.site = ").push_bind(s.clone());
    }
    if let Some(s) = &f.rack {
        q.push(" AND m.rack = ").push_bind(s.clone());
    }
    if let Some(s) = &f.cluster {
        q.push(" AND m.cluster = ").push_bind(s.clone());
    }
    if let Some(r) = f.role {
        q.push(" AND m.role = ").push_bind(r.as_str());
    }
    if let Some(text) = f.q.as_deref().filter(|t| !t.trim().is_empty()) {
        // One precomputed column (`MachineSpec::search_text`): host name, serial, asset tag,
        // manufacturer, model, site, rack, cluster, MACs and IPv4s, lower-cased.
        q.push(" AND m.search_text LIKE ")
            .push_bind(like_pattern(text))
            .push(" ESCAPE '\\'");
    }
}

/// Replace a machine's spec, NICs, disks and BMC if it is still at `expected_version` (bumping
/// it), inside the caller's transaction.
async fn update_in_tx(
    tx: &mut Tx<'_>,
    id: MachineId,
    expected_version: i64,
    rec: &MachineRecord,
) -> Result<(), StoreError> {
    let s = &rec.spec;
    let done = sqlx::query(
        "UPDATE machines SET hostname = $1, smbios_uuid = $2, serial = $3, asset_tag = $4, \
             manufacturer = $5, model = $6, site = $7, rack = $8, rack_unit = $9, role = $10, \
             cluster = $11, profile = $12, updated_at = $13, version = version + 1, \
             search_text = $16 WHERE id = $14 AND version = $15",
    )
    .bind(s.hostname.clone())
    .bind(s.smbios_uuid)
    .bind(s.serial.clone())
    .bind(s.asset_tag.clone())
    .bind(s.manufacturer.clone())
    .bind(s.model.clone())
    .bind(s.site.clone())
    .bind(s.rack.clone())
    .bind(s.rack_unit.map(i32::from))
    .bind(s.role.map(|r| r.as_str()))
    .bind(s.cluster.clone())
    .bind(s.profile.clone())
    .bind(Utc::now())
    .bind(id.0)
    .bind(expected_version)
    .bind(s.search_text())
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() == 0 {
        current_version(tx, id.0, expected_version).await?;
        return Err(StoreError::Backend("update matched no row".into()));
    }
    let kept: Option<Vec<u8>> = if rec.password == PasswordChange::Keep {
        sqlx::query_scalar("SELECT password_ciphertext FROM bmcs WHERE machine_id = $1")
            .bind(id.0)
            .fetch_optional(&mut **tx)
            .await?
            .flatten()
    } else {
        None
    };
    for table in ["interfaces", "disks", "bmcs"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE machine_id = $1"))
            .bind(id.0)
            .execute(&mut **tx)
            .await?;
    }
    let mut rec = rec.clone();
    if let Some(c) = kept {
        rec.password = PasswordChange::Set(c);
    }
    insert_children(tx, &[(id, &rec)]).await?;
    Ok(())
}

#[async_trait]
impl MachineStore for Store {
    async fn create_machine(
        &self,
        id: MachineId,
        state: LifecycleState,
        rec: &MachineRecord,
        event: &NewEvent,
    ) -> Result<Machine, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        insert_machines(&mut tx, &[(id, state, rec)]).await?;
        insert_events(&mut tx, &[event]).await?;
        let m = load_one_tx(&mut tx, id.0).await?;
        tx.commit().await?;
        Ok(m)
    }

    async fn update_machine(
        &self,
        id: MachineId,
        expected_version: i64,
        rec: &MachineRecord,
        event: &NewEvent,
    ) -> Result<Machine, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        update_in_tx(&mut tx, id, expected_version, rec).await?;
        insert_events(&mut tx, &[event]).await?;
        let m = load_one_tx(&mut tx, id.0).await?;
        tx.commit().await?;
        Ok(m)
    }

    async fn delete_machine(
        &self,
        id: MachineId,
        expected_version: i64,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let done = sqlx::query("DELETE FROM machines WHERE id = $1 AND version = $2")
            .bind(id.0)
            .bind(expected_version)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            current_version(&mut tx, id.0, expected_version).await?;
            return Err(StoreError::Backend("delete matched no row".into()));
        }
        insert_events(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_state(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        from: LifecycleState,
        to: LifecycleState,
        reason: Option<&str>,
        manual_hold: bool,
        event: &NewEvent,
    ) -> Result<Machine, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE machines SET state = $1, state_reason = $2, state_by = $7, manual_hold = $8, \
             updated_at = $3, version = version + 1 \
             WHERE id = $4 AND state = $5 AND ($6 IS NULL OR version = $6)",
        )
        .bind(to.as_str())
        .bind(reason)
        .bind(Utc::now())
        .bind(id.0)
        .bind(from.as_str())
        .bind(expected_version)
        .bind(&event.actor)
        .bind(manual_hold)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            let v: Option<i64> = sqlx::query_scalar("SELECT version FROM machines WHERE id = $1")
                .bind(id.0)
                .fetch_optional(&mut *tx)
                .await?;
            return Err(match v {
                None => StoreError::NotFound,
                Some(current) => StoreError::VersionMismatch {
                    expected: expected_version.unwrap_or(-1),
                    current,
                },
            });
        }
        insert_events(&mut tx, &[event]).await?;
        let m = load_one_tx(&mut tx, id.0).await?;
        tx.commit().await?;
        Ok(m)
    }

    async fn import_batches(
        &self,
        batches: &mut dyn ImportBatches,
        actor: &str,
    ) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        // Dropped without a commit (an error from a batch or a write), the transaction rolls back.
        while let Some(batch) = batches.next_batch().await? {
            let with_state: Vec<(MachineId, LifecycleState, &MachineRecord)> = batch
                .creates
                .iter()
                .map(|(id, r)| (*id, LifecycleState::Registered, r))
                .collect();
            insert_machines(&mut tx, &with_state).await?;
            for u in &batch.updates {
                update_in_tx(&mut tx, u.id, u.expected_version, &u.rec).await?;
            }
            let created: Vec<NewEvent> = batch
                .creates
                .iter()
                .map(|(id, r)| NewEvent {
                    machine_id: Some(*id),
                    kind: "machine.created".into(),
                    actor: actor.to_string(),
                    detail: serde_json::json!({
                        "state": LifecycleState::Registered,
                        "import": true,
                        "changes": spec_diff(None, Some(&r.spec)),
                    }),
                })
                .collect();
            let refs: Vec<&NewEvent> = created
                .iter()
                .chain(batch.updates.iter().map(|u| &u.event))
                .collect();
            insert_events(&mut tx, &refs).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get_machine(&self, id: MachineId) -> Result<Option<Machine>, StoreError> {
        let mut conn = self.read.acquire().await?;
        load_one(&mut conn, id.0).await
    }

    async fn find_machine(&self, key: &UniqueKey) -> Result<Option<Machine>, StoreError> {
        let found = self.owners(std::slice::from_ref(key)).await?;
        match found.first() {
            Some((_, owner)) => {
                let mut conn = self.read.acquire().await?;
                load_one(&mut conn, owner.id.0).await
            }
            None => Ok(None),
        }
    }

    async fn owners(&self, keys: &[UniqueKey]) -> Result<Vec<(UniqueKey, MachineRef)>, StoreError> {
        let mut out = Vec::new();
        let name = |r: &Row| -> Result<MachineRef, StoreError> {
            let id: Uuid = r.try_get("id")?;
            let host: Option<String> = r.try_get("hostname")?;
            let serial: Option<String> = r.try_get("serial")?;
            Ok(MachineRef {
                id: MachineId(id),
                name: host.or(serial).unwrap_or_else(|| id.to_string()),
            })
        };
        // One query per kind of key.
        let text_kinds: [(
            &str,
            &str,
            fn(&UniqueKey) -> Option<String>,
            fn(String) -> Option<UniqueKey>,
        ); 5] = [
            (
                "m.hostname",
                "",
                |k| {
                    if let UniqueKey::Hostname(v) = k {
                        Some(v.clone())
                    } else {
                        None
                    }
                },
                |v| Some(UniqueKey::Hostname(v)),
            ),
            (
                "m.serial",
                "",
                |k| {
                    if let UniqueKey::Serial(v) = k {
                        Some(v.clone())
                    } else {
                        None
                    }
                },
                |v| Some(UniqueKey::Serial(v)),
            ),
            (
                "m.asset_tag",
                "",
                |k| {
                    if let UniqueKey::AssetTag(v) = k {
                        Some(v.clone())
                    } else {
                        None
                    }
                },
                |v| Some(UniqueKey::AssetTag(v)),
            ),
            (
                "i.mac",
                "JOIN interfaces i ON i.machine_id = m.id",
                |k| {
                    if let UniqueKey::Mac(v) = k {
                        Some(v.to_string())
                    } else {
                        None
                    }
                },
                |v| v.parse().ok().map(UniqueKey::Mac),
            ),
            (
                "i.ipv4",
                "JOIN interfaces i ON i.machine_id = m.id",
                |k| {
                    if let UniqueKey::Ipv4(v) = k {
                        Some(v.to_string())
                    } else {
                        None
                    }
                },
                |v| v.parse().ok().map(UniqueKey::Ipv4),
            ),
        ];
        for (col, join, pick, make) in text_kinds {
            let vals: Vec<String> = keys.iter().filter_map(pick).collect();
            for chunk in vals.chunks(CHUNK) {
                let mut q = QueryBuilder::<Db>::new(format!(
                    "SELECT {col} AS k, m.id, m.hostname, m.serial FROM machines m {join} WHERE {col} IN ("
                ));
                let mut sep = q.separated(", ");
                for v in chunk {
                    sep.push_bind(v.clone());
                }
                q.push(")");
                for r in q.build().fetch_all(&self.read).await? {
                    let k: String = r.try_get("k")?;
                    if let Some(key) = make(k) {
                        out.push((key, name(&r)?));
                    }
                }
            }
        }
        let uuids: Vec<Uuid> = keys
            .iter()
            .filter_map(|k| {
                if let UniqueKey::SmbiosUuid(u) = k {
                    Some(*u)
                } else {
                    None
                }
            })
            .collect();
        for chunk in uuids.chunks(CHUNK) {
            let mut q = QueryBuilder::<Db>::new(
                "SELECT m.smbios_uuid AS k, m.id, m.hostname, m.serial FROM machines m WHERE m.smbios_uuid IN (",
            );
            let mut sep = q.separated(", ");
            for v in chunk {
                sep.push_bind(*v);
            }
            q.push(")");
            for r in q.build().fetch_all(&self.read).await? {
                let k: Uuid = r.try_get("k")?;
                out.push((UniqueKey::SmbiosUuid(k), name(&r)?));
            }
        }
        Ok(out)
    }

    async fn list_machines(&self, filter: &MachineFilter) -> Result<MachinePage, StoreError> {
        let mut count = QueryBuilder::<Db>::new("SELECT COUNT(*) FROM machines m");
        push_filter(&mut count, filter);
        let total: i64 = count.build_query_scalar().fetch_one(&self.read).await?;
        let limit = filter.limit.clamp(1, 1000);
        let mut q = QueryBuilder::<Db>::new(format!("SELECT {MACHINE_COLS} FROM machines m"));
        push_filter(&mut q, filter);
        if let Some(after) = filter.after {
            q.push(" AND m.id > ").push_bind(after.0);
        }
        q.push(" ORDER BY m.id LIMIT ")
            .push_bind(i64::from(limit) + 1);
        let rows = q.build().fetch_all(&self.read).await?;
        let mut items = rows
            .iter()
            .map(machine_row)
            .collect::<Result<Vec<_>, _>>()?;
        let more = items.len() > limit as usize;
        items.truncate(limit as usize);
        let mut conn = self.read.acquire().await?;
        attach(&mut conn, &mut items).await?;
        let next_cursor = if more {
            items.last().map(|m| m.id.to_string())
        } else {
            None
        };
        Ok(MachinePage {
            items,
            total,
            next_cursor,
        })
    }

    async fn machine_table(
        &self,
        filter: &MachineFilter,
        sort: MachineSort,
        descending: bool,
        offset: u32,
    ) -> Result<MachinePage, StoreError> {
        let mut count = QueryBuilder::<Db>::new("SELECT COUNT(*) FROM machines m");
        push_filter(&mut count, filter);
        let total: i64 = count.build_query_scalar().fetch_one(&self.read).await?;
        let limit = filter.limit.clamp(1, 1000);
        let dir = if descending { "DESC" } else { "ASC" };
        // Column names come from this match only, never from the caller's text.
        let cols: &[&str] = match sort {
            MachineSort::Hostname => &["m.hostname"],
            MachineSort::Location => &["m.site", "m.rack", "m.rack_unit"],
            MachineSort::State => &["m.state"],
            MachineSort::Serial => &["m.serial"],
            MachineSort::AssetTag => &["m.asset_tag"],
            MachineSort::Updated => &["m.updated_at"],
        };
        let order = cols
            .iter()
            .map(|c| format!("({c} IS NULL), {c} {dir}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut q = QueryBuilder::<Db>::new(format!("SELECT {MACHINE_COLS} FROM machines m"));
        push_filter(&mut q, filter);
        q.push(format!(" ORDER BY {order}, m.id {dir} LIMIT "))
            .push_bind(i64::from(limit) + 1)
            .push(" OFFSET ")
            .push_bind(i64::from(offset));
        let rows = q.build().fetch_all(&self.read).await?;
        let mut items = rows
            .iter()
            .map(machine_row)
            .collect::<Result<Vec<_>, _>>()?;
        let more = items.len() > limit as usize;
        items.truncate(limit as usize);
        let mut conn = self.read.acquire().await?;
        attach(&mut conn, &mut items).await?;
        Ok(MachinePage {
            items,
            total,
            next_cursor: more.then(|| (u64::from(offset) + u64::from(limit)).to_string()),
        })
    }

    async fn bmc_password(&self, id: MachineId) -> Result<Option<Vec<u8>>, StoreError> {
        let v: Option<Option<Vec<u8>>> =
            sqlx::query_scalar("SELECT password_ciphertext FROM bmcs WHERE machine_id = $1")
                .bind(id.0)
                .fetch_optional(&self.read)
                .await?;
        Ok(v.flatten())
    }
}
