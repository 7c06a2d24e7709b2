//! `LeaseStore` in SQL: DHCP leases, one row per address. DHCP's look-ups read the store's lease
//! and inventory views (`crate::store::lease_view`, `crate::store::inventory_view`), else DHCP's
//! own connections (`lease_read`); claims and ends go through the group commit (`super::batch`),
//! which runs `claim_run` inside its transaction. Compiled once per dialect (`super::Db`).

use std::collections::HashSet;
use std::net::Ipv4Addr;

use async_trait::async_trait;
use sqlx::{QueryBuilder, Row as _};
use uuid::Uuid;

use super::{Connection, Db, Row, Store};
use crate::domain::{mac, MacAddr, MachineId};
use crate::service::ports::{
    CircuitPin, ClientFacts, Lease, LeaseClaim, LeaseState, LeaseStore, Reservation, StoreError,
};
use crate::store::group_commit::{WriteOp, MAX_BATCH};
use crate::store::inventory_view::{InventoryView, Nic, Pin};
use crate::store::lease_view::LeaseView;

pub(super) fn lease_row(r: &Row) -> Result<Lease, StoreError> {
    let ip: i64 = r.try_get("ip")?;
    let mac: String = r.try_get("mac")?;
    let state: String = r.try_get("state")?;
    Ok(Lease {
        ip: Ipv4Addr::from(
            u32::try_from(ip).map_err(|_| StoreError::Backend(format!("lease ip {ip}")))?,
        ),
        subnet: r.try_get("subnet")?,
        mac: mac
            .parse()
            .map_err(|e: mac::MacParseError| StoreError::Backend(e.to_string()))?,
        state: LeaseState::parse(&state)
            .ok_or_else(|| StoreError::Backend(format!("lease state {state}")))?,
        expires_ms: r.try_get("expires_ms")?,
        hostname: r.try_get("hostname")?,
        relay_circuit_id: r.try_get("relay_circuit_id")?,
        relay_remote_id: r.try_get("relay_remote_id")?,
        giaddr: r.try_get("giaddr")?,
        updated_ms: r.try_get("updated_ms")?,
    })
}

pub(super) const LEASE_COLS: &str = "ip, subnet, mac, state, expires_ms, hostname, relay_circuit_id, relay_remote_id, giaddr, updated_ms";

/// The conditional upsert of claims: a row is written only when its address is free,
/// expired, released, or already this MAC's (and not declined); `RETURNING` names the
/// addresses that were granted. An offer never downgrades the same MAC's live bound lease.
const CLAIM_INSERT: &str =
    "INSERT INTO dhcp_leases (ip, subnet, mac, state, expires_ms, hostname, \
    relay_circuit_id, relay_remote_id, giaddr, updated_ms) ";

const CLAIM_UPSERT: &str =
    " ON CONFLICT (ip) DO UPDATE SET subnet = excluded.subnet, mac = excluded.mac, \
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
    RETURNING ";

/// The rows a batch's statements wrote, for the store's lease view (applied once the
/// transaction committed).
pub(super) struct Written<'v> {
    pub(super) view: &'v LeaseView,
    /// Does the view hold every row (one process writes the table: SQLite)? On PostgreSQL it
    /// follows other instances' writes some time later, so it cannot prove a statement a no-op.
    pub(super) exact: bool,
    pub(super) rows: Vec<Lease>,
}

impl Written<'_> {
    /// Does the MAC of `l` have another row in its subnet that a claim of `l` expires? Only
    /// when the view is exact and it and this batch's own writes show none is the answer "no".
    pub(super) fn may_expire_others(&self, l: &Lease) -> bool {
        !self.exact
            || self
                .rows
                .iter()
                .any(|r| r.mac == l.mac && r.subnet == l.subnet && r.ip != l.ip)
            || self
                .view
                .has_others(&l.subnet, l.mac, l.ip, l.state == LeaseState::Bound)
    }
}

pub(super) fn ip_key(ip: Ipv4Addr) -> i64 {
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
        let size = size.min(MAX_BATCH);
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
async fn claim_run(
    conn: &mut Connection,
    claims: &[&Lease],
    written: &mut Written<'_>,
) -> Result<Vec<bool>, StoreError> {
    let mut sorted: Vec<&Lease> = claims.to_vec();
    sorted.sort_by_key(|l| l.ip);
    let mut granted: HashSet<i64> = HashSet::new();
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
        qb.push(LEASE_COLS);
        for r in &qb.build().fetch_all(&mut *conn).await? {
            let l = lease_row(r)?;
            granted.insert(ip_key(l.ip));
            written.rows.push(l);
        }
    }
    // The MACs granted here that may hold other rows to expire (with a view, most hold none and
    // the statement is skipped).
    let won: Vec<&Lease> = claims
        .iter()
        .copied()
        .filter(|l| granted.contains(&ip_key(l.ip)) && written.may_expire_others(l))
        .collect();
    let now = won.iter().map(|l| l.updated_ms).max().unwrap_or(0);
    for range in chunks(won.len()) {
        let part = &won[range];
        // VALUES columns are column1.. in both dialects: subnet, mac, the address kept,
        // and 1 when the claim binds.
        let mut qb =
            QueryBuilder::<Db>::new("UPDATE dhcp_leases SET state = 'expired', updated_ms = ");
        qb.push_bind(now);
        qb.push(" FROM (VALUES ");
        let mut sep = qb.separated(", ");
        for l in part {
            sep.push("(")
                .push_bind_unseparated(l.subnet.clone())
                .push_unseparated(", ");
            sep.push_bind_unseparated(l.mac.to_string())
                .push_unseparated(", ");
            sep.push_bind_unseparated(ip_key(l.ip))
                .push_unseparated(", ");
            sep.push_bind_unseparated(i64::from(l.state == LeaseState::Bound))
                .push_unseparated(")");
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
        qb.push(" RETURNING ");
        // Qualified: `FROM (VALUES ...)` has columns of its own.
        qb.push(QUALIFIED_COLS);
        for r in &qb.build().fetch_all(&mut *conn).await? {
            written.rows.push(lease_row(r)?);
        }
    }
    Ok(claims
        .iter()
        .map(|l| granted.contains(&ip_key(l.ip)))
        .collect())
}

/// `LEASE_COLS` of `dhcp_leases` by name, for a statement with another table in it.
const QUALIFIED_COLS: &str = "dhcp_leases.ip AS ip, dhcp_leases.subnet AS subnet, \
    dhcp_leases.mac AS mac, dhcp_leases.state AS state, dhcp_leases.expires_ms AS expires_ms, \
    dhcp_leases.hostname AS hostname, dhcp_leases.relay_circuit_id AS relay_circuit_id, \
    dhcp_leases.relay_remote_id AS relay_remote_id, dhcp_leases.giaddr AS giaddr, \
    dhcp_leases.updated_ms AS updated_ms";

/// End `ip`'s lease if `mac` holds it (one statement of the batch): whether it did.
pub(super) async fn end(
    conn: &mut Connection,
    (ip, mac, state, expires_ms, now_ms): (Ipv4Addr, MacAddr, LeaseState, i64, i64),
    written: &mut Written<'_>,
) -> Result<bool, StoreError> {
    let sql = format!(
        "UPDATE dhcp_leases SET state = $1, expires_ms = $2, updated_ms = $3 \
         WHERE ip = $4 AND mac = $5 RETURNING {LEASE_COLS}"
    );
    let q = sqlx::query(&sql)
        .bind(state.as_str())
        .bind(expires_ms)
        .bind(now_ms)
        .bind(ip_key(ip))
        .bind(mac.to_string());
    match q.fetch_optional(&mut *conn).await? {
        None => Ok(false),
        Some(r) => {
            written.rows.push(lease_row(&r)?);
            Ok(true)
        }
    }
}

/// Write the pending run of claims.
pub(super) async fn flush(
    conn: &mut Connection,
    run: &mut Vec<&Lease>,
    out: &mut Vec<bool>,
    written: &mut Written<'_>,
) -> Result<(), StoreError> {
    if !run.is_empty() {
        out.extend(claim_run(conn, run, written).await?);
        run.clear();
    }
    Ok(())
}

#[async_trait]
impl LeaseStore for Store {
    async fn claim_lease(&self, claim: &LeaseClaim) -> Result<bool, StoreError> {
        self.group_commit.write(WriteOp::Claim(claim.clone())).await
    }

    fn is_shared(&self) -> bool {
        <Store>::SHARED
    }

    async fn lease_by_ip(&self, ip: Ipv4Addr) -> Result<Option<Lease>, StoreError> {
        Ok(self.leases.by_ip(ip))
    }

    async fn lease_at(&self, ip: Ipv4Addr) -> Result<Option<Lease>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {LEASE_COLS} FROM dhcp_leases WHERE ip = $1"
        ))
        .bind(ip_key(ip))
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(lease_row).transpose()
    }

    async fn lease_by_mac(&self, subnet: &str, mac: MacAddr) -> Result<Option<Lease>, StoreError> {
        Ok(self.leases.newest(subnet, mac))
    }

    async fn end_lease(
        &self,
        ip: Ipv4Addr,
        mac: MacAddr,
        state: LeaseState,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.group_commit
            .write(WriteOp::End {
                ip,
                mac,
                state,
                expires_ms,
                now_ms,
            })
            .await
    }

    async fn busy_ips(&self, subnet: &str, now_ms: i64) -> Result<Vec<Ipv4Addr>, StoreError> {
        Ok(self.leases.busy(subnet, now_ms))
    }

    async fn leases_of_mac(&self, mac: MacAddr) -> Result<Vec<Lease>, StoreError> {
        // Not from the lease view: this is not on the DHCP path (config delivery's lease
        // binding, the console's switch port), and it must answer from the committed rows for
        // any process that opens the file, not only for the one whose group commit feeds the
        // view (a second process's view holds what was there when it opened).
        let rows = sqlx::query(&format!(
            "SELECT {LEASE_COLS} FROM dhcp_leases WHERE mac = $1 ORDER BY updated_ms DESC"
        ))
        .bind(mac.to_string())
        .fetch_all(&self.lease_read)
        .await?;
        rows.iter().map(lease_row).collect()
    }

    async fn reservation(&self, mac: MacAddr) -> Result<Option<Reservation>, StoreError> {
        let row = sqlx::query("SELECT machine_id, ipv4 FROM interfaces WHERE mac = $1")
            .bind(mac.to_string())
            .fetch_optional(&self.lease_read)
            .await?;
        let Some(r) = row else { return Ok(None) };
        let id: Uuid = r.try_get("machine_id")?;
        let ip: Option<String> = r.try_get("ipv4")?;
        Ok(Some(Reservation {
            machine_id: MachineId(id),
            ipv4: ip.and_then(|s| s.parse().ok()),
        }))
    }

    async fn owners(&self, macs: &[MacAddr]) -> Result<Vec<(MacAddr, MachineId)>, StoreError> {
        match self.inventory.owners(macs) {
            Some(found) => return Ok(found),
            None => self.refresh_inventory(),
        }
        let mut out = Vec::new();
        for part in macs.chunks(crate::store::CHUNK) {
            let mut qb =
                QueryBuilder::<Db>::new("SELECT mac, machine_id FROM interfaces WHERE mac IN (");
            let mut sep = qb.separated(", ");
            for mac in part {
                sep.push_bind(mac.to_string());
            }
            qb.push(")");
            for r in qb.build().fetch_all(&self.lease_read).await? {
                let mac: String = r.try_get("mac")?;
                let id: Uuid = r.try_get("machine_id")?;
                if let Ok(mac) = mac.parse() {
                    out.push((mac, MachineId(id)));
                }
            }
        }
        Ok(out)
    }

    async fn reserved_for_other(&self, ip: Ipv4Addr, mac: MacAddr) -> Result<bool, StoreError> {
        if let Some(facts) = self.inventory.facts(mac, [Some(ip), None]) {
            return Ok(!facts.reserved_for_other.is_empty());
        }
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM interfaces WHERE ipv4 = $1 AND mac <> $2")
                .bind(ip.to_string())
                .bind(mac.to_string())
                .fetch_one(&self.lease_read)
                .await?;
        Ok(n > 0)
    }

    async fn client_facts(
        &self,
        subnet: &str,
        mac: MacAddr,
        ips: [Option<Ipv4Addr>; 2],
    ) -> Result<ClientFacts, StoreError> {
        // With an inventory view that is current, no query at all; else the inventory is read
        // (and the view reloaded in the background). The lease always comes from the lease view.
        match self.inventory.facts(mac, ips) {
            Some(mut facts) => {
                facts.lease = self.leases.newest(subnet, mac);
                return Ok(facts);
            }
            None => self.refresh_inventory(),
        }
        let ip_text = |i: usize| ips[i].map(|ip| ip.to_string());
        let row = sqlx::query(INVENTORY_FACTS)
            .bind(mac.to_string())
            .bind(ip_text(0))
            .bind(ip_text(1))
            .fetch_one(&self.lease_read)
            .await?;
        let reserved: Option<String> = row.try_get("reserved_ip")?;
        let owner: Option<Uuid> = row.try_get("owner")?;
        let pin_relay: Option<String> = row.try_get("pin_relay")?;
        let mut facts = ClientFacts {
            reserved_ip: reserved.and_then(|s| s.parse().ok()),
            machine: owner.map(MachineId),
            // The hot path compares relay and circuit only; the rest is for `circuit_pin`.
            pin: match pin_relay {
                Some(relay) => Some(CircuitPin {
                    relay,
                    circuit_id: row.try_get("pin_circuit")?,
                    remote_id: None,
                    pinned_at: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
                    pinned_by: String::new(),
                }),
                None => None,
            },
            ..Default::default()
        };
        for (ip, col) in ips.iter().zip(["first_reserved", "second_reserved"]) {
            let n: i64 = row.try_get(col)?;
            if let (Some(ip), true) = (ip, n > 0) {
                facts.reserved_for_other.push(*ip);
            }
        }
        facts.lease = self.leases.newest(subnet, mac);
        Ok(facts)
    }

    async fn pin_circuit(
        &self,
        machine: MachineId,
        pin: &CircuitPin,
    ) -> Result<CircuitPin, StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO dhcp_circuit_pins (machine_id, relay, circuit_id, remote_id, pinned_at, pinned_by) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (machine_id) DO NOTHING",
        )
        .bind(machine.0)
        .bind(&pin.relay)
        .bind(&pin.circuit_id)
        .bind(&pin.remote_id)
        .bind(pin.pinned_at)
        .bind(&pin.pinned_by)
        .execute(&mut *tx)
        .await?;
        let row = sqlx::query(&format!(
            "SELECT {PIN_COLS} FROM dhcp_circuit_pins WHERE machine_id = $1"
        ))
        .bind(machine.0)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        pin_row(&row)
    }

    async fn circuit_pin(&self, machine: MachineId) -> Result<Option<CircuitPin>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {PIN_COLS} FROM dhcp_circuit_pins WHERE machine_id = $1"
        ))
        .bind(machine.0)
        .fetch_optional(&self.read)
        .await?;
        row.as_ref().map(pin_row).transpose()
    }

    async fn set_circuit_pin(
        &self,
        machine: MachineId,
        pin: Option<&CircuitPin>,
    ) -> Result<(), StoreError> {
        let (_turn, mut tx) = self.begin_write().await?;
        sqlx::query("DELETE FROM dhcp_circuit_pins WHERE machine_id = $1")
            .bind(machine.0)
            .execute(&mut *tx)
            .await?;
        if let Some(pin) = pin {
            sqlx::query(
                "INSERT INTO dhcp_circuit_pins (machine_id, relay, circuit_id, remote_id, pinned_at, pinned_by) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(machine.0)
            .bind(&pin.relay)
            .bind(&pin.circuit_id)
            .bind(&pin.remote_id)
            .bind(pin.pinned_at)
            .bind(&pin.pinned_by)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// What the inventory says about a MAC ($1) and two addresses ($2, $3): its reservation, its
/// machine and that machine's circuit pin, and whether each address is reserved for another MAC.
const INVENTORY_FACTS: &str = "SELECT (SELECT ipv4 FROM interfaces WHERE mac = $1) AS reserved_ip, \
     (SELECT machine_id FROM interfaces WHERE mac = $1) AS owner, \
     (SELECT p.relay FROM dhcp_circuit_pins p JOIN interfaces i ON i.machine_id = p.machine_id \
      WHERE i.mac = $1) AS pin_relay, \
     (SELECT p.circuit_id FROM dhcp_circuit_pins p JOIN interfaces i ON i.machine_id = p.machine_id \
      WHERE i.mac = $1) AS pin_circuit, \
     (SELECT COUNT(*) FROM interfaces WHERE ipv4 = $2 AND mac <> $1) AS first_reserved, \
     (SELECT COUNT(*) FROM interfaces WHERE ipv4 = $3 AND mac <> $1) AS second_reserved";

const PIN_COLS: &str = "relay, circuit_id, remote_id, pinned_at, pinned_by";

fn pin_row(r: &Row) -> Result<CircuitPin, StoreError> {
    Ok(CircuitPin {
        relay: r.try_get("relay")?,
        circuit_id: r.try_get("circuit_id")?,
        remote_id: r.try_get("remote_id")?,
        pinned_at: r.try_get("pinned_at")?,
        pinned_by: r.try_get("pinned_by")?,
    })
}

/// Has this database been migrated at all? A store opened without migrating (`plinth doctor`,
/// commands that only read) may meet one that was not, and then loads no view (they start empty).
pub(super) async fn migrated(pool: &sqlx::Pool<Db>) -> Result<bool, StoreError> {
    let tables: i64 = sqlx::query_scalar(super::MIGRATIONS_TABLE_EXISTS)
        .fetch_one(pool)
        .await?;
    Ok(tables > 0)
}

/// Every lease row (the lease view is loaded from it when the store opens).
pub(super) async fn all_leases(pool: &sqlx::Pool<Db>) -> Result<Vec<Lease>, StoreError> {
    let rows = sqlx::query(&format!("SELECT {LEASE_COLS} FROM dhcp_leases"))
        .fetch_all(pool)
        .await?;
    rows.iter().map(lease_row).collect()
}

/// Read every NIC and circuit pin into `view`, at the generation read first.
pub(super) async fn load_inventory(
    pool: &sqlx::Pool<Db>,
    view: &InventoryView,
) -> Result<(), StoreError> {
    use futures::TryStreamExt as _;
    let generation = view.generation();
    let started = std::time::Instant::now();
    // Row by row: each becomes its small `Nic` at once, never a whole result set of database rows
    // beside them (a reload of a 60,000-machine inventory during an import would otherwise hold
    // both, and an import's memory bound is measured with DHCP reloading the view meanwhile).
    let mut nics = Vec::new();
    let mut rows = sqlx::query("SELECT mac, machine_id, ipv4 FROM interfaces").fetch(pool);
    while let Some(r) = rows.try_next().await? {
        let mac: String = r.try_get("mac")?;
        // A MAC that does not parse matches no request's MAC.
        let Ok(mac) = mac.parse() else { continue };
        nics.push(Nic {
            mac,
            machine: MachineId(r.try_get("machine_id")?),
            ipv4: r.try_get("ipv4")?,
        });
    }
    drop(rows);
    let mut pins = Vec::new();
    for r in sqlx::query("SELECT machine_id, relay, circuit_id FROM dhcp_circuit_pins")
        .fetch_all(pool)
        .await?
    {
        pins.push(Pin {
            machine: MachineId(r.try_get("machine_id")?),
            relay: r.try_get("relay")?,
            circuit_id: r.try_get("circuit_id")?,
        });
    }
    view.load(generation, started, nics, pins);
    Ok(())
}

impl Store {
    /// The inventory view is stale: reload it in the background, unless a reload is under way
    /// or one started only a moment ago.
    fn refresh_inventory(&self) {
        if !self.inventory.claim_reload() {
            return;
        }
        let (read, view) = (self.read.clone(), self.inventory.clone());
        tokio::spawn(async move {
            if let Err(e) = load_inventory(&read, &view).await {
                tracing::warn!(error = %e, "inventory view not reloaded");
            }
            view.reloaded();
        });
    }
}
