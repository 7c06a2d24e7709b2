//! DHCP decisions (RFC 2131 section 4.3): given a decoded request, decide the answer, with leases
//! made durable before the answer exists. The whole decision is one `match` on (subnet mode,
//! message kind) in `DhcpService::handle`; the wire format lives in `crate::dhcp`.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use super::leases::{Lease, LeaseClaim, LeaseState, LeaseStore};
use super::StoreError;
use crate::domain::dhcp::{select_subnet, BootAnswer, BootClient, BootFiles, Subnet, SubnetMode};
use crate::domain::MacAddr;

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
    pub subnet: Option<Subnet>,
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

/// In-memory view of which pool addresses are taken, per subnet. Only a hint: the database's
/// conditional upsert decides, and a refused claim refreshes the hint.
#[derive(Default)]
struct PoolHint {
    busy: HashMap<Ipv4Addr, i64>,
    cursor: usize,
    loaded: bool,
}

/// DHCP use cases.
pub struct DhcpService {
    store: Arc<dyn LeaseStore>,
    subnets: Vec<Subnet>,
    boot: BootFiles,
    timing: LeaseTiming,
    pools: Mutex<HashMap<String, PoolHint>>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn hex(b: &Option<Vec<u8>>) -> Option<String> {
    b.as_ref().map(hex::encode)
}

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
            store,
            subnets,
            boot,
            timing,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// The configured subnets.
    pub fn subnets(&self) -> &[Subnet] {
        &self.subnets
    }

    /// Decide the answer to one request.
    pub async fn handle(&self, req: &DhcpRequest) -> Result<Outcome, StoreError> {
        let Some(subnet) = select_subnet(&self.subnets, req.giaddr, req.ciaddr, &req.local_ips)
        else {
            return Ok(Outcome::Silent("no_subnet"));
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

    fn reply(
        &self,
        req: &DhcpRequest,
        subnet: &Subnet,
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
        }
    }

    fn nak(&self, subnet: &Subnet, why: &str) -> Outcome {
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
        })
    }

    /// proxyDHCP (PXE specification 2.1): boot information only, never an address.
    fn proxy(&self, req: &DhcpRequest, subnet: &Subnet, kind: ReplyKind) -> Outcome {
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
        subnet: &Subnet,
        ip: Ipv4Addr,
        state: LeaseState,
        ms: i64,
    ) -> LeaseClaim {
        let now = now_ms();
        LeaseClaim {
            lease: Lease {
                ip,
                subnet: subnet.key(),
                mac: req.mac,
                state,
                expires_ms: now + ms,
                hostname: req.hostname.clone(),
                relay_circuit_id: hex(&req.circuit_id),
                relay_remote_id: hex(&req.remote_id),
                giaddr: (!req.giaddr.is_unspecified()).then(|| req.giaddr.to_string()),
                updated_ms: now,
            },
        }
    }

    /// The address a MAC should get in a subnet if it can: its reservation, else its current lease.
    async fn preferred(
        &self,
        req: &DhcpRequest,
        subnet: &Subnet,
    ) -> Result<Option<Ipv4Addr>, StoreError> {
        if let Some(r) = self.store.reservation(req.mac).await? {
            if let Some(ip) = r.ipv4.filter(|ip| subnet.is_host(*ip)) {
                return Ok(Some(ip));
            }
        }
        Ok(self
            .store
            .lease_by_mac(&subnet.key(), req.mac)
            .await?
            .map(|l| l.ip)
            .filter(|ip| subnet.in_pool(*ip)))
    }

    /// Claim `ip` as offered to the client; the OFFER when the database agreed.
    async fn claim_offer(
        &self,
        req: &DhcpRequest,
        subnet: &Subnet,
        ip: Ipv4Addr,
    ) -> Result<Option<Outcome>, StoreError> {
        let claim = self.lease(req, subnet, ip, LeaseState::Offered, self.timing.offer_ms);
        if !self.store.claim_lease(&claim).await? {
            return Ok(None);
        }
        self.mark(subnet, ip, now_ms() + self.timing.offer_ms);
        Ok(Some(Outcome::Reply(self.reply(
            req,
            subnet,
            ReplyKind::Offer,
            ip,
            true,
        ))))
    }

    async fn offer(&self, req: &DhcpRequest, subnet: &Subnet) -> Result<Outcome, StoreError> {
        // Its reservation or current lease first, then the address it asks for (option 50); an
        // address reserved for another machine is never offered, asked for or not.
        let mut candidates: Vec<Ipv4Addr> = Vec::new();
        if let Some(ip) = self.preferred(req, subnet).await? {
            candidates.push(ip);
        }
        if let Some(ip) = req.requested_ip.filter(|ip| subnet.in_pool(*ip)) {
            candidates.push(ip);
        }
        for ip in candidates {
            if self.store.reserved_for_other(ip, req.mac).await? {
                continue;
            }
            if let Some(offer) = self.claim_offer(req, subnet, ip).await? {
                return Ok(offer);
            }
        }
        let mut reloaded = false;
        for _ in 0..MAX_TRIES {
            let ip = match self.next_free(subnet).await? {
                Some(ip) => ip,
                // The hint may be stale (a release, another instance): ask the database once.
                None if !reloaded => {
                    reloaded = true;
                    self.reload(subnet).await?;
                    match self.next_free(subnet).await? {
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
            if let Some(offer) = self.claim_offer(req, subnet, ip).await? {
                return Ok(offer);
            }
            // Someone else (another instance) holds it: learn when it frees up.
            let until = self
                .store
                .lease_by_ip(ip)
                .await?
                .map_or(now_ms() + self.timing.offer_ms, |l| l.expires_ms);
            self.mark(subnet, ip, until);
        }
        Ok(Outcome::Silent("pool_contended"))
    }

    async fn request(&self, req: &DhcpRequest, subnet: &Subnet) -> Result<Outcome, StoreError> {
        if let Some(sid) = req.server_id {
            if sid != subnet.server_ip {
                // SELECTING another server's offer: free ours (RFC 2131 section 4.3.2).
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
        let reservation = self.store.reservation(req.mac).await?;
        if let Some(rip) = reservation
            .as_ref()
            .and_then(|r| r.ipv4)
            .filter(|ip| subnet.is_host(*ip))
        {
            if rip != ip {
                return Ok(self.nak(subnet, "this machine has another reserved address"));
            }
        } else if !subnet.in_pool(ip) {
            return Ok(self.nak(subnet, "address is not in this server's pool"));
        }
        if self.store.reserved_for_other(ip, req.mac).await? {
            return Ok(self.nak(subnet, "address is reserved for another machine"));
        }
        let ms = i64::from(subnet.lease_seconds) * 1000;
        if !self
            .store
            .claim_lease(&self.lease(req, subnet, ip, LeaseState::Bound, ms))
            .await?
        {
            return Ok(self.nak(subnet, "address is in use"));
        }
        self.mark(subnet, ip, now_ms() + ms);
        Ok(Outcome::Reply(self.reply(
            req,
            subnet,
            ReplyKind::Ack,
            ip,
            true,
        )))
    }

    async fn decline(&self, req: &DhcpRequest, subnet: &Subnet) -> Result<Outcome, StoreError> {
        let Some(ip) = req.requested_ip else {
            return Ok(Outcome::Silent("decline_without_address"));
        };
        let until = now_ms() + self.timing.decline_ms;
        if self
            .store
            .end_lease(ip, req.mac, LeaseState::Declined, until, now_ms())
            .await?
        {
            self.mark(subnet, ip, until);
            tracing::warn!(%ip, mac = %req.mac, "address declined by client: quarantined");
        }
        Ok(Outcome::Silent("declined"))
    }

    async fn release(&self, req: &DhcpRequest, subnet: &Subnet) -> Result<Outcome, StoreError> {
        if !req.ciaddr.is_unspecified() {
            let now = now_ms();
            if self
                .store
                .end_lease(req.ciaddr, req.mac, LeaseState::Released, now, now)
                .await?
            {
                self.mark(subnet, req.ciaddr, 0);
            }
        }
        Ok(Outcome::Silent("released"))
    }

    fn inform(&self, req: &DhcpRequest, subnet: &Subnet) -> Outcome {
        // RFC 2131 section 3.4: configuration only; no yiaddr, no lease time.
        Outcome::Reply(self.reply(req, subnet, ReplyKind::Ack, Ipv4Addr::UNSPECIFIED, false))
    }

    /// Replace a subnet's hint with what the database holds now.
    async fn reload(&self, subnet: &Subnet) -> Result<(), StoreError> {
        let key = subnet.key();
        let busy = self.store.busy_ips(&key, now_ms()).await?;
        let until = now_ms() + self.timing.offer_ms;
        if let Ok(mut pools) = self.pools.lock() {
            let h = pools.entry(key).or_default();
            h.busy = busy.into_iter().map(|ip| (ip, until)).collect();
            h.loaded = true;
        }
        Ok(())
    }

    fn mark(&self, subnet: &Subnet, ip: Ipv4Addr, until: i64) {
        if let Ok(mut pools) = self.pools.lock() {
            pools
                .entry(subnet.key())
                .or_default()
                .busy
                .insert(ip, until);
        }
    }

    /// The next pool address the hint believes free; loads the hint from the database first.
    async fn next_free(&self, subnet: &Subnet) -> Result<Option<Ipv4Addr>, StoreError> {
        let key = subnet.key();
        let loaded = self
            .pools
            .lock()
            .map(|p| p.get(&key).is_some_and(|h| h.loaded))
            .unwrap_or(false);
        if !loaded {
            let busy = self.store.busy_ips(&key, now_ms()).await?;
            if let Ok(mut pools) = self.pools.lock() {
                let h = pools.entry(key.clone()).or_default();
                for ip in busy {
                    h.busy.entry(ip).or_insert(i64::MAX / 2);
                }
                h.loaded = true;
            }
        }
        let now = now_ms();
        let size: usize = subnet.pool.iter().map(|r| r.len() as usize).sum();
        let Ok(mut pools) = self.pools.lock() else {
            return Ok(None);
        };
        let h = pools.entry(key).or_default();
        for step in 0..size {
            let idx = (h.cursor + step) % size;
            let mut rest = idx;
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
            if ip == subnet.server_ip || !subnet.is_host(ip) {
                continue;
            }
            if h.busy.get(&ip).is_some_and(|until| *until >= now) {
                continue;
            }
            h.cursor = idx + 1;
            // Hold it briefly so a concurrent DISCOVER picks another one.
            h.busy.insert(ip, now + 2_000);
            return Ok(Some(ip));
        }
        Ok(None)
    }
}
