//! The SQL of the inventory, written once and instantiated for each sqlx database by `sql_store!`.
//!
//! Why a macro: sqlx's executor and codec traits make a function generic over the database carry
//! a dozen higher-ranked bounds that Rust cannot imply; instantiating the same text for `Sqlite` and
//! `Postgres` keeps one copy of every statement (both dialects accept `$N` placeholders, `RETURNING`,
//! `ON CONFLICT` and partial indexes) with concrete, checkable types.

/// Rows per multi-row INSERT: 18 columns x 500 stays under SQLite's and PostgreSQL's bind limits.
pub(crate) const CHUNK: usize = 500;

/// Escape `%`, `_` and `\` for a `LIKE ... ESCAPE '\'` pattern.
pub(crate) fn like_pattern(q: &str) -> String {
    let mut out = String::from("%");
    for c in q.trim().to_lowercase().chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

macro_rules! sql_store {
    ($store:ident, $db:ty) => {
        mod generated {
            use std::collections::HashMap;

            use async_trait::async_trait;
            use chrono::Utc;
            use sqlx::{QueryBuilder, Row};
            use uuid::Uuid;

            use super::$store;
            use crate::domain::*;
            use crate::service::*;
            use crate::store::backend;
            use crate::store::sql::{like_pattern, CHUNK};

            type Db = $db;
            type Tx<'a> = sqlx::Transaction<'a, Db>;

            const MACHINE_COLS: &str = "m.id, m.hostname, m.smbios_uuid, m.serial, m.asset_tag, \
                m.manufacturer, m.model, m.site, m.rack, m.rack_unit, m.role, m.cluster, m.profile, \
                m.state, m.state_reason, m.created_at, m.updated_at, m.version";

            fn parse_enum<T: std::str::FromStr<Err = String>>(col: &str, v: &str) -> Result<T, StoreError> {
                v.parse().map_err(|e| StoreError::Backend(format!("column {col}: {e}")))
            }

            fn machine_row(r: &<Db as sqlx::Database>::Row) -> Result<Machine, StoreError> {
                let role: Option<String> = r.try_get("role").map_err(backend)?;
                let state: String = r.try_get("state").map_err(backend)?;
                let unit: Option<i32> = r.try_get("rack_unit").map_err(backend)?;
                Ok(Machine {
                    id: MachineId(r.try_get("id").map_err(backend)?),
                    hostname: r.try_get("hostname").map_err(backend)?,
                    smbios_uuid: r.try_get("smbios_uuid").map_err(backend)?,
                    serial: r.try_get("serial").map_err(backend)?,
                    asset_tag: r.try_get("asset_tag").map_err(backend)?,
                    manufacturer: r.try_get("manufacturer").map_err(backend)?,
                    model: r.try_get("model").map_err(backend)?,
                    site: r.try_get("site").map_err(backend)?,
                    rack: r.try_get("rack").map_err(backend)?,
                    rack_unit: unit.and_then(|u| u16::try_from(u).ok()),
                    role: role.map(|v: String| parse_enum::<Role>("role", &v)).transpose()?,
                    cluster: r.try_get("cluster").map_err(backend)?,
                    profile: r.try_get("profile").map_err(backend)?,
                    state: parse_enum("state", &state)?,
                    state_reason: r.try_get("state_reason").map_err(backend)?,
                    interfaces: Vec::new(),
                    disks: Vec::new(),
                    bmc: None,
                    created_at: r.try_get("created_at").map_err(backend)?,
                    updated_at: r.try_get("updated_at").map_err(backend)?,
                    version: r.try_get("version").map_err(backend)?,
                })
            }

            /// Fill in NICs, disks and BMCs of `machines` with three queries.
            async fn attach(conn: &mut <Db as sqlx::Database>::Connection, machines: &mut [Machine]) -> Result<(), StoreError> {
                if machines.is_empty() {
                    return Ok(());
                }
                let index: HashMap<Uuid, usize> =
                    machines.iter().enumerate().map(|(i, m)| (m.id.0, i)).collect();
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
                    for r in q.build().fetch_all(&mut *conn).await.map_err(backend)? {
                        let mid: Uuid = r.try_get("machine_id").map_err(backend)?;
                        let mac: String = r.try_get("mac").map_err(backend)?;
                        let ip: Option<String> = r.try_get("ipv4").map_err(backend)?;
                        let nic = Interface {
                            mac: mac.parse().map_err(|e: mac::MacParseError| StoreError::Backend(e.to_string()))?,
                            ipv4: ip.map(|s| s.parse()).transpose().map_err(|e: std::net::AddrParseError| {
                                StoreError::Backend(format!("column ipv4: {e}"))
                            })?,
                            boot: r.try_get("boot").map_err(backend)?,
                            name: r.try_get("name").map_err(backend)?,
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
                    for r in q.build().fetch_all(&mut *conn).await.map_err(backend)? {
                        let mid: Uuid = r.try_get("machine_id").map_err(backend)?;
                        let size: Option<i64> = r.try_get("size_bytes").map_err(backend)?;
                        let kind: Option<String> = r.try_get("disk_type").map_err(backend)?;
                        let disk = Disk {
                            serial: r.try_get("serial").map_err(backend)?,
                            wwid: r.try_get("wwid").map_err(backend)?,
                            model: r.try_get("model").map_err(backend)?,
                            size_bytes: size.map(|s| s as u64),
                            disk_type: kind.map(|v: String| parse_enum::<DiskType>("disk_type", &v)).transpose()?,
                            bus_path: r.try_get("bus_path").map_err(backend)?,
                            data_disk: r.try_get("data_disk").map_err(backend)?,
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
                    for r in q.build().fetch_all(&mut *conn).await.map_err(backend)? {
                        let mid: Uuid = r.try_get("machine_id").map_err(backend)?;
                        let tls: String = r.try_get("tls_mode").map_err(backend)?;
                        let bmc = Bmc {
                            url: r.try_get("url").map_err(backend)?,
                            username: r.try_get("username").map_err(backend)?,
                            tls: parse_enum("tls_mode", &tls)?,
                            fingerprint: r.try_get("fingerprint").map_err(backend)?,
                            has_password: r.try_get("has_password").map_err(backend)?,
                        };
                        if let Some(i) = index.get(&mid) {
                            machines[*i].bmc = Some(bmc);
                        }
                    }
                }
                Ok(())
            }

            /// One machine with its children, read on one connection (inside a transaction when given one).
            async fn load_one(conn: &mut <Db as sqlx::Database>::Connection, id: Uuid) -> Result<Option<Machine>, StoreError> {
                let sql = format!("SELECT {MACHINE_COLS} FROM machines m WHERE m.id = $1");
                let Some(row) = sqlx::query(&sql).bind(id).fetch_optional(&mut *conn).await.map_err(backend)? else {
                    return Ok(None);
                };
                let mut ms = vec![machine_row(&row)?];
                attach(conn, &mut ms).await?;
                Ok(ms.pop())
            }

            async fn load_one_tx(tx: &mut Tx<'_>, id: Uuid) -> Result<Machine, StoreError> {
                load_one(&mut **tx, id).await?.ok_or(StoreError::NotFound)
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
                         version) ",
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
                            .push_bind(1_i64);
                    });
                    q.build().execute(&mut **tx).await.map_err(backend)?;
                }
                let specs: Vec<(MachineId, &MachineRecord)> = rows.iter().map(|(id, _, r)| (*id, *r)).collect();
                insert_children(tx, &specs).await
            }

            async fn insert_children(tx: &mut Tx<'_>, rows: &[(MachineId, &MachineRecord)]) -> Result<(), StoreError> {
                let nics: Vec<(Uuid, i32, &Interface)> = rows
                    .iter()
                    .flat_map(|(id, r)| r.spec.interfaces.iter().enumerate().map(move |(i, n)| (id.0, i as i32, n)))
                    .collect();
                for chunk in nics.chunks(CHUNK) {
                    let mut q = QueryBuilder::<Db>::new("INSERT INTO interfaces (machine_id, position, mac, ipv4, boot, name) ");
                    q.push_values(chunk, |mut b, (id, pos, n)| {
                        b.push_bind(*id)
                            .push_bind(*pos)
                            .push_bind(n.mac.to_string())
                            .push_bind(n.ipv4.map(|i| i.to_string()))
                            .push_bind(n.boot)
                            .push_bind(n.name.clone());
                    });
                    q.build().execute(&mut **tx).await.map_err(backend)?;
                }
                let disks: Vec<(Uuid, i32, &Disk)> = rows
                    .iter()
                    .flat_map(|(id, r)| r.spec.disks.iter().enumerate().map(move |(i, d)| (id.0, i as i32, d)))
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
                    q.build().execute(&mut **tx).await.map_err(backend)?;
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
                    .map_err(backend)?;
                }
                Ok(())
            }

            pub(super) async fn insert_events(tx: &mut Tx<'_>, events: &[&NewEvent]) -> Result<(), StoreError> {
                let now = Utc::now();
                for chunk in events.chunks(CHUNK) {
                    let mut q = QueryBuilder::<Db>::new("INSERT INTO events (machine_id, kind, actor, detail, at) ");
                    q.push_values(chunk, |mut b, e| {
                        b.push_bind(e.machine_id.map(|m| m.0))
                            .push_bind(e.kind.clone())
                            .push_bind(e.actor.clone())
                            .push_bind(sqlx::types::Json(e.detail.clone()))
                            .push_bind(now);
                    });
                    q.build().execute(&mut **tx).await.map_err(backend)?;
                }
                Ok(())
            }

            async fn current_version(tx: &mut Tx<'_>, id: Uuid, expected: i64) -> Result<(), StoreError> {
                let v: Option<i64> = sqlx::query_scalar("SELECT version FROM machines WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(backend)?;
                match v {
                    None => Err(StoreError::NotFound),
                    Some(current) if current != expected => Err(StoreError::VersionMismatch { expected, current }),
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
                    let pat = like_pattern(text);
                    q.push(" AND (");
                    for (i, col) in ["m.hostname", "m.serial", "m.asset_tag", "m.manufacturer", "m.model", "m.site", "m.rack", "m.cluster"]
                        .iter()
                        .enumerate()
                    {
                        if i > 0 {
                            q.push(" OR ");
                        }
                        q.push(format!("LOWER({col}) LIKE ")).push_bind(pat.clone()).push(" ESCAPE '\\'");
                    }
                    q.push(" OR EXISTS (SELECT 1 FROM interfaces i WHERE i.machine_id = m.id AND (i.mac LIKE ")
                        .push_bind(pat.clone())
                        .push(" ESCAPE '\\' OR i.ipv4 LIKE ")
                        .push_bind(pat)
                        .push(" ESCAPE '\\')))");
                }
            }

            impl $store {
                /// A writer's transaction, after its turn at the writer (see `write_turn`; the turn
                /// is held until the transaction ends).
                pub(super) async fn begin_write(&self) -> Result<(Option<tokio::sync::SemaphorePermit<'_>>, Tx<'static>), StoreError> {
                    let turn = self.write_turn().await;
                    let tx = self.write.begin().await.map_err(backend)?;
                    Ok((turn, tx))
                }

                /// A writer's connection, after its turn at the writer.
                async fn write_conn(
                    &self,
                ) -> Result<(Option<tokio::sync::SemaphorePermit<'_>>, sqlx::pool::PoolConnection<Db>), StoreError> {
                    let turn = self.write_turn().await;
                    let conn = self.write.acquire().await.map_err(backend)?;
                    Ok((turn, conn))
                }
            }

            #[async_trait]
            impl InventoryStore for $store {
                async fn ping(&self) -> Result<(), StoreError> {
                    sqlx::query("SELECT 1").execute(&self.read).await.map_err(backend)?;
                    Ok(())
                }

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
                    tx.commit().await.map_err(backend)?;
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
                    let s = &rec.spec;
                    let done = sqlx::query(
                        "UPDATE machines SET hostname = $1, smbios_uuid = $2, serial = $3, asset_tag = $4, \
                         manufacturer = $5, model = $6, site = $7, rack = $8, rack_unit = $9, role = $10, \
                         cluster = $11, profile = $12, updated_at = $13, version = version + 1 \
                         WHERE id = $14 AND version = $15",
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
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                    if done.rows_affected() == 0 {
                        current_version(&mut tx, id.0, expected_version).await?;
                        return Err(StoreError::Backend("update matched no row".into()));
                    }
                    let kept: Option<Vec<u8>> = if rec.password == PasswordChange::Keep {
                        sqlx::query_scalar("SELECT password_ciphertext FROM bmcs WHERE machine_id = $1")
                            .bind(id.0)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(backend)?
                            .flatten()
                    } else {
                        None
                    };
                    for table in ["interfaces", "disks", "bmcs"] {
                        sqlx::query(&format!("DELETE FROM {table} WHERE machine_id = $1"))
                            .bind(id.0)
                            .execute(&mut *tx)
                            .await
                            .map_err(backend)?;
                    }
                    let mut rec = rec.clone();
                    if let Some(c) = kept {
                        rec.password = PasswordChange::Set(c);
                    }
                    insert_children(&mut tx, &[(id, &rec)]).await?;
                    insert_events(&mut tx, &[event]).await?;
                    let m = load_one_tx(&mut tx, id.0).await?;
                    tx.commit().await.map_err(backend)?;
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
                        .await
                        .map_err(backend)?;
                    if done.rows_affected() == 0 {
                        current_version(&mut tx, id.0, expected_version).await?;
                        return Err(StoreError::Backend("delete matched no row".into()));
                    }
                    insert_events(&mut tx, &[event]).await?;
                    tx.commit().await.map_err(backend)?;
                    Ok(())
                }

                async fn set_state(
                    &self,
                    id: MachineId,
                    expected_version: Option<i64>,
                    from: LifecycleState,
                    to: LifecycleState,
                    reason: Option<&str>,
                    event: &NewEvent,
                ) -> Result<Machine, StoreError> {
                    let (_turn, mut tx) = self.begin_write().await?;
                    let done = sqlx::query(
                        "UPDATE machines SET state = $1, state_reason = $2, updated_at = $3, version = version + 1 \
                         WHERE id = $4 AND state = $5 AND ($6 IS NULL OR version = $6)",
                    )
                    .bind(to.as_str())
                    .bind(reason)
                    .bind(Utc::now())
                    .bind(id.0)
                    .bind(from.as_str())
                    .bind(expected_version)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                    if done.rows_affected() == 0 {
                        let v: Option<i64> = sqlx::query_scalar("SELECT version FROM machines WHERE id = $1")
                            .bind(id.0)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(backend)?;
                        return Err(match v {
                            None => StoreError::NotFound,
                            Some(current) => StoreError::VersionMismatch { expected: expected_version.unwrap_or(-1), current },
                        });
                    }
                    insert_events(&mut tx, &[event]).await?;
                    let m = load_one_tx(&mut tx, id.0).await?;
                    tx.commit().await.map_err(backend)?;
                    Ok(m)
                }

                async fn import_machines(
                    &self,
                    rows: &[(MachineId, MachineRecord)],
                    actor: &str,
                ) -> Result<(), StoreError> {
                    let (_turn, mut tx) = self.begin_write().await?;
                    let with_state: Vec<(MachineId, LifecycleState, &MachineRecord)> =
                        rows.iter().map(|(id, r)| (*id, LifecycleState::Registered, r)).collect();
                    insert_machines(&mut tx, &with_state).await?;
                    let events: Vec<NewEvent> = rows
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
                    let refs: Vec<&NewEvent> = events.iter().collect();
                    insert_events(&mut tx, &refs).await?;
                    tx.commit().await.map_err(backend)?;
                    Ok(())
                }

                async fn get_machine(&self, id: MachineId) -> Result<Option<Machine>, StoreError> {
                    let mut conn = self.read.acquire().await.map_err(backend)?;
                    load_one(&mut conn, id.0).await
                }

                async fn find_machine(&self, key: &UniqueKey) -> Result<Option<Machine>, StoreError> {
                    let found = self.owners(std::slice::from_ref(key)).await?;
                    match found.first() {
                        Some((_, owner)) => {
                            let mut conn = self.read.acquire().await.map_err(backend)?;
                            load_one(&mut conn, owner.id.0).await
                        }
                        None => Ok(None),
                    }
                }

                async fn owners(&self, keys: &[UniqueKey]) -> Result<Vec<(UniqueKey, MachineRef)>, StoreError> {
                    let mut out = Vec::new();
                    let name = |r: &<Db as sqlx::Database>::Row| -> Result<MachineRef, StoreError> {
                        let id: Uuid = r.try_get("id").map_err(backend)?;
                        let host: Option<String> = r.try_get("hostname").map_err(backend)?;
                        let serial: Option<String> = r.try_get("serial").map_err(backend)?;
                        Ok(MachineRef { id: MachineId(id), name: host.or(serial).unwrap_or_else(|| id.to_string()) })
                    };
                    // One query per kind of key.
                    let text_kinds: [(&str, &str, fn(&UniqueKey) -> Option<String>, fn(String) -> Option<UniqueKey>); 5] = [
                        ("m.hostname", "", |k| if let UniqueKey::Hostname(v) = k { Some(v.clone()) } else { None }, |v| Some(UniqueKey::Hostname(v))),
                        ("m.serial", "", |k| if let UniqueKey::Serial(v) = k { Some(v.clone()) } else { None }, |v| Some(UniqueKey::Serial(v))),
                        ("m.asset_tag", "", |k| if let UniqueKey::AssetTag(v) = k { Some(v.clone()) } else { None }, |v| Some(UniqueKey::AssetTag(v))),
                        ("i.mac", "JOIN interfaces i ON i.machine_id = m.id", |k| if let UniqueKey::Mac(v) = k { Some(v.to_string()) } else { None }, |v| v.parse().ok().map(UniqueKey::Mac)),
                        ("i.ipv4", "JOIN interfaces i ON i.machine_id = m.id", |k| if let UniqueKey::Ipv4(v) = k { Some(v.to_string()) } else { None }, |v| v.parse().ok().map(UniqueKey::Ipv4)),
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
                            for r in q.build().fetch_all(&self.read).await.map_err(backend)? {
                                let k: String = r.try_get("k").map_err(backend)?;
                                if let Some(key) = make(k) {
                                    out.push((key, name(&r)?));
                                }
                            }
                        }
                    }
                    let uuids: Vec<Uuid> = keys
                        .iter()
                        .filter_map(|k| if let UniqueKey::SmbiosUuid(u) = k { Some(*u) } else { None })
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
                        for r in q.build().fetch_all(&self.read).await.map_err(backend)? {
                            let k: Uuid = r.try_get("k").map_err(backend)?;
                            out.push((UniqueKey::SmbiosUuid(k), name(&r)?));
                        }
                    }
                    Ok(out)
                }

                async fn list_machines(&self, filter: &MachineFilter) -> Result<MachinePage, StoreError> {
                    let mut count = QueryBuilder::<Db>::new("SELECT COUNT(*) FROM machines m");
                    push_filter(&mut count, filter);
                    let total: i64 = count.build_query_scalar().fetch_one(&self.read).await.map_err(backend)?;
                    let limit = filter.limit.clamp(1, 1000);
                    let mut q = QueryBuilder::<Db>::new(format!("SELECT {MACHINE_COLS} FROM machines m"));
                    push_filter(&mut q, filter);
                    if let Some(after) = filter.after {
                        q.push(" AND m.id > ").push_bind(after.0);
                    }
                    q.push(" ORDER BY m.id LIMIT ").push_bind(i64::from(limit) + 1);
                    let rows = q.build().fetch_all(&self.read).await.map_err(backend)?;
                    let mut items = rows.iter().map(machine_row).collect::<Result<Vec<_>, _>>()?;
                    let more = items.len() > limit as usize;
                    items.truncate(limit as usize);
                    let mut conn = self.read.acquire().await.map_err(backend)?;
                    attach(&mut conn, &mut items).await?;
                    let next_cursor = if more { items.last().map(|m| m.id.to_string()) } else { None };
                    Ok(MachinePage { items, total, next_cursor })
                }

                async fn bmc_password(&self, id: MachineId) -> Result<Option<Vec<u8>>, StoreError> {
                    let v: Option<Option<Vec<u8>>> =
                        sqlx::query_scalar("SELECT password_ciphertext FROM bmcs WHERE machine_id = $1")
                            .bind(id.0)
                            .fetch_optional(&self.read)
                            .await
                            .map_err(backend)?;
                    Ok(v.flatten())
                }

                async fn append_event(&self, event: &NewEvent) -> Result<(), StoreError> {
                    self.group_commit.write(crate::store::group_commit::WriteOp::Event(event.clone())).await.map(|_| ())
                }

                async fn append_events(&self, events: &[NewEvent]) -> Result<(), StoreError> {
                    if events.is_empty() {
                        return Ok(());
                    }
                    let all: Vec<&NewEvent> = events.iter().collect();
                    let (_turn, mut tx) = self.begin_write().await?;
                    insert_events(&mut tx, &all).await?;
                    tx.commit().await.map_err(backend)
                }

                async fn list_events(&self, f: &EventFilter) -> Result<Vec<Event>, StoreError> {
                    let mut q = QueryBuilder::<Db>::new(
                        "SELECT id, machine_id, kind, actor, detail, at FROM events WHERE 1 = 1",
                    );
                    if let Some(m) = f.machine_id {
                        q.push(" AND machine_id = ").push_bind(m.0);
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
                        q.push(" AND kind LIKE ").push_bind(pat).push(" ESCAPE '\\'");
                    }
                    if let Some(a) = f.after_id {
                        q.push(" AND id > ").push_bind(a);
                    }
                    // The newest `limit` events, returned oldest first.
                    let limit = i64::from(f.limit.clamp(1, 10_000));
                    if f.after_id.is_some() {
                        q.push(" ORDER BY id ASC LIMIT ").push_bind(limit);
                    } else {
                        q.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
                    }
                    let rows = q.build().fetch_all(&self.read).await.map_err(backend)?;
                    let mut out = Vec::with_capacity(rows.len());
                    for r in rows {
                        let mid: Option<Uuid> = r.try_get("machine_id").map_err(backend)?;
                        let detail: sqlx::types::Json<serde_json::Value> = r.try_get("detail").map_err(backend)?;
                        out.push(Event {
                            id: r.try_get("id").map_err(backend)?,
                            machine_id: mid.map(MachineId),
                            kind: r.try_get("kind").map_err(backend)?,
                            actor: r.try_get("actor").map_err(backend)?,
                            detail: detail.0,
                            at: r.try_get("at").map_err(backend)?,
                        });
                    }
                    if f.after_id.is_none() {
                        out.reverse();
                    }
                    Ok(out)
                }

                async fn create_token(&self, t: &NewToken) -> Result<TokenInfo, StoreError> {
                    let now = Utc::now();
                    sqlx::query(
                        "INSERT INTO api_tokens (id, name, role, token_hash, created_at, expires_at) \
                         VALUES ($1, $2, $3, $4, $5, $6)",
                    )
                    .bind(t.id)
                    .bind(&t.name)
                    .bind(t.role.as_str())
                    .bind(&t.hash)
                    .bind(now)
                    .bind(t.expires_at)
                    .execute(&mut *self.write_conn().await?.1)
                    .await
                    .map_err(backend)?;
                    Ok(TokenInfo {
                        id: t.id,
                        name: t.name.clone(),
                        role: t.role,
                        created_at: now,
                        expires_at: t.expires_at,
                        revoked: false,
                    })
                }

                async fn token_by_hash(&self, hash: &[u8]) -> Result<Option<TokenInfo>, StoreError> {
                    let row = sqlx::query(
                        "SELECT id, name, role, created_at, expires_at, revoked_at IS NOT NULL AS revoked \
                         FROM api_tokens WHERE token_hash = $1",
                    )
                    .bind(hash)
                    .fetch_optional(&self.read)
                    .await
                    .map_err(backend)?;
                    let Some(r) = row else { return Ok(None) };
                    let t = token_row(&r)?;
                    if t.revoked || t.expires_at.is_some_and(|e| e <= Utc::now()) {
                        return Ok(None);
                    }
                    Ok(Some(t))
                }

                async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError> {
                    let rows = sqlx::query(
                        "SELECT id, name, role, created_at, expires_at, revoked_at IS NOT NULL AS revoked \
                         FROM api_tokens ORDER BY created_at, id",
                    )
                    .fetch_all(&self.read)
                    .await
                    .map_err(backend)?;
                    rows.iter().map(token_row).collect()
                }

                async fn revoke_token(&self, id: Uuid) -> Result<bool, StoreError> {
                    let done = sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                        .bind(Utc::now())
                        .bind(id)
                        .execute(&mut *self.write_conn().await?.1)
                        .await
                        .map_err(backend)?;
                    Ok(done.rows_affected() > 0)
                }
            }

            fn lease_row(r: &<Db as sqlx::Database>::Row) -> Result<Lease, StoreError> {
                let ip: i64 = r.try_get("ip").map_err(backend)?;
                let mac: String = r.try_get("mac").map_err(backend)?;
                let state: String = r.try_get("state").map_err(backend)?;
                Ok(Lease {
                    ip: std::net::Ipv4Addr::from(u32::try_from(ip).map_err(|_| StoreError::Backend(format!("lease ip {ip}")))?),
                    subnet: r.try_get("subnet").map_err(backend)?,
                    mac: mac.parse().map_err(|e: mac::MacParseError| StoreError::Backend(e.to_string()))?,
                    state: LeaseState::parse(&state).ok_or_else(|| StoreError::Backend(format!("lease state {state}")))?,
                    expires_ms: r.try_get("expires_ms").map_err(backend)?,
                    hostname: r.try_get("hostname").map_err(backend)?,
                    relay_circuit_id: r.try_get("relay_circuit_id").map_err(backend)?,
                    relay_remote_id: r.try_get("relay_remote_id").map_err(backend)?,
                    giaddr: r.try_get("giaddr").map_err(backend)?,
                    updated_ms: r.try_get("updated_ms").map_err(backend)?,
                })
            }

            const LEASE_COLS: &str = "ip, subnet, mac, state, expires_ms, hostname, relay_circuit_id, relay_remote_id, giaddr, updated_ms";

            /// The conditional upsert of claims: a row is written only when its address is free,
            /// expired, released, or already this MAC's (and not declined); `RETURNING` names the
            /// addresses that were granted. An offer never downgrades the same MAC's live bound lease.
            const CLAIM_INSERT: &str = "INSERT INTO dhcp_leases (ip, subnet, mac, state, expires_ms, hostname, \
                relay_circuit_id, relay_remote_id, giaddr, updated_ms) ";
            const CLAIM_UPSERT: &str = " ON CONFLICT (ip) DO UPDATE SET subnet = excluded.subnet, mac = excluded.mac, \
                state = CASE WHEN excluded.state = 'offered' AND dhcp_leases.mac = excluded.mac \
                    AND dhcp_leases.state = 'bound' AND dhcp_leases.expires_ms > excluded.updated_ms \
                    THEN dhcp_leases.state ELSE excluded.state END, \
                expires_ms = CASE WHEN excluded.state = 'offered' AND dhcp_leases.mac = excluded.mac \
                    AND dhcp_leases.state = 'bound' AND dhcp_leases.expires_ms > excluded.updated_ms \
                    THEN dhcp_leases.expires_ms ELSE excluded.expires_ms END, \
                hostname = excluded.hostname, \
                relay_circuit_id = excluded.relay_circuit_id, relay_remote_id = excluded.relay_remote_id, \
                giaddr = excluded.giaddr, updated_ms = excluded.updated_ms \
                WHERE (dhcp_leases.mac = excluded.mac AND dhcp_leases.state <> 'declined') \
                   OR dhcp_leases.expires_ms < excluded.updated_ms \
                   OR dhcp_leases.state IN ('released', 'expired') \
                RETURNING ip";

            fn ip_key(ip: std::net::Ipv4Addr) -> i64 {
                i64::from(u32::from(ip))
            }

            /// Power-of-two pieces of `n` (at most `group_commit::MAX_BATCH`), largest first: a
            /// batch's statements come in a few shapes only, so they stay in the statement cache.
            fn chunks(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
                let mut at = 0;
                std::iter::from_fn(move || {
                    let left = n - at;
                    if left == 0 {
                        return None;
                    }
                    let size = 1 << (usize::BITS - 1 - left.leading_zeros());
                    let size = size.min(crate::store::group_commit::MAX_BATCH);
                    at += size;
                    Some(at - size..at)
                })
            }

            /// Claims of distinct addresses by distinct (subnet, MAC)s inside the batch's
            /// transaction: which were granted, in order. Rows go in ascending address order (one
            /// lock order for every instance). Then each granted MAC's other leases in the subnet
            /// expire, one statement for the run: its other offers always, its other bound leases
            /// only when this claim binds (an offer, say to a late duplicate DISCOVER, never ends
            /// an acknowledged lease). A claim of an address that an earlier claim of the same run
            /// frees this way is refused, as if it came first: conservative, never a double grant.
            async fn claim_run(tx: &mut Tx<'_>, claims: &[&Lease]) -> Result<Vec<bool>, StoreError> {
                let mut sorted: Vec<&Lease> = claims.to_vec();
                sorted.sort_by_key(|l| l.ip);
                let mut granted: std::collections::HashSet<i64> = std::collections::HashSet::new();
                for range in chunks(sorted.len()) {
                    let mut qb = QueryBuilder::<Db>::new(CLAIM_INSERT);
                    qb.push_values(&sorted[range], |mut b, l| {
                        b.push_bind(ip_key(l.ip))
                            .push_bind(l.subnet.clone())
                            .push_bind(l.mac.to_string())
                            .push_bind(l.state.as_str())
                            .push_bind(l.expires_ms)
                            .push_bind(l.hostname.clone())
                            .push_bind(l.relay_circuit_id.clone())
                            .push_bind(l.relay_remote_id.clone())
                            .push_bind(l.giaddr.clone())
                            .push_bind(l.updated_ms);
                    });
                    qb.push(CLAIM_UPSERT);
                    let rows: Vec<i64> = qb
                        .build_query_scalar()
                        .fetch_all(&mut **tx)
                        .await
                        .map_err(backend)?;
                    granted.extend(rows);
                }
                let won: Vec<&Lease> = claims.iter().copied().filter(|l| granted.contains(&ip_key(l.ip))).collect();
                let now = won.iter().map(|l| l.updated_ms).max().unwrap_or(0);
                for range in chunks(won.len()) {
                    let part = &won[range];
                    // VALUES columns are column1.. in both dialects: subnet, mac, the address kept,
                    // and 1 when the claim binds.
                    let mut qb = QueryBuilder::<Db>::new("UPDATE dhcp_leases SET state = 'expired', updated_ms = ");
                    qb.push_bind(now);
                    qb.push(" FROM (VALUES ");
                    let mut sep = qb.separated(", ");
                    for l in part {
                        sep.push("(").push_bind_unseparated(l.subnet.clone()).push_unseparated(", ");
                        sep.push_bind_unseparated(l.mac.to_string()).push_unseparated(", ");
                        sep.push_bind_unseparated(ip_key(l.ip)).push_unseparated(", ");
                        sep.push_bind_unseparated(i64::from(l.state == LeaseState::Bound)).push_unseparated(")");
                    }
                    // `mac IN` too: it lets a planner without statistics (a new table) use the
                    // (mac, subnet) index.
                    qb.push(") AS k WHERE dhcp_leases.mac IN (");
                    let mut sep = qb.separated(", ");
                    for l in part {
                        sep.push_bind(l.mac.to_string());
                    }
                    qb.push(
                        ") AND dhcp_leases.subnet = k.column1 AND dhcp_leases.mac = k.column2 \
                         AND dhcp_leases.ip <> k.column3 \
                         AND (dhcp_leases.state = 'offered' OR (dhcp_leases.state = 'bound' AND k.column4 = 1))",
                    );
                    qb.build().execute(&mut **tx).await.map_err(backend)?;
                }
                Ok(claims.iter().map(|l| granted.contains(&ip_key(l.ip))).collect())
            }

            /// Write the pending run of claims.
            async fn flush(tx: &mut Tx<'_>, run: &mut Vec<&Lease>, out: &mut Vec<bool>) -> Result<(), StoreError> {
                if !run.is_empty() {
                    out.extend(claim_run(tx, run).await?);
                    run.clear();
                }
                Ok(())
            }

            /// Hand the open window of `id` the token of this boot; false when no window is open.
            async fn window_token(tx: &mut Tx<'_>, id: MachineId, token_sha256: &str, now: chrono::DateTime<Utc>) -> Result<bool, StoreError> {
                let r = sqlx::query(
                    "UPDATE provision_windows SET token_sha256 = $1, token_minted_at = $2 \
                     WHERE machine_id = $3 AND closed_at IS NULL AND expires_at > $2",
                )
                .bind(token_sha256)
                .bind(now)
                .bind(id.0)
                .execute(&mut **tx)
                .await
                .map_err(backend)?;
                Ok(r.rows_affected() == 1)
            }

            /// Record the config served to `id` (sealed).
            async fn served_config(tx: &mut Tx<'_>, id: MachineId, served: &ServedConfig) -> Result<(), StoreError> {
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
                .map_err(backend)?;
                Ok(())
            }

            /// The group commit's batches: every op in one transaction, in queue order, one commit.
            /// Consecutive claims of distinct addresses by distinct MACs form a run written by a few
            /// multi-row statements; an `End`, or a second claim of one address or by one MAC in
            /// one subnet, starts the next run.
            pub(super) struct Batch(pub(super) sqlx::Pool<Db>);

            #[async_trait]
            impl crate::store::group_commit::WriteBatch for Batch {
                async fn apply(&self, ops: &[crate::store::group_commit::WriteOp]) -> Result<Vec<bool>, StoreError> {
                    use crate::store::group_commit::WriteOp;
                    let mut tx = self.0.begin().await.map_err(backend)?;
                    let mut out = Vec::with_capacity(ops.len());
                    let mut run: Vec<&Lease> = Vec::new();
                    for (i, op) in ops.iter().enumerate() {
                        match op {
                            WriteOp::Claim(c) => {
                                let l = &c.lease;
                                if run.iter().any(|r| r.ip == l.ip || (r.mac == l.mac && r.subnet == l.subnet)) {
                                    flush(&mut tx, &mut run, &mut out).await?;
                                }
                                run.push(&c.lease);
                            }
                            WriteOp::End { ip, mac, state, expires_ms, now_ms } => {
                                flush(&mut tx, &mut run, &mut out).await?;
                                let done = sqlx::query(
                                    "UPDATE dhcp_leases SET state = $1, expires_ms = $2, updated_ms = $3 WHERE ip = $4 AND mac = $5",
                                )
                                .bind(state.as_str())
                                .bind(*expires_ms)
                                .bind(*now_ms)
                                .bind(ip_key(*ip))
                                .bind(mac.to_string())
                                .execute(&mut *tx)
                                .await
                                .map_err(backend)?;
                                out.push(done.rows_affected() > 0);
                            }
                            WriteOp::Event(event) => {
                                flush(&mut tx, &mut run, &mut out).await?;
                                insert_events(&mut tx, &[event]).await?;
                                out.push(true);
                            }
                            WriteOp::WindowToken { id, token_sha256, now } => {
                                flush(&mut tx, &mut run, &mut out).await?;
                                out.push(window_token(&mut tx, *id, token_sha256, *now).await?);
                            }
                            WriteOp::Served { id, served, event } => {
                                flush(&mut tx, &mut run, &mut out).await?;
                                served_config(&mut tx, *id, served).await?;
                                insert_events(&mut tx, &[event]).await?;
                                out.push(true);
                            }
                        }
                        debug_assert!(out.len() + run.len() == i + 1);
                    }
                    flush(&mut tx, &mut run, &mut out).await?;
                    tx.commit().await.map_err(backend)?;
                    Ok(out)
                }
            }

            #[async_trait]
            impl LeaseStore for $store {
                async fn claim_lease(&self, claim: &LeaseClaim) -> Result<bool, StoreError> {
                    self.group_commit.write(crate::store::group_commit::WriteOp::Claim(claim.clone())).await
                }

                fn is_shared(&self) -> bool {
                    <$store>::SHARED
                }

                async fn lease_by_ip(&self, ip: std::net::Ipv4Addr) -> Result<Option<Lease>, StoreError> {
                    let row = sqlx::query(&format!("SELECT {LEASE_COLS} FROM dhcp_leases WHERE ip = $1"))
                        .bind(i64::from(u32::from(ip)))
                        .fetch_optional(&self.lease_read)
                        .await
                        .map_err(backend)?;
                    row.as_ref().map(lease_row).transpose()
                }

                async fn lease_by_mac(&self, subnet: &str, mac: MacAddr) -> Result<Option<Lease>, StoreError> {
                    let row = sqlx::query(&format!(
                        "SELECT {LEASE_COLS} FROM dhcp_leases WHERE subnet = $1 AND mac = $2 \
                         AND state IN ('offered', 'bound') ORDER BY updated_ms DESC LIMIT 1"
                    ))
                    .bind(subnet)
                    .bind(mac.to_string())
                    .fetch_optional(&self.lease_read)
                    .await
                    .map_err(backend)?;
                    row.as_ref().map(lease_row).transpose()
                }

                async fn end_lease(
                    &self,
                    ip: std::net::Ipv4Addr,
                    mac: MacAddr,
                    state: LeaseState,
                    expires_ms: i64,
                    now_ms: i64,
                ) -> Result<bool, StoreError> {
                    self.group_commit
                        .write(crate::store::group_commit::WriteOp::End { ip, mac, state, expires_ms, now_ms })
                        .await
                }

                async fn busy_ips(&self, subnet: &str, now_ms: i64) -> Result<Vec<std::net::Ipv4Addr>, StoreError> {
                    let rows: Vec<i64> = sqlx::query_scalar(
                        "SELECT ip FROM dhcp_leases WHERE subnet = $1 AND expires_ms >= $2 \
                         AND state IN ('offered', 'bound', 'declined')",
                    )
                    .bind(subnet)
                    .bind(now_ms)
                    .fetch_all(&self.lease_read)
                    .await
                    .map_err(backend)?;
                    Ok(rows.into_iter().filter_map(|i| u32::try_from(i).ok()).map(std::net::Ipv4Addr::from).collect())
                }

                async fn leases_of_mac(&self, mac: MacAddr) -> Result<Vec<Lease>, StoreError> {
                    let rows = sqlx::query(&format!(
                        "SELECT {LEASE_COLS} FROM dhcp_leases WHERE mac = $1 ORDER BY updated_ms DESC"
                    ))
                    .bind(mac.to_string())
                    .fetch_all(&self.lease_read)
                    .await
                    .map_err(backend)?;
                    rows.iter().map(lease_row).collect()
                }

                async fn reservation(&self, mac: MacAddr) -> Result<Option<Reservation>, StoreError> {
                    let row = sqlx::query("SELECT machine_id, ipv4 FROM interfaces WHERE mac = $1")
                        .bind(mac.to_string())
                        .fetch_optional(&self.lease_read)
                        .await
                        .map_err(backend)?;
                    let Some(r) = row else { return Ok(None) };
                    let id: Uuid = r.try_get("machine_id").map_err(backend)?;
                    let ip: Option<String> = r.try_get("ipv4").map_err(backend)?;
                    Ok(Some(Reservation { machine_id: MachineId(id), ipv4: ip.and_then(|s| s.parse().ok()) }))
                }

                async fn reserved_for_other(&self, ip: std::net::Ipv4Addr, mac: MacAddr) -> Result<bool, StoreError> {
                    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM interfaces WHERE ipv4 = $1 AND mac <> $2")
                        .bind(ip.to_string())
                        .bind(mac.to_string())
                        .fetch_one(&self.lease_read)
                        .await
                        .map_err(backend)?;
                    Ok(n > 0)
                }

                async fn client_facts(
                    &self,
                    subnet: &str,
                    mac: MacAddr,
                    ips: [Option<std::net::Ipv4Addr>; 2],
                ) -> Result<ClientFacts, StoreError> {
                    let row = sqlx::query(&format!(
                        "SELECT (SELECT ipv4 FROM interfaces WHERE mac = $1) AS reserved_ip, \
                         (SELECT COUNT(*) FROM interfaces WHERE ipv4 = $2 AND mac <> $1) AS first_reserved, \
                         (SELECT COUNT(*) FROM interfaces WHERE ipv4 = $3 AND mac <> $1) AS second_reserved, \
                         l.* FROM (SELECT 1 AS one) AS o LEFT JOIN \
                         (SELECT {LEASE_COLS} FROM dhcp_leases WHERE subnet = $4 AND mac = $1 \
                          AND state IN ('offered', 'bound') ORDER BY updated_ms DESC LIMIT 1) AS l ON TRUE"
                    ))
                    .bind(mac.to_string())
                    .bind(ips[0].map(|ip| ip.to_string()))
                    .bind(ips[1].map(|ip| ip.to_string()))
                    .bind(subnet)
                    .fetch_one(&self.lease_read)
                    .await
                    .map_err(backend)?;
                    let reserved: Option<String> = row.try_get("reserved_ip").map_err(backend)?;
                    let mut facts = ClientFacts {
                        reserved_ip: reserved.and_then(|s| s.parse().ok()),
                        ..Default::default()
                    };
                    for (ip, col) in ips.iter().zip(["first_reserved", "second_reserved"]) {
                        let n: i64 = row.try_get(col).map_err(backend)?;
                        if let (Some(ip), true) = (ip, n > 0) {
                            facts.reserved_for_other.push(*ip);
                        }
                    }
                    let lease_ip: Option<i64> = row.try_get("ip").map_err(backend)?;
                    if lease_ip.is_some() {
                        facts.lease = Some(lease_row(&row)?);
                    }
                    Ok(facts)
                }
            }

            const CAPS_COLS: &str = "machine_id, bmc_url, vendor, model, quirks, redfish_version, sessions, auth, \
                reset_types, boot_targets, boot_mode_settable, virtual_media, etag_offered, etag_weak, \
                if_match_required, tls_mode, probed_at, last_error, attempted_at";

            fn caps_row(r: &<Db as sqlx::Database>::Row) -> Result<CapabilityRecord, StoreError> {
                use crate::service::bmc::{Capabilities, EtagSupport, MediaLocation};
                let list = |col: &str| -> Result<Vec<String>, StoreError> {
                    let text: Option<String> = r.try_get(col).map_err(backend)?;
                    match text {
                        None => Ok(Vec::new()),
                        Some(t) => serde_json::from_str(&t).map_err(|e| StoreError::Backend(format!("column {col}: {e}"))),
                    }
                };
                let auth: Option<String> = r.try_get("auth").map_err(backend)?;
                let capabilities = match auth {
                    None => None,
                    Some(auth) => {
                        let media: Option<String> = r.try_get("virtual_media").map_err(backend)?;
                        let tls: Option<String> = r.try_get("tls_mode").map_err(backend)?;
                        let flag = |col: &str| -> Result<bool, StoreError> {
                            let v: Option<bool> = r.try_get(col).map_err(backend)?;
                            Ok(v.unwrap_or(false))
                        };
                        Some(Capabilities {
                            vendor: r.try_get("vendor").map_err(backend)?,
                            model: r.try_get("model").map_err(backend)?,
                            quirks: r.try_get("quirks").map_err(backend)?,
                            redfish_version: r.try_get("redfish_version").map_err(backend)?,
                            sessions: flag("sessions")?,
                            auth,
                            reset_types: list("reset_types")?,
                            boot_targets: list("boot_targets")?,
                            boot_mode_settable: flag("boot_mode_settable")?,
                            virtual_media: match media.as_deref() {
                                None => None,
                                Some("system") => Some(MediaLocation::System),
                                Some("manager") => Some(MediaLocation::Manager),
                                Some(other) => return Err(StoreError::Backend(format!("column virtual_media: `{other}`"))),
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
                    machine_id: MachineId(r.try_get("machine_id").map_err(backend)?),
                    bmc_url: r.try_get("bmc_url").map_err(backend)?,
                    capabilities,
                    probed_at: r.try_get("probed_at").map_err(backend)?,
                    last_error: r.try_get("last_error").map_err(backend)?,
                    attempted_at: r.try_get("attempted_at").map_err(backend)?,
                    stale: false,
                })
            }

            #[async_trait]
            impl BmcCapabilityStore for $store {
                async fn put_bmc_capabilities(&self, rec: &CapabilityRecord, event: &NewEvent) -> Result<(), StoreError> {
                    use crate::service::bmc::MediaLocation;
                    let c = rec.capabilities.as_ref();
                    let json_list = |v: &[String]| serde_json::to_string(v).map_err(|e| StoreError::Backend(e.to_string()));
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
                    .map_err(backend)?;
                    insert_events(&mut tx, &[event]).await?;
                    tx.commit().await.map_err(backend)
                }

                async fn bmc_capabilities(&self, id: MachineId) -> Result<Option<CapabilityRecord>, StoreError> {
                    let row = sqlx::query(&format!("SELECT {CAPS_COLS} FROM bmc_capabilities WHERE machine_id = $1"))
                        .bind(id.0)
                        .fetch_optional(&self.read)
                        .await
                        .map_err(backend)?;
                    row.as_ref().map(caps_row).transpose()
                }
            }

            fn json_err(e: serde_json::Error) -> StoreError {
                StoreError::Backend(format!("stored JSON: {e}"))
            }

            const WINDOW_COLS: &str = "machine_id, opened_at, expires_at, opened_by, wipe, token_sha256, \
                token_minted_at, closed_at, close_reason";

            fn window_row(r: &<Db as sqlx::Database>::Row) -> Result<ProvisionWindow, StoreError> {
                Ok(ProvisionWindow {
                    machine_id: MachineId(r.try_get("machine_id").map_err(backend)?),
                    opened_at: r.try_get("opened_at").map_err(backend)?,
                    expires_at: r.try_get("expires_at").map_err(backend)?,
                    opened_by: r.try_get("opened_by").map_err(backend)?,
                    wipe: r.try_get("wipe").map_err(backend)?,
                    token_sha256: r.try_get("token_sha256").map_err(backend)?,
                    token_minted_at: r.try_get("token_minted_at").map_err(backend)?,
                    closed_at: r.try_get("closed_at").map_err(backend)?,
                    close_reason: r.try_get("close_reason").map_err(backend)?,
                })
            }

            #[async_trait]
            impl ConfigStore for $store {
                async fn put_config_objects(&self, w: &ConfigWrite, events: &[NewEvent]) -> Result<(), StoreError> {
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
                        .map_err(backend)?;
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
                        .map_err(backend)?;
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
                        .map_err(backend)?;
                    }
                    for (id, mp) in &w.machine_patches {
                        sqlx::query(
                            "INSERT INTO machine_configs (machine_id, patches) VALUES ($1, $2) \
                             ON CONFLICT (machine_id) DO UPDATE SET patches = excluded.patches",
                        )
                        .bind(id.0)
                        .bind(serde_json::to_string(mp).map_err(json_err)?)
                        .execute(&mut *tx)
                        .await
                        .map_err(backend)?;
                    }
                    let refs: Vec<&NewEvent> = events.iter().collect();
                    insert_events(&mut tx, &refs).await?;
                    tx.commit().await.map_err(backend)
                }

                async fn clusters(&self) -> Result<Vec<ClusterRecord>, StoreError> {
                    let rows = sqlx::query(
                        "SELECT spec, secrets, base_controlplane, base_worker, secrets_sha256 FROM clusters ORDER BY name",
                    )
                    .fetch_all(&self.read)
                    .await
                    .map_err(backend)?;
                    rows.iter()
                        .map(|r| {
                            let spec: String = r.try_get("spec").map_err(backend)?;
                            let cp: Option<Vec<u8>> = r.try_get("base_controlplane").map_err(backend)?;
                            let wk: Option<Vec<u8>> = r.try_get("base_worker").map_err(backend)?;
                            Ok(ClusterRecord {
                                spec: serde_json::from_str(&spec).map_err(json_err)?,
                                sealed_bundle: r.try_get("secrets").map_err(backend)?,
                                sealed_base: cp.zip(wk),
                                secrets_sha256: r.try_get("secrets_sha256").map_err(backend)?,
                            })
                        })
                        .collect()
                }

                async fn profiles(&self) -> Result<Vec<ProfileSpec>, StoreError> {
                    let rows: Vec<String> = sqlx::query_scalar("SELECT spec FROM profiles ORDER BY name")
                        .fetch_all(&self.read)
                        .await
                        .map_err(backend)?;
                    rows.iter().map(|s| serde_json::from_str(s).map_err(json_err)).collect()
                }

                async fn groups(&self) -> Result<Vec<GroupSpec>, StoreError> {
                    let rows: Vec<String> = sqlx::query_scalar("SELECT spec FROM config_groups ORDER BY kind, name")
                        .fetch_all(&self.read)
                        .await
                        .map_err(backend)?;
                    rows.iter().map(|s| serde_json::from_str(s).map_err(json_err)).collect()
                }

                async fn machine_config(&self, id: MachineId) -> Result<(MachinePatches, Option<ServedConfig>), StoreError> {
                    let row = sqlx::query(
                        "SELECT patches, served_config, served_sha256, served_at FROM machine_configs WHERE machine_id = $1",
                    )
                    .bind(id.0)
                    .fetch_optional(&self.read)
                    .await
                    .map_err(backend)?;
                    let Some(r) = row else {
                        return Ok((MachinePatches::default(), None));
                    };
                    let patches: String = r.try_get("patches").map_err(backend)?;
                    let sealed: Option<Vec<u8>> = r.try_get("served_config").map_err(backend)?;
                    let sha: Option<String> = r.try_get("served_sha256").map_err(backend)?;
                    let at: Option<chrono::DateTime<Utc>> = r.try_get("served_at").map_err(backend)?;
                    let served = match (sealed, sha, at) {
                        (Some(sealed), Some(sha256), Some(at)) => Some(ServedConfig { sealed, sha256, at }),
                        _ => None,
                    };
                    Ok((serde_json::from_str(&patches).map_err(json_err)?, served))
                }

                async fn all_machine_patches(&self) -> Result<Vec<(MachineId, MachinePatches)>, StoreError> {
                    let rows = sqlx::query("SELECT machine_id, patches FROM machine_configs")
                        .fetch_all(&self.read)
                        .await
                        .map_err(backend)?;
                    rows.iter()
                        .map(|r| {
                            let p: String = r.try_get("patches").map_err(backend)?;
                            Ok((MachineId(r.try_get("machine_id").map_err(backend)?), serde_json::from_str(&p).map_err(json_err)?))
                        })
                        .collect()
                }

                async fn record_served(&self, id: MachineId, served: &ServedConfig, event: &NewEvent) -> Result<(), StoreError> {
                    self.group_commit
                        .write(crate::store::group_commit::WriteOp::Served { id, served: served.clone(), event: event.clone() })
                        .await
                        .map(|_| ())
                }

                async fn put_window(&self, w: &ProvisionWindow, event: &NewEvent) -> Result<(), StoreError> {
                    let (_turn, mut tx) = self.begin_write().await?;
                    sqlx::query(&format!(
                        "INSERT INTO provision_windows ({WINDOW_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                         ON CONFLICT (machine_id) DO UPDATE SET opened_at = excluded.opened_at, \
                         expires_at = excluded.expires_at, opened_by = excluded.opened_by, wipe = excluded.wipe, \
                         token_sha256 = excluded.token_sha256, token_minted_at = excluded.token_minted_at, \
                         closed_at = excluded.closed_at, close_reason = excluded.close_reason"
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
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                    insert_events(&mut tx, &[event]).await?;
                    tx.commit().await.map_err(backend)
                }

                async fn window(&self, id: MachineId) -> Result<Option<ProvisionWindow>, StoreError> {
                    let row = sqlx::query(&format!("SELECT {WINDOW_COLS} FROM provision_windows WHERE machine_id = $1"))
                        .bind(id.0)
                        .fetch_optional(&self.read)
                        .await
                        .map_err(backend)?;
                    row.as_ref().map(window_row).transpose()
                }

                async fn set_window_token(&self, id: MachineId, token_sha256: &str, now: chrono::DateTime<Utc>) -> Result<bool, StoreError> {
                    self.group_commit
                        .write(crate::store::group_commit::WriteOp::WindowToken { id, token_sha256: token_sha256.to_string(), now })
                        .await
                }

                async fn close_window(&self, id: MachineId, now: chrono::DateTime<Utc>, reason: &str, event: &NewEvent) -> Result<bool, StoreError> {
                    let (_turn, mut tx) = self.begin_write().await?;
                    let r = sqlx::query(
                        "UPDATE provision_windows SET closed_at = $1, close_reason = $2, token_sha256 = NULL \
                         WHERE machine_id = $3 AND closed_at IS NULL",
                    )
                    .bind(now)
                    .bind(reason)
                    .bind(id.0)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                    if r.rows_affected() == 0 {
                        return Ok(false);
                    }
                    insert_events(&mut tx, &[event]).await?;
                    tx.commit().await.map_err(backend)?;
                    Ok(true)
                }
            }

            const REINSTALL_COLS: &str = "machine_id, stage, stage_started_at, stage_deadline, wipe, automatic, \
                attempt, event_mark, node_address, requested_by, started_at, finished_at, error";

            fn reinstall_row(r: &<Db as sqlx::Database>::Row) -> Result<crate::service::workflow::Reinstall, StoreError> {
                let stage: String = r.try_get("stage").map_err(backend)?;
                let attempt: i32 = r.try_get("attempt").map_err(backend)?;
                Ok(crate::service::workflow::Reinstall {
                    machine_id: MachineId(r.try_get("machine_id").map_err(backend)?),
                    stage: parse_enum("stage", &stage)?,
                    stage_started_at: r.try_get("stage_started_at").map_err(backend)?,
                    stage_deadline: r.try_get("stage_deadline").map_err(backend)?,
                    wipe: r.try_get("wipe").map_err(backend)?,
                    automatic: r.try_get("automatic").map_err(backend)?,
                    attempt: u32::try_from(attempt).unwrap_or(1),
                    event_mark: r.try_get("event_mark").map_err(backend)?,
                    node_address: r.try_get("node_address").map_err(backend)?,
                    requested_by: r.try_get("requested_by").map_err(backend)?,
                    started_at: r.try_get("started_at").map_err(backend)?,
                    finished_at: r.try_get("finished_at").map_err(backend)?,
                    error: r.try_get("error").map_err(backend)?,
                })
            }

            #[async_trait]
            impl crate::service::workflow::ReinstallStore for $store {
                async fn reinstall(&self, id: MachineId) -> Result<Option<crate::service::workflow::Reinstall>, StoreError> {
                    let row = sqlx::query(&format!("SELECT {REINSTALL_COLS} FROM reinstalls WHERE machine_id = $1"))
                        .bind(id.0)
                        .fetch_optional(&self.read)
                        .await
                        .map_err(backend)?;
                    row.as_ref().map(reinstall_row).transpose()
                }

                async fn active_reinstalls(&self) -> Result<Vec<crate::service::workflow::Reinstall>, StoreError> {
                    let rows = sqlx::query(&format!(
                        "SELECT {REINSTALL_COLS} FROM reinstalls WHERE stage NOT IN ('done', 'failed') ORDER BY started_at"
                    ))
                    .fetch_all(&self.read)
                    .await
                    .map_err(backend)?;
                    rows.iter().map(reinstall_row).collect()
                }

                async fn start_reinstall(&self, r: &crate::service::workflow::Reinstall, event: &NewEvent) -> Result<bool, StoreError> {
                    let (_turn, mut tx) = self.begin_write().await?;
                    let res = sqlx::query(&format!(
                        "INSERT INTO reinstalls ({REINSTALL_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
                         ON CONFLICT (machine_id) DO UPDATE SET stage = excluded.stage, stage_started_at = excluded.stage_started_at, \
                         stage_deadline = excluded.stage_deadline, wipe = excluded.wipe, automatic = excluded.automatic, \
                         attempt = excluded.attempt, event_mark = excluded.event_mark, node_address = excluded.node_address, \
                         requested_by = excluded.requested_by, started_at = excluded.started_at, finished_at = excluded.finished_at, \
                         error = excluded.error WHERE reinstalls.stage IN ('done', 'failed')"
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
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                    if res.rows_affected() == 0 {
                        return Ok(false);
                    }
                    insert_events(&mut tx, &[event]).await?;
                    tx.commit().await.map_err(backend)?;
                    Ok(true)
                }

                async fn advance_reinstall(
                    &self,
                    r: &crate::service::workflow::Reinstall,
                    from: crate::service::workflow::Stage,
                    event: &NewEvent,
                ) -> Result<bool, StoreError> {
                    let (_turn, mut tx) = self.begin_write().await?;
                    let res = sqlx::query(
                        "UPDATE reinstalls SET stage = $1, stage_started_at = $2, stage_deadline = $3, node_address = $4, \
                         finished_at = $5, error = $6 WHERE machine_id = $7 AND stage = $8",
                    )
                    .bind(r.stage.as_str())
                    .bind(r.stage_started_at)
                    .bind(r.stage_deadline)
                    .bind(&r.node_address)
                    .bind(r.finished_at)
                    .bind(&r.error)
                    .bind(r.machine_id.0)
                    .bind(from.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                    if res.rows_affected() == 0 {
                        return Ok(false);
                    }
                    insert_events(&mut tx, &[event]).await?;
                    tx.commit().await.map_err(backend)?;
                    Ok(true)
                }

                async fn last_event_id(&self) -> Result<i64, StoreError> {
                    let id: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM events")
                        .fetch_one(&self.read)
                        .await
                        .map_err(backend)?;
                    Ok(id.unwrap_or(0))
                }
            }

            fn token_row(r: &<Db as sqlx::Database>::Row) -> Result<TokenInfo, StoreError> {
                let role: String = r.try_get("role").map_err(backend)?;
                Ok(TokenInfo {
                    id: r.try_get("id").map_err(backend)?,
                    name: r.try_get("name").map_err(backend)?,
                    role: role.parse().map_err(|e: String| StoreError::Backend(e))?,
                    created_at: r.try_get("created_at").map_err(backend)?,
                    expires_at: r.try_get("expires_at").map_err(backend)?,
                    revoked: r.try_get("revoked").map_err(backend)?,
                })
            }
        }
    };
}

pub(crate) use sql_store;
