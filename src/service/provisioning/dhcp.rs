//! DHCP decisions (RFC 2131 section 4.3): given a decoded request, decide the answer, with leases
//! made durable before the answer exists. The whole decision is one `match` on (subnet mode,
//! message kind) in `DhcpService::handle`; the wire format lives in `crate::dhcp`, which asks
//! through `ProvisioningService::dhcp`.
//!
//! What is durable: every ACK's lease (committed before the ACK exists), every release and decline.
//! Offers are held in memory (RFC 2131 section 4.3.1 lets a server keep an offered address for the
//! client without recording it; a REQUEST reconfirms the address in the database, which then
//! decides), and when the lease table is shared by several instances (PostgreSQL) they are also
//! written to it, through the same group commit, so that no two instances offer one address. A
//! client's scan of the pool starts at a hash of its MAC (as dnsmasq does): concurrent clients, and
//! instances, rarely reach for the same address, and a returning client tends to get its old one.
//! A known machine's leases are pinned to the relay circuit first seen for it (`circuit`).

mod circuit;

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use crate::domain::dhcp::{select_subnet, BootAnswer, BootClient, BootFiles, Subnet, SubnetMode};
use crate::domain::MacAddr;
use crate::service::ports::{Lease, LeaseClaim, LeaseState, LeaseStore, StoreError};

/// Kind of a DHCP request (option 53).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// DHCPDISCOVER.
    Discover,
    /// DHCPREQUEST.
    Request,
    /// DHCPDECLINE.
    Decline,
    /// DHCPRELEASE.
    Release,
    /// DHCPINFORM.
    Inform,
}

/// A request, decoded and checked by the wire layer.
#[derive(Clone, Debug)]
pub struct DhcpRequest {
    /// Message type.
    pub kind: RequestKind,
    /// Client hardware address.
    pub mac: MacAddr,
    /// `ciaddr`.
    pub ciaddr: Ipv4Addr,
    /// `giaddr` (relay).
    pub giaddr: Ipv4Addr,
    /// Option 50.
    pub requested_ip: Option<Ipv4Addr>,
    /// Option 54.
    pub server_id: Option<Ipv4Addr>,
    /// Firmware class from options 93, 60, 77.
    pub client: BootClient,
    /// Option 12.
    pub hostname: Option<String>,
    /// Option 82 sub-option 1.
    pub circuit_id: Option<Vec<u8>>,
    /// Option 82 sub-option 2.
    pub remote_id: Option<Vec<u8>>,
    /// Arrived on the proxyDHCP port 4011.
    pub proxy_port: bool,
    /// Addresses of the interface it arrived on.
    pub local_ips: Vec<Ipv4Addr>,
    /// The interface it arrived on.
    pub interface: Option<String>,
    /// The datagram's source address (a relay agent's, or the client's own once it has one).
    pub source: Ipv4Addr,
    /// The inventory knows the client's MAC (new pool addresses for unknown clients are rationed).
    pub known: bool,
}

/// Kind of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplyKind {
    /// DHCPOFFER.
    Offer,
    /// DHCPACK.
    Ack,
    /// DHCPNAK.
    Nak,
}

/// An answer, to be encoded by the wire layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DhcpReply {
    /// Offer, ack or nak.
    pub kind: ReplyKind,
    /// `yiaddr` (0.0.0.0 for proxy answers, NAKs and INFORM acks).
    pub yiaddr: Ipv4Addr,
    /// Option 54 and `siaddr`.
    pub server_ip: Ipv4Addr,
    /// The subnet's options (absent on NAK).
    pub subnet: Option<Arc<Subnet>>,
    /// Option 51 (absent for INFORM, proxy, NAK).
    pub lease_seconds: Option<u32>,
    /// Boot file for network-booting clients.
    pub boot: Option<BootAnswer>,
    /// Echo option 60 `PXEClient` (proxyDHCP answers).
    pub pxe_vendor: bool,
    /// iPXE option 175.176 (no-pxedhcp): do not wait for proxy offers.
    pub no_pxedhcp: bool,
    /// Option 56 on NAKs.
    pub message: Option<String>,
    /// When the lease this answer gives was committed (ACKs; offers too on a shared database):
    /// for the front door's latency metrics.
    pub committed: Option<std::time::Instant>,
}

/// The outcome for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send this.
    Reply(DhcpReply),
    /// Stay silent; the reason is counted.
    Silent(&'static str),
}

/// Lease timing.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTiming {
    /// How long an offer holds its address, ms.
    pub offer_ms: i64,
    /// How long a declined address is quarantined, ms.
    pub decline_ms: i64,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            offer_ms: 60_000,
            decline_ms: 3_600_000,
        }
    }
}

/// Why an address is taken in the hint.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// Until when, Unix ms.
    until: i64,
    /// Offered (pending) to this MAC; `None` for a lease learnt from the database.
    offer_to: Option<MacAddr>,
}

/// In-memory view of a subnet's pool: which addresses are taken and the pending offers. Only a
/// hint for leases (the database's conditional upsert decides, and a refused claim refreshes it);
/// the only record of offers on an unshared store.
#[derive(Default)]
struct PoolHint {
    busy: HashMap<Ipv4Addr, Hold>,
    /// Pending offers by client.
    offers: HashMap<MacAddr, Ipv4Addr>,
    /// Prune expired offers when `offers` grows past this.
    prune_at: usize,
    loaded: bool,
}

impl PoolHint {
    fn taken(&self, ip: Ipv4Addr, now: i64) -> bool {
        self.busy.get(&ip).is_some_and(|h| h.until >= now)
    }

    /// Pending (unexpired) offer of `ip` to a MAC other than `mac`?
    fn offered_to_other(&self, ip: Ipv4Addr, mac: MacAddr, now: i64) -> bool {
        self.busy
            .get(&ip)
            .is_some_and(|h| h.until >= now && h.offer_to.is_some_and(|m| m != mac))
    }

    /// Forget `mac`'s pending offer; the address it held.
    fn drop_offer(&mut self, mac: MacAddr) -> Option<Ipv4Addr> {
        let ip = self.offers.remove(&mac)?;
        if self.busy.get(&ip).is_some_and(|h| h.offer_to == Some(mac)) {
            self.busy.remove(&ip);
        }
        Some(ip)
    }

    /// `next_free` picked `ip` for `mac`: hold it briefly, as `mac`'s pending offer, so that a
    /// concurrent DISCOVER of another client picks another address and a duplicate DISCOVER of
    /// the same client (a retransmission racing the first) is offered the same one.
    fn record_pick(&mut self, mac: MacAddr, ip: Ipv4Addr, until: i64) {
        if self.offers.get(&mac).is_some_and(|old| *old != ip) {
            self.drop_offer(mac);
        }
        self.offers.insert(mac, ip);
        self.busy.insert(
            ip,
            Hold {
                until,
                offer_to: Some(mac),
            },
        );
    }

    /// Undo `record_pick` when `ip` was not offered to `mac` after all.
    fn release_pick(&mut self, ip: Ipv4Addr, mac: MacAddr) {
        if self.offers.get(&mac) == Some(&ip) {
            self.drop_offer(mac);
        } else if self.busy.get(&ip).is_some_and(|h| h.offer_to == Some(mac)) {
            self.busy.remove(&ip);
        }
    }

    fn record_offer(&mut self, mac: MacAddr, ip: Ipv4Addr, until: i64, now: i64) {
        if self.offers.get(&mac).is_some_and(|old| *old != ip) {
            self.drop_offer(mac);
        }
        self.offers.insert(mac, ip);
        let h = self.busy.entry(ip).or_insert(Hold {
            until,
            offer_to: Some(mac),
        });
        // An address this MAC holds longer (its bound lease) keeps its longer hold.
        if h.until < until || h.offer_to.is_some() {
            *h = Hold {
                until: h.until.max(until),
                offer_to: Some(mac),
            };
        }
        if self.offers.len() > self.prune_at {
            let busy = &self.busy;
            self.offers.retain(|m, ip| {
                busy.get(ip)
                    .is_some_and(|h| h.until >= now && h.offer_to == Some(*m))
            });
            self.prune_at = (self.offers.len() * 2).max(1024);
        }
    }
}

/// Where a MAC's scan of a pool of `size` addresses starts: a 64-bit mix (SplitMix64's finaliser)
/// of the MAC, so neighbouring MACs land far apart.
fn scan_start(mac: MacAddr, size: usize) -> usize {
    let o = mac.octets();
    let mut x = u64::from_be_bytes([0, 0, o[0], o[1], o[2], o[3], o[4], o[5]]);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x % size.max(1) as u64) as usize
}

/// May `mac` claim the address of lease `l` at `now`? The same rule as the claim's upsert.
fn reusable(l: &Lease, mac: MacAddr, now: i64) -> bool {
    (l.mac == mac && l.state != LeaseState::Declined)
        || l.expires_ms < now
        || matches!(l.state, LeaseState::Released | LeaseState::Expired)
}

/// Addresses held by clients the inventory does not know, and by relay circuits, per subnet: the
/// quotas that keep a flood of made-up MACs (or one switch port) from taking the whole pool. In
/// memory, per instance (instances sharing PostgreSQL each keep their own share). Counted as the
/// holds change, so a check costs the same with a thousand holds as with one (it scanned every
/// hold, twice, for each offer and ACK).
#[derive(Default)]
struct Quota {
    /// Address -> (holder, until (Unix ms), relay circuit).
    holds: HashMap<Ipv4Addr, (MacAddr, i64, Option<String>)>,
    /// Each holder's addresses.
    by_mac: HashMap<MacAddr, Vec<Ipv4Addr>>,
    /// Holds per relay circuit.
    per_circuit: HashMap<String, usize>,
    /// (until, address) of every hold, soonest first; entries of holds since changed are skipped.
    expiry: std::collections::BinaryHeap<std::cmp::Reverse<(i64, Ipv4Addr)>>,
}

impl Quota {
    fn remove(&mut self, ip: Ipv4Addr) {
        let Some((mac, _, circuit)) = self.holds.remove(&ip) else {
            return;
        };
        if let Some(ips) = self.by_mac.get_mut(&mac) {
            ips.retain(|i| *i != ip);
            if ips.is_empty() {
                self.by_mac.remove(&mac);
            }
        }
        if let Some(c) = circuit {
            if let Some(n) = self.per_circuit.get_mut(&c) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.per_circuit.remove(&c);
                }
            }
        }
    }

    fn insert(&mut self, ip: Ipv4Addr, mac: MacAddr, until: i64, circuit: Option<String>) {
        self.remove(ip);
        self.by_mac.entry(mac).or_default().push(ip);
        if let Some(c) = &circuit {
            *self.per_circuit.entry(c.clone()).or_default() += 1;
        }
        self.holds.insert(ip, (mac, until, circuit));
        self.expiry.push(std::cmp::Reverse((until, ip)));
        // Refreshed holds leave their old entries behind: start over when they outnumber the rest.
        if self.expiry.len() > 2 * self.holds.len() + 1024 {
            self.expiry = self
                .holds
                .iter()
                .map(|(ip, (_, until, _))| std::cmp::Reverse((*until, *ip)))
                .collect();
        }
    }

    /// Drop the holds that ended before `now`.
    fn prune(&mut self, now: i64) {
        while let Some(std::cmp::Reverse((until, ip))) = self.expiry.peek().copied() {
            if until >= now {
                break;
            }
            self.expiry.pop();
            if self.holds.get(&ip).is_some_and(|(_, u, _)| *u == until) {
                self.remove(ip);
            }
        }
    }

    /// Holds of holders other than `mac`: in all, and on `circuit`.
    fn of_others(&self, mac: MacAddr, circuit: Option<&String>) -> (usize, usize) {
        let own = self.by_mac.get(&mac).map_or(&[][..], |v| &v[..]);
        let all = self.holds.len() - own.len();
        let on_circuit = circuit.map_or(0, |c| {
            let own_there = own
                .iter()
                .filter(|ip| {
                    self.holds
                        .get(ip)
                        .is_some_and(|(_, _, held)| held.as_ref() == Some(c))
                })
                .count();
            self.per_circuit.get(c).copied().unwrap_or(0) - own_there
        });
        (all, on_circuit)
    }
}

/// Why a new address was not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OverQuota {
    /// Unknown clients hold their share of the pool.
    Unknown,
    /// This relay circuit holds its leases.
    Circuit,
}

impl OverQuota {
    fn reason(self) -> &'static str {
        match self {
            OverQuota::Unknown => "quota_unknown_clients",
            OverQuota::Circuit => "quota_relay_circuit",
        }
    }
}

/// DHCP use cases.
pub struct DhcpService {
    /// By subnet (its network: a key that costs no formatting per request, as the lease
    /// table's text key did: callgrind put `Ipv4Net`'s Display at 4% of a DORA's instructions).
    quotas: Mutex<HashMap<ipnet::Ipv4Net, Quota>>,
    store: Arc<dyn LeaseStore>,
    subnets: Vec<Arc<Subnet>>,
    boot: BootFiles,
    timing: LeaseTiming,
    pools: Mutex<HashMap<ipnet::Ipv4Net, PoolHint>>,
    /// One decision at a time per client (striped by MAC): a retransmitted DISCOVER waits for the
    /// first and is offered the same address, instead of racing it to a second one.
    clients: Vec<tokio::sync::Mutex<()>>,
    /// Where relay-circuit pins and mismatches are reported (`circuit`).
    timeline: Option<super::timeline::Timeline>,
}

/// Stripes of `DhcpService::clients`.
const CLIENT_STRIPES: usize = 256;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn hex(b: &Option<Vec<u8>>) -> Option<String> {
    b.as_ref().map(hex::encode)
}

/// How long after its ACK a lease may be declined: a client declines right after the ACK, when its
/// ARP probe finds the address taken (RFC 2131 section 2.2), not an hour later.
const DECLINE_WINDOW_MS: i64 = 120_000;

/// How many pool addresses one DISCOVER may try before giving up.
const MAX_TRIES: usize = 64;

impl DhcpService {
    /// A service for `subnets`, pointing clients at `boot`.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        subnets: Vec<Subnet>,
        boot: BootFiles,
        timing: LeaseTiming,
    ) -> Self {
        Self {
            quotas: Mutex::default(),
            store,
            subnets: subnets.into_iter().map(Arc::new).collect(),
            boot,
            timing,
            pools: Mutex::new(HashMap::new()),
            clients: (0..CLIENT_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            timeline: None,
        }
    }

    /// Report relay-circuit pins and mismatches on the boot timeline.
    pub fn with_timeline(mut self, timeline: super::timeline::Timeline) -> Self {
        self.timeline = Some(timeline);
        self
    }

    /// The configured subnets.
    pub fn subnets(&self) -> &[Arc<Subnet>] {
        &self.subnets
    }

    /// How full each subnet's dynamic pool is now: (subnet, pool addresses, addresses held by
    /// a live lease or offer inside the pool).
    pub async fn pool_use(&self) -> Result<Vec<(Arc<Subnet>, u64, u64)>, StoreError> {
        let mut out = Vec::with_capacity(self.subnets.len());
        for subnet in &self.subnets {
            let size: u64 = subnet.pool.iter().map(|r| r.len()).sum();
            let busy = self.store.busy_ips(&subnet.key(), now_ms()).await?;
            let used = busy
                .iter()
                .filter(|ip| subnet.pool.iter().any(|r| r.contains(**ip)))
                .count() as u64;
            out.push((subnet.clone(), size, used));
        }
        Ok(out)
    }

    /// Decide the answer to one request.
    pub async fn handle(&self, req: &DhcpRequest) -> Result<Outcome, StoreError> {
        let subnet = match select_subnet(
            &self.subnets,
            req.giaddr,
            req.ciaddr,
            &req.local_ips,
            req.source,
        ) {
            Ok(s) => s,
            Err(why) => return Ok(Outcome::Silent(why.reason())),
        };
        let _client = match self.clients.get(scan_start(req.mac, CLIENT_STRIPES)) {
            Some(stripe) => Some(stripe.lock().await),
            None => None,
        };
        use RequestKind::*;
        use SubnetMode::*;
        match (subnet.mode, req.kind) {
            (Off, _) => Ok(Outcome::Silent("subnet_off")),
            (_, _) if req.proxy_port => Ok(self.proxy(req, subnet, ReplyKind::Ack)),
            (Proxy, Discover) => Ok(self.proxy(req, subnet, ReplyKind::Offer)),
            (Proxy, _) => Ok(Outcome::Silent("proxy_not_ours")),
            (Authoritative, Discover) => self.offer(req, subnet).await,
            (Authoritative, Request) => self.request(req, subnet).await,
            (Authoritative, Decline) => self.decline(req, subnet).await,
            (Authoritative, Release) => self.release(req, subnet).await,
            (Authoritative, Inform) => Ok(self.inform(req, subnet)),
        }
    }

    /// May `req`'s client take `ip` until `until`? Known clients of unrelayed requests always
    /// may; unknown clients up to their share of the pool, relayed ones up to their circuit's
    /// leases. A `true` records the hold.
    fn within_quota(
        &self,
        req: &DhcpRequest,
        subnet: &Arc<Subnet>,
        ip: Ipv4Addr,
        until: i64,
    ) -> Result<(), OverQuota> {
        let circuit = subnet
            .relay_agents
            .contains(&req.source)
            .then(|| hex(&req.circuit_id))
            .flatten();
        let Ok(mut quotas) = self.quotas.lock() else {
            return Ok(());
        };
        let q = quotas.entry(subnet.net).or_default();
        if req.known && circuit.is_none() {
            // A client the inventory knows now (discovered since) no longer counts as unknown.
            if q.holds.get(&ip).is_some_and(|(mac, _, _)| *mac == req.mac) {
                q.remove(ip);
            }
            return Ok(());
        }
        if q.holds.get(&ip).is_some_and(|(mac, _, _)| *mac == req.mac) {
            q.insert(ip, req.mac, until, circuit);
            return Ok(());
        }
        q.prune(now_ms());
        let (others, on_circuit) = q.of_others(req.mac, circuit.as_ref());
        if !req.known {
            let pool: u64 = subnet.pool.iter().map(|r| r.len()).sum();
            let share = (pool * u64::from(subnet.unknown_permille) / 1000).max(1) as usize;
            if others >= share {
                return Err(OverQuota::Unknown);
            }
        }
        if circuit.is_some() && on_circuit >= subnet.leases_per_circuit as usize {
            return Err(OverQuota::Circuit);
        }
        q.insert(ip, req.mac, until, circuit);
        Ok(())
    }

    /// `ip` is free again.
    fn forget_hold(&self, subnet: &Arc<Subnet>, ip: Ipv4Addr) {
        if let Ok(mut quotas) = self.quotas.lock() {
            if let Some(q) = quotas.get_mut(&subnet.net) {
                q.remove(ip);
            }
        }
    }

    fn reply(
        &self,
        req: &DhcpRequest,
        subnet: &Arc<Subnet>,
        kind: ReplyKind,
        yiaddr: Ipv4Addr,
        lease: bool,
    ) -> DhcpReply {
        let boot = self.boot.answer(req.client);
        DhcpReply {
            kind,
            yiaddr,
            server_ip: subnet.server_ip,
            subnet: Some(subnet.clone()),
            lease_seconds: lease.then_some(subnet.lease_seconds),
            no_pxedhcp: boot.is_some() && subnet.mode == SubnetMode::Authoritative,
            boot,
            pxe_vendor: false,
            message: None,
            committed: None,
        }
    }

    fn nak(&self, subnet: &Arc<Subnet>, why: &str) -> Outcome {
        Outcome::Reply(DhcpReply {
            kind: ReplyKind::Nak,
            yiaddr: Ipv4Addr::UNSPECIFIED,
            server_ip: subnet.server_ip,
            subnet: None,
            lease_seconds: None,
            boot: None,
            pxe_vendor: false,
            no_pxedhcp: false,
            message: Some(why.to_string()),
            committed: None,
        })
    }

    /// proxyDHCP (PXE specification 2.1): boot information only, never an address.
    fn proxy(&self, req: &DhcpRequest, subnet: &Arc<Subnet>, kind: ReplyKind) -> Outcome {
        if req.client == BootClient::Plain {
            return Outcome::Silent("proxy_not_pxe");
        }
        let mut r = self.reply(req, subnet, kind, Ipv4Addr::UNSPECIFIED, false);
        r.pxe_vendor = true;
        r.no_pxedhcp = false;
        Outcome::Reply(r)
    }

    fn lease(
        &self,
        req: &DhcpRequest,
        subnet: &Arc<Subnet>,
        ip: Ipv4Addr,
        state: LeaseState,
        ms: i64,
    ) -> LeaseClaim {
        let now = now_ms();
        let relayed = subnet.relay_agents.contains(&req.source);
        LeaseClaim {
            lease: Lease {
                ip,
                subnet: subnet.key(),
                mac: req.mac,
                state,
                expires_ms: now + ms,
                hostname: req.hostname.clone(),
                // Option 82 is the relay agent's (RFC 3046): kept only from a configured agent.
                relay_circuit_id: relayed.then(|| hex(&req.circuit_id)).flatten(),
                relay_remote_id: relayed.then(|| hex(&req.remote_id)).flatten(),
                giaddr: (!req.giaddr.is_unspecified()).then(|| req.giaddr.to_string()),
                updated_ms: now,
            },
        }
    }

    /// Hold `ip` for the client's offer; the OFFER when it could. In memory, and in the database
    /// too when other instances share it (the conditional upsert then refuses an address another
    /// instance holds). `check` reads the address's lease first on an unshared store (for
    /// addresses not from this service's own pool hint).
    async fn hold_offer(
        &self,
        req: &DhcpRequest,
        subnet: &Arc<Subnet>,
        ip: Ipv4Addr,
        check: bool,
    ) -> Result<Option<Outcome>, StoreError> {
        let now = now_ms();
        if self
            .with_hint(subnet, |h| h.offered_to_other(ip, req.mac, now))
            .unwrap_or(false)
        {
            return Ok(None);
        }
        let mut committed = None;
        if self.store.is_shared() {
            let claim = self.lease(req, subnet, ip, LeaseState::Offered, self.timing.offer_ms);
            if !self.store.claim_lease(&claim).await? {
                return Ok(None);
            }
            committed = Some(std::time::Instant::now());
        } else if check {
            if let Some(l) = self.store.lease_by_ip(ip).await? {
                if !reusable(&l, req.mac, now) {
                    return Ok(None);
                }
            }
        }
        let until = now_ms() + self.timing.offer_ms;
        if let Err(over) = self.within_quota(req, subnet, ip, until) {
            return Ok(Some(Outcome::Silent(over.reason())));
        }
        self.with_hint(subnet, |h| h.record_offer(req.mac, ip, until, now));
        let mut offer = self.reply(req, subnet, ReplyKind::Offer, ip, true);
        offer.committed = committed;
        Ok(Some(Outcome::Reply(offer)))
    }

    async fn offer(&self, req: &DhcpRequest, subnet: &Arc<Subnet>) -> Result<Outcome, StoreError> {
        let in_pool = |ip: &Ipv4Addr| subnet.in_pool(*ip);
        let pending = self
            .with_hint(subnet, |h| h.offers.get(&req.mac).copied())
            .flatten()
            .filter(in_pool);
        // A fresh client's address is picked from the hint before the lookup, so that the one
        // query of this DISCOVER also checks it against the inventory's reservations.
        let scanned = match pending {
            Some(_) => None,
            None => self.next_free(subnet, req.mac).await?,
        };
        let asked = req.requested_ip.filter(in_pool);
        let looked_up = [pending.or(scanned), asked];
        let facts = self
            .store
            .client_facts(&subnet.key(), req.mac, looked_up)
            .await?;
        if let Some(refused) = self.circuit_check(req, subnet, &facts, false).await? {
            return Ok(refused);
        }
        // Its reservation or current lease first, then its pending offer, then the address it asks
        // for (option 50), then the pool; an address reserved for another machine is never
        // offered, asked for or not. `true`: read the address's lease before offering it.
        let mut candidates: Vec<(Ipv4Addr, bool)> = Vec::new();
        let reserved = facts.reserved_ip.filter(|ip| subnet.is_host(*ip));
        if let Some(ip) = reserved {
            candidates.push((ip, true));
        } else if let Some(ip) = facts.lease.as_ref().map(|l| l.ip).filter(in_pool) {
            candidates.push((ip, false));
        }
        candidates.extend(pending.map(|ip| (ip, false)));
        candidates.extend(asked.map(|ip| (ip, true)));
        candidates.extend(scanned.map(|ip| (ip, false)));
        let mut tried: Vec<Ipv4Addr> = Vec::new();
        let mut outcome = None;
        for (ip, check) in candidates {
            if tried.contains(&ip) {
                continue;
            }
            tried.push(ip);
            // Inventory addresses are unique: the MAC's own reservation is nobody else's.
            let for_other = if Some(ip) == reserved {
                false
            } else if looked_up.contains(&Some(ip)) {
                facts.reserved_for_other.contains(&ip)
            } else {
                self.store.reserved_for_other(ip, req.mac).await?
            };
            if for_other {
                if Some(ip) == scanned {
                    self.mark(subnet, ip, i64::MAX);
                }
                continue;
            }
            if let Some(offer) = self.hold_offer(req, subnet, ip, check).await? {
                outcome = Some((ip, offer));
                break;
            }
            if Some(ip) == scanned {
                self.learn(subnet, ip).await?;
            }
        }
        if let Some(ip) = scanned.filter(|s| outcome.as_ref().is_none_or(|(ip, _)| ip != s)) {
            // Picked but not offered: let the next client have it.
            self.with_hint(subnet, |h| h.release_pick(ip, req.mac));
        }
        if let Some((_, offer)) = outcome {
            return Ok(offer);
        }
        let mut reloaded = false;
        for _ in 0..MAX_TRIES {
            let ip = match self.next_free(subnet, req.mac).await? {
                Some(ip) => ip,
                // The hint may be stale (a release, another instance): ask the database once.
                None if !reloaded => {
                    reloaded = true;
                    self.reload(subnet).await?;
                    match self.next_free(subnet, req.mac).await? {
                        Some(ip) => ip,
                        None => return Ok(Outcome::Silent("pool_exhausted")),
                    }
                }
                None => return Ok(Outcome::Silent("pool_exhausted")),
            };
            if self.store.reserved_for_other(ip, req.mac).await? {
                self.mark(subnet, ip, i64::MAX);
                continue;
            }
            if let Some(offer) = self.hold_offer(req, subnet, ip, false).await? {
                return Ok(offer);
            }
            self.learn(subnet, ip).await?;
        }
        Ok(Outcome::Silent("pool_contended"))
    }

    /// Someone else (another instance, another client) holds `ip`: learn from the database when
    /// it frees up.
    async fn learn(&self, subnet: &Arc<Subnet>, ip: Ipv4Addr) -> Result<(), StoreError> {
        let until = self
            .store
            .lease_by_ip(ip)
            .await?
            .map_or(now_ms() + self.timing.offer_ms, |l| l.expires_ms);
        self.mark(subnet, ip, until);
        Ok(())
    }

    async fn request(
        &self,
        req: &DhcpRequest,
        subnet: &Arc<Subnet>,
    ) -> Result<Outcome, StoreError> {
        if let Some(sid) = req.server_id {
            if sid != subnet.server_ip {
                // SELECTING another server's offer: free ours (RFC 2131 section 4.3.2).
                self.with_hint(subnet, |h| h.drop_offer(req.mac));
                if let Some(l) = self.store.lease_by_mac(&subnet.key(), req.mac).await? {
                    if l.state == LeaseState::Offered {
                        self.store
                            .end_lease(l.ip, req.mac, LeaseState::Expired, now_ms(), now_ms())
                            .await?;
                        self.mark(subnet, l.ip, 0);
                    }
                }
                return Ok(Outcome::Silent("chose_other_server"));
            }
        }
        let ip = match (req.requested_ip, req.ciaddr.is_unspecified()) {
            (Some(ip), _) => ip,
            (None, false) => req.ciaddr,
            (None, true) => return Ok(Outcome::Silent("request_without_address")),
        };
        if !subnet.is_host(ip) {
            return Ok(self.nak(subnet, "address is not on this network"));
        }
        let facts = self
            .store
            .client_facts(&subnet.key(), req.mac, [Some(ip), None])
            .await?;
        if let Some(refused) = self.circuit_check(req, subnet, &facts, true).await? {
            self.with_hint(subnet, |h| h.drop_offer(req.mac));
            return Ok(refused);
        }
        if let Some(rip) = facts.reserved_ip.filter(|ip| subnet.is_host(*ip)) {
            if rip != ip {
                self.with_hint(subnet, |h| h.drop_offer(req.mac));
                return Ok(self.nak(subnet, "this machine has another reserved address"));
            }
        } else if !subnet.in_pool(ip) {
            return Ok(self.nak(subnet, "address is not in this server's pool"));
        }
        if facts.reserved_for_other.contains(&ip) {
            self.with_hint(subnet, |h| h.drop_offer(req.mac));
            return Ok(self.nak(subnet, "address is reserved for another machine"));
        }
        // An address this instance is offering to another client is not taken from under it. On
        // a shared store that offer is a row and the claim below refuses it; on an unshared one
        // it lives only here.
        let now = now_ms();
        if !self.store.is_shared()
            && self
                .with_hint(subnet, |h| h.offered_to_other(ip, req.mac, now))
                .unwrap_or(false)
        {
            self.with_hint(subnet, |h| h.drop_offer(req.mac));
            return Ok(self.nak(subnet, "address is offered to another client"));
        }
        // The database decides, whatever this instance offered: an address another MAC holds is
        // refused by the conditional upsert, a free one is bound.
        let ms = i64::from(subnet.lease_seconds) * 1000;
        if facts.reserved_ip != Some(ip) {
            if let Err(over) = self.within_quota(req, subnet, ip, now + ms) {
                self.with_hint(subnet, |h| h.drop_offer(req.mac));
                return Ok(Outcome::Silent(over.reason()));
            }
        }
        let bound = self
            .store
            .claim_lease(&self.lease(req, subnet, ip, LeaseState::Bound, ms))
            .await?;
        let committed = std::time::Instant::now();
        self.with_hint(subnet, |h| h.drop_offer(req.mac));
        if !bound {
            self.learn(subnet, ip).await?;
            return Ok(self.nak(subnet, "address is in use"));
        }
        self.mark(subnet, ip, now_ms() + ms);
        let mut ack = self.reply(req, subnet, ReplyKind::Ack, ip, true);
        ack.committed = Some(committed);
        Ok(Outcome::Reply(ack))
    }

    async fn decline(
        &self,
        req: &DhcpRequest,
        subnet: &Arc<Subnet>,
    ) -> Result<Outcome, StoreError> {
        let Some(ip) = req.requested_ip else {
            return Ok(Outcome::Silent("decline_without_address"));
        };
        // RFC 2131 section 4.4.4: a client declines an address it was just given, before using
        // it (so from 0.0.0.0): only the MAC the lease is bound to, and only a fresh lease.
        if req.giaddr.is_unspecified() && !req.source.is_unspecified() {
            return Ok(Outcome::Silent("decline_not_from_client"));
        }
        match self.store.lease_by_ip(ip).await? {
            Some(l)
                if l.mac == req.mac
                    && l.state == LeaseState::Bound
                    && now_ms() - l.updated_ms <= DECLINE_WINDOW_MS => {}
            _ => return Ok(Outcome::Silent("decline_not_of_a_fresh_lease")),
        }
        let until = now_ms() + self.timing.decline_ms;
        if self
            .store
            .end_lease(ip, req.mac, LeaseState::Declined, until, now_ms())
            .await?
        {
            self.mark(subnet, ip, until);
            self.forget_hold(subnet, ip);
            tracing::warn!(%ip, mac = %req.mac, "address declined by client: quarantined");
        }
        Ok(Outcome::Silent("declined"))
    }

    async fn release(
        &self,
        req: &DhcpRequest,
        subnet: &Arc<Subnet>,
    ) -> Result<Outcome, StoreError> {
        // RFC 2131 section 4.4.6: the client unicasts its RELEASE from the address it releases.
        // One that comes from elsewhere (a broadcast, a spoofed chaddr on another address) would
        // free somebody else's lease.
        if req.giaddr.is_unspecified() && req.source != req.ciaddr {
            return Ok(Outcome::Silent("release_not_from_lease_address"));
        }
        if !req.ciaddr.is_unspecified() {
            let now = now_ms();
            if self
                .store
                .end_lease(req.ciaddr, req.mac, LeaseState::Released, now, now)
                .await?
            {
                self.mark(subnet, req.ciaddr, 0);
                self.forget_hold(subnet, req.ciaddr);
            }
        }
        Ok(Outcome::Silent("released"))
    }

    fn inform(&self, req: &DhcpRequest, subnet: &Arc<Subnet>) -> Outcome {
        // RFC 2131 section 3.4: configuration only; no yiaddr, no lease time.
        Outcome::Reply(self.reply(req, subnet, ReplyKind::Ack, Ipv4Addr::UNSPECIFIED, false))
    }

    /// Run `f` on a subnet's hint (None if the lock is poisoned).
    fn with_hint<T>(&self, subnet: &Arc<Subnet>, f: impl FnOnce(&mut PoolHint) -> T) -> Option<T> {
        let mut pools = self.pools.lock().ok()?;
        Some(f(pools.entry(subnet.net).or_default()))
    }

    /// Replace a subnet's leases in the hint with what the database holds now; pending offers stay.
    async fn reload(&self, subnet: &Arc<Subnet>) -> Result<(), StoreError> {
        let busy = self.store.busy_ips(&subnet.key(), now_ms()).await?;
        let now = now_ms();
        let until = now + self.timing.offer_ms;
        self.with_hint(subnet, |h| {
            h.busy
                .retain(|_, hold| hold.offer_to.is_some() && hold.until >= now);
            for ip in busy {
                h.busy.entry(ip).or_insert(Hold {
                    until,
                    offer_to: None,
                });
            }
            h.loaded = true;
        });
        Ok(())
    }

    /// Mark `ip` taken until `until` (0: free) in the hint, as a lease.
    fn mark(&self, subnet: &Arc<Subnet>, ip: Ipv4Addr, until: i64) {
        self.with_hint(subnet, |h| {
            h.busy.insert(
                ip,
                Hold {
                    until,
                    offer_to: None,
                },
            )
        });
    }

    /// The next pool address the hint believes free, scanning from `mac`'s place in the pool;
    /// loads the hint from the database first.
    async fn next_free(
        &self,
        subnet: &Arc<Subnet>,
        mac: MacAddr,
    ) -> Result<Option<Ipv4Addr>, StoreError> {
        let loaded = self.with_hint(subnet, |h| h.loaded).unwrap_or(false);
        if !loaded {
            let busy = self.store.busy_ips(&subnet.key(), now_ms()).await?;
            self.with_hint(subnet, |h| {
                for ip in busy {
                    h.busy.entry(ip).or_insert(Hold {
                        until: i64::MAX / 2,
                        offer_to: None,
                    });
                }
                h.loaded = true;
            });
        }
        let now = now_ms();
        let size: usize = subnet.pool.iter().map(|r| r.len() as usize).sum();
        let start = scan_start(mac, size);
        let found = self.with_hint(subnet, |h| {
            for step in 0..size {
                let mut rest = (start + step) % size;
                let mut found = None;
                for r in &subnet.pool {
                    let len = r.len() as usize;
                    if rest < len {
                        found = Some(Ipv4Addr::from(u32::from(r.first) + rest as u32));
                        break;
                    }
                    rest -= len;
                }
                let Some(ip) = found else { continue };
                if ip == subnet.server_ip || !subnet.is_host(ip) || h.taken(ip, now) {
                    continue;
                }
                h.record_pick(mac, ip, now + 2_000);
                return Some(ip);
            }
            None
        });
        Ok(found.flatten())
    }
}
