//! Who is asking: a booting machine known by what its protocol tells (a MAC from DHCP or iPXE, an
//! SMBIOS UUID and serial from iPXE, only an address from TFTP and HTTP downloads), resolved to a
//! machine of the inventory, or registered as `discovered` when iPXE asks for an unknown one.
//!
//! MAC -> machine and address -> machine are remembered for a short while (unknown ones too), so
//! that a storm of unknown clients does not cost a database look-up per packet and a boot's TFTP
//! and HTTP steps (known by address only) do not cost two look-ups each. An ACK forgets what its
//! address meant before, so an address that passes to another machine is attributed to the new one
//! from its ACK on.
//!
//! Discovery is what an anonymous request can write, so it is bounded ([`DiscoveryLimits`]):
//! token buckets per source network (the /24 or /64 a request comes from: one rack's subnet
//! behind one relay) and for the whole server, and a ceiling on machines waiting in `discovered`.
//! A request past a bound registers nothing and is told to come back later; a flood of random MACs
//! makes a bounded number of rows.
//!
//! Imports `domain` and the rest of `service`; nothing from a front door or a store.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::domain::boot::is_placeholder;
use crate::domain::{
    Interface, LifecycleState, MacAddr, Machine, MachineId, MachineSpec, UniqueKey,
};
use crate::service::ports::{LeaseStore, MachineFilter, MachineStore, StoreError};
use crate::service::throttle::Buckets;
use crate::service::{Inventory, ServiceError};

/// What iPXE tells about the machine in the query string of `/boot/machine.ipxe`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct BootIdentity {
    /// Booting NIC's MAC (`${mac:hexhyp}` or colon form).
    pub mac: Option<String>,
    /// SMBIOS UUID.
    pub uuid: Option<String>,
    /// SMBIOS serial.
    pub serial: Option<String>,
    /// SMBIOS manufacturer.
    pub manufacturer: Option<String>,
    /// SMBIOS product.
    pub product: Option<String>,
    /// SMBIOS asset tag.
    pub asset: Option<String>,
    /// `i386`, `x86_64`, `arm64`.
    pub buildarch: Option<String>,
    /// `pcbios` or `efi`.
    pub platform: Option<String>,
}

impl BootIdentity {
    /// The booting NIC's MAC, when it parses.
    pub fn mac(&self) -> Option<MacAddr> {
        self.mac.as_deref().and_then(|m| m.trim().parse().ok())
    }

    /// The SMBIOS UUID, unless absent, unparsable, nil or all-ones (firmware placeholders).
    pub fn smbios_uuid(&self) -> Option<uuid::Uuid> {
        let u: uuid::Uuid = self.uuid.as_deref()?.trim().parse().ok()?;
        (!u.is_nil() && !u.is_max()).then_some(u)
    }
}

/// A SMBIOS text fact, unless it is a vendor placeholder; at most 255 characters.
fn fact(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !is_placeholder(s))
        .map(|s| s.chars().take(255).collect())
}

/// Key -> the machine it belonged to (or none) and when that was looked up.
type Remembered<K> = HashMap<K, (Option<MachineId>, Instant)>;

/// The remembered look-ups (see the module's paragraph).
#[derive(Default)]
struct Cache {
    by_mac: Remembered<MacAddr>,
    by_ip: Remembered<Ipv4Addr>,
}

/// How long a look-up is remembered.
const TTL: Duration = Duration::from_secs(10);
/// Entries per map at most: past it the map starts over (a flood of random MACs cannot grow it).
const MAX_ENTRIES: usize = 100_000;

fn fresh<K: Hash + Eq>(map: &Remembered<K>, key: &K) -> Option<Option<MachineId>> {
    map.get(key)
        .filter(|(_, at)| at.elapsed() < TTL)
        .map(|(id, _)| *id)
}

fn remember<K: Hash + Eq>(map: &mut Remembered<K>, key: K, id: Option<MachineId>) {
    if map.len() >= MAX_ENTRIES {
        map.clear();
    }
    map.insert(key, (id, Instant::now()));
}

/// Bounds on discovery (see the module's paragraph).
#[derive(Clone, Copy, Debug)]
pub struct DiscoveryLimits {
    /// Machines one source network may register at once.
    pub per_source_burst: f64,
    /// ... and per second after that.
    pub per_source_per_second: f64,
    /// Machines the whole server may register at once.
    pub burst: f64,
    /// ... and per second after that.
    pub per_second: f64,
    /// Machines in `discovered` at most: past it, none is registered until an operator triages.
    pub max_waiting: i64,
}

impl Default for DiscoveryLimits {
    fn default() -> Self {
        DiscoveryLimits {
            per_source_burst: 32.0,
            per_source_per_second: 1.0,
            burst: 128.0,
            per_second: 5.0,
            max_waiting: 2000,
        }
    }
}

/// The buckets of [`DiscoveryLimits`] and the count of what they refused.
struct Discovery {
    limits: DiscoveryLimits,
    per_source: Buckets,
    all: Buckets,
    refused: prometheus_client::metrics::counter::Counter,
}

impl Discovery {
    fn new(limits: DiscoveryLimits) -> Self {
        Discovery {
            per_source: Buckets::new(limits.per_source_per_second, limits.per_source_burst),
            all: Buckets::new(limits.per_second, limits.burst),
            limits,
            refused: Default::default(),
        }
    }
}

/// The network a request comes from, for the per-source bucket: its /24 (IPv4) or /64 (IPv6).
fn source_network(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & 0xffff_ff00)),
        IpAddr::V6(a) => IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(a) & !((1u128 << 64) - 1),
        )),
    }
}

/// Resolves booting clients to machines (see the module's paragraph).
#[derive(Clone)]
pub struct Identities {
    machines: Arc<dyn MachineStore>,
    leases: Arc<dyn LeaseStore>,
    cache: Arc<Mutex<Cache>>,
    known: Arc<std::sync::RwLock<HashSet<MacAddr>>>,
    discovery: Arc<Discovery>,
}

/// Machines read per page when the known MACs are refreshed.
const KNOWN_PAGE: u32 = 1000;
/// MACs remembered as known at most (the inventory's NICs; far above any site's).
const KNOWN_MAX: usize = 1_000_000;

impl Identities {
    /// Over the machines and leases ports, remembering nothing yet.
    pub fn new(machines: Arc<dyn MachineStore>, leases: Arc<dyn LeaseStore>) -> Self {
        Identities {
            machines,
            leases,
            cache: Arc::default(),
            known: Arc::default(),
            discovery: Arc::new(Discovery::new(DiscoveryLimits::default())),
        }
    }

    /// The same, with other bounds on discovery.
    pub fn with_discovery_limits(self, limits: DiscoveryLimits) -> Self {
        Identities {
            discovery: Arc::new(Discovery::new(limits)),
            ..self
        }
    }

    /// Register the count of refused discoveries.
    pub fn register(&self, metrics: &crate::metrics::Metrics) {
        metrics.register(
            "discoveries_refused",
            "Boot requests of unknown machines not registered: past a discovery bound",
            self.discovery.refused.clone(),
        );
    }

    /// May a request from `peer` register a machine now? Takes a token of its source network's
    /// bucket and of the server's, then counts the machines waiting in `discovered`.
    async fn may_discover(&self, peer: IpAddr) -> Result<bool, StoreError> {
        let d = &self.discovery;
        let admitted = d.per_source.take(&source_network(peer)) && d.all.take(&());
        if admitted {
            let waiting = self
                .machines
                .list_machines(&MachineFilter {
                    state: Some(LifecycleState::Discovered),
                    limit: 1,
                    ..Default::default()
                })
                .await?
                .total;
            if waiting < d.limits.max_waiting {
                return Ok(true);
            }
        }
        d.refused.inc();
        Ok(false)
    }

    /// Does the inventory know `mac`? In memory only (no I/O): read from the inventory by
    /// `refresh_known`, and learned as look-ups find machines. DHCP's flood guard lets known
    /// machines past the budget of unknown clients.
    pub fn is_known(&self, mac: MacAddr) -> bool {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&mac)
    }

    fn learn(&self, mac: MacAddr) {
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        if known.len() < KNOWN_MAX {
            known.insert(mac);
        }
    }

    /// Read every NIC MAC of the inventory (what `is_known` answers from), page by page.
    pub async fn refresh_known(&self) -> Result<usize, StoreError> {
        let mut all = HashSet::new();
        let every = MachineFilter {
            limit: KNOWN_PAGE,
            ..Default::default()
        };
        self.machines
            .visit_machines(&every, &mut |page| {
                for m in page {
                    all.extend(m.interfaces.iter().map(|i| i.mac));
                }
                all.len() < KNOWN_MAX
            })
            .await?;
        let n = all.len();
        *self.known.write().unwrap_or_else(|e| e.into_inner()) = all;
        Ok(n)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The machine that owns `mac`, if any.
    pub async fn machine_of_mac(&self, mac: MacAddr) -> Result<Option<MachineId>, StoreError> {
        if let Some(id) = fresh(&self.cache().by_mac, &mac) {
            return Ok(id);
        }
        let id = self
            .machines
            .find_machine(&UniqueKey::Mac(mac))
            .await?
            .map(|m| m.id);
        if id.is_some() {
            self.learn(mac);
        }
        remember(&mut self.cache().by_mac, mac, id);
        Ok(id)
    }

    /// Look up the owners of those of `macs` not remembered, in one query, and remember them:
    /// `machine_of_mac` then answers from memory. A storm of unknown clients costs one look-up
    /// per batch of the boot timeline, not one per MAC.
    pub async fn remember_owners(
        &self,
        macs: impl IntoIterator<Item = MacAddr>,
    ) -> Result<(), StoreError> {
        let missing: Vec<MacAddr> = {
            let cache = self.cache();
            let mut seen = HashSet::new();
            macs.into_iter()
                .filter(|m| fresh(&cache.by_mac, m).is_none() && seen.insert(*m))
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let found: HashMap<MacAddr, MachineId> =
            self.leases.owners(&missing).await?.into_iter().collect();
        for mac in found.keys() {
            self.learn(*mac);
        }
        let mut cache = self.cache();
        for mac in missing {
            remember(&mut cache.by_mac, mac, found.get(&mac).copied());
        }
        Ok(())
    }

    /// The machine at `ip`: the owner of the MAC its lease is bound to, else the machine that has
    /// it reserved.
    pub async fn machine_at(&self, ip: Ipv4Addr) -> Result<Option<MachineId>, StoreError> {
        if let Some(id) = fresh(&self.cache().by_ip, &ip) {
            return Ok(id);
        }
        let id = match self.leases.lease_at(ip).await? {
            Some(lease) => self.machine_of_mac(lease.mac).await?,
            None => self
                .machines
                .find_machine(&UniqueKey::Ipv4(ip))
                .await?
                .map(|m| m.id),
        };
        remember(&mut self.cache().by_ip, ip, id);
        Ok(id)
    }

    /// `ip` was just acknowledged to `mac`: whatever it meant before is forgotten.
    pub fn acknowledged(&self, ip: Ipv4Addr, mac: MacAddr) {
        let mut cache = self.cache();
        match fresh(&cache.by_mac, &mac) {
            Some(id) => remember(&mut cache.by_ip, ip, id),
            None => {
                cache.by_ip.remove(&ip);
            }
        }
    }

    /// A machine was registered with `mac`: it is no longer unknown.
    fn registered(&self, mac: MacAddr, id: MachineId) {
        self.learn(mac);
        remember(&mut self.cache().by_mac, mac, Some(id));
    }

    /// The machine behind an iPXE boot request from `peer` (by MAC, else by SMBIOS UUID), or a
    /// new one registered as `discovered` with the facts iPXE sent. The flag says it was just
    /// registered. `Ok(None)`: an unknown machine past a discovery bound (nothing registered).
    pub async fn find_or_discover(
        &self,
        inventory: &Inventory,
        mac: MacAddr,
        who: &BootIdentity,
        peer: IpAddr,
    ) -> Result<Option<(Machine, bool)>, ServiceError> {
        if let Some(m) = found(inventory.lookup(&UniqueKey::Mac(mac)).await)? {
            return Ok(Some((m, false)));
        }
        if let Some(u) = who.smbios_uuid() {
            if let Some(m) = found(inventory.lookup(&UniqueKey::SmbiosUuid(u)).await)? {
                return Ok(Some((m, false)));
            }
        }
        if !self.may_discover(peer).await? {
            tracing::debug!(%mac, %peer, "boot: discovery bound reached; unknown machine not registered");
            return Ok(None);
        }
        let full = MachineSpec {
            smbios_uuid: who.smbios_uuid(),
            serial: fact(&who.serial),
            asset_tag: fact(&who.asset),
            manufacturer: fact(&who.manufacturer),
            model: fact(&who.product),
            interfaces: vec![Interface {
                mac,
                ipv4: None,
                boot: true,
                name: None,
            }],
            ..Default::default()
        };
        let created = match inventory
            .create_in_state(full.clone(), LifecycleState::Discovered, "boot")
            .await
        {
            Ok(m) => (m, true),
            Err(ServiceError::Conflict(c)) if c.iter().any(|c| c.field.ends_with(".mac")) => {
                // Another request registered this MAC a moment ago.
                (inventory.lookup(&UniqueKey::Mac(mac)).await?, false)
            }
            Err(ServiceError::Conflict(c)) => {
                // A serial or asset tag that another machine holds: register without the disputed
                // facts and say so; an operator sorts it out.
                tracing::warn!(%mac, conflicts = ?c.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "discovered machine shares facts with a known one");
                let bare = MachineSpec {
                    serial: None,
                    asset_tag: None,
                    smbios_uuid: None,
                    ..full
                };
                (
                    inventory
                        .create_in_state(bare, LifecycleState::Discovered, "boot")
                        .await?,
                    true,
                )
            }
            Err(e) => return Err(e),
        };
        self.registered(mac, created.0.id);
        Ok(Some(created))
    }
}

/// `Ok(None)` for "no such machine"; a store fault stays an error (never taken for "unknown").
fn found(r: Result<Machine, ServiceError>) -> Result<Option<Machine>, ServiceError> {
    match r {
        Ok(m) => Ok(Some(m)),
        Err(ServiceError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_and_bad_uuids_are_no_facts() {
        let who = BootIdentity {
            uuid: Some("00000000-0000-0000-0000-000000000000".into()),
            serial: Some("To be filled by O.E.M.".into()),
            ..Default::default()
        };
        assert_eq!(who.smbios_uuid(), None);
        assert_eq!(fact(&who.serial), None);
        let who = BootIdentity {
            uuid: Some(" 4c4c4544-0042-3910-8048-b4c04f4d4e31 ".into()),
            mac: Some("52-54-00-aa-bb-01".into()),
            ..Default::default()
        };
        assert!(who.smbios_uuid().is_some());
        assert_eq!(
            who.mac().map(|m| m.to_string()),
            Some("52:54:00:aa:bb:01".into())
        );
        assert_eq!(fact(&Some("a".repeat(300))).map(|s| s.len()), Some(255));
    }

    #[test]
    fn sources_are_their_networks() {
        let n = |s: &str| source_network(s.parse().expect("ip")).to_string();
        assert_eq!(n("10.1.2.3"), "10.1.2.0");
        assert_eq!(n("10.1.2.250"), "10.1.2.0");
        assert_eq!(n("fd00:1:2:3:4:5:6:7"), "fd00:1:2:3::");
    }
}
