//! The `LeaseStore` port: durable DHCP leases. One row per address; a claim is a conditional
//! upsert that only succeeds when the address is free, expired, released, or already this MAC's,
//! so the database (not a check in code) keeps one address from going to two MACs. Imports
//! `domain` and `StoreError` only.

use std::net::Ipv4Addr;

use async_trait::async_trait;
use serde::Serialize;

use super::error::StoreError;
use crate::domain::{MacAddr, MachineId};

/// Where a lease is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// Offered, not yet requested.
    Offered,
    /// Acknowledged.
    Bound,
    /// Given back by the client.
    Released,
    /// The client found the address in use (quarantined until expiry).
    Declined,
    /// Ran out.
    Expired,
}

impl LeaseState {
    /// Database spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            LeaseState::Offered => "offered",
            LeaseState::Bound => "bound",
            LeaseState::Released => "released",
            LeaseState::Declined => "declined",
            LeaseState::Expired => "expired",
        }
    }

    /// From the database spelling.
    pub fn parse(s: &str) -> Option<LeaseState> {
        Some(match s {
            "offered" => LeaseState::Offered,
            "bound" => LeaseState::Bound,
            "released" => LeaseState::Released,
            "declined" => LeaseState::Declined,
            "expired" => LeaseState::Expired,
            _ => return None,
        })
    }
}

/// A lease row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Lease {
    /// The address.
    #[schema(value_type = String)]
    pub ip: Ipv4Addr,
    /// Subnet key (CIDR).
    pub subnet: String,
    /// Client MAC.
    pub mac: crate::domain::MacAddr,
    /// State.
    pub state: LeaseState,
    /// Expiry, Unix ms.
    pub expires_ms: i64,
    /// Host name the client sent (option 12).
    pub hostname: Option<String>,
    /// Option 82 circuit id (hex), i.e. the switch port.
    pub relay_circuit_id: Option<String>,
    /// Option 82 remote id (hex), i.e. the switch.
    pub relay_remote_id: Option<String>,
    /// Relay address.
    pub giaddr: Option<String>,
    /// Last change, Unix ms.
    pub updated_ms: i64,
}

/// A claim of an address for a MAC.
#[derive(Clone, Debug)]
pub struct LeaseClaim {
    /// The row to write (its `updated_ms` is "now").
    pub lease: Lease,
}

/// A machine's reservation as DHCP needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The machine.
    pub machine_id: MachineId,
    /// Its reserved address on this NIC, if any.
    pub ipv4: Option<Ipv4Addr>,
}

/// The relay and option-82 circuit a machine's DHCP is pinned to: the first seen for it, or what
/// an operator set. A lease request for one of its MACs from anywhere else is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CircuitPin {
    /// The relay agent's address (`giaddr`).
    pub relay: String,
    /// Option 82 sub-option 1 (circuit id, i.e. the switch port), hex; absent when the relay
    /// sends none.
    pub circuit_id: Option<String>,
    /// Option 82 sub-option 2 (remote id, i.e. the switch), hex: recorded, not compared.
    pub remote_id: Option<String>,
    /// When it was pinned.
    pub pinned_at: chrono::DateTime<chrono::Utc>,
    /// `dhcp` (first seen) or the operator who set it.
    pub pinned_by: String,
}

impl CircuitPin {
    /// Is (`relay`, `circuit_id`) this pin's circuit?
    pub fn is(&self, relay: &str, circuit_id: Option<&str>) -> bool {
        self.relay == relay && self.circuit_id.as_deref() == circuit_id
    }
}

/// What one DHCP message needs to know about its client, read in one round trip.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientFacts {
    /// The machine of the inventory this MAC belongs to, if any.
    pub machine: Option<MachineId>,
    /// That machine's relay circuit pin, if any.
    pub pin: Option<CircuitPin>,
    /// The address the inventory reserves for this MAC, if any.
    pub reserved_ip: Option<Ipv4Addr>,
    /// The MAC's newest offered or bound lease in the subnet (expired or not).
    pub lease: Option<Lease>,
    /// Which of the addresses asked about are reserved in the inventory for another MAC.
    pub reserved_for_other: Vec<Ipv4Addr>,
}

/// Durable leases.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Claim `lease.ip` for `lease.mac`: succeeds (true) only when the address is free, expired,
    /// released, or already held by this MAC (and not declined). On success the MAC's other offers
    /// in the subnet expire, and when the claim binds, its other bound leases too. An offer never
    /// downgrades or ends the same MAC's bound lease (a late or repeated DISCOVER must not shorten
    /// or end an acknowledged lease). Committed (durable)
    /// before it returns; concurrent claims may share one transaction and one commit, with the
    /// result each would have had alone in the order they were queued.
    async fn claim_lease(&self, claim: &LeaseClaim) -> Result<bool, StoreError>;

    /// May other instances allocate from this lease table (one PostgreSQL shared by several
    /// Plinth processes)? Then offers are recorded in it so no two instances offer one address.
    fn is_shared(&self) -> bool;

    /// The lease row of an address. This and the other look-ups DHCP makes (`lease_by_mac`,
    /// `busy_ips`, `client_facts`) may answer from memory that learns another instance's writes
    /// some milliseconds after they committed (see `is_shared`); the claims decide regardless.
    async fn lease_by_ip(&self, ip: Ipv4Addr) -> Result<Option<Lease>, StoreError>;

    /// The lease row of an address as committed now, read from the database: for callers off
    /// the DHCP path (which machine a request comes from) that must see a lease another instance
    /// committed a moment ago.
    async fn lease_at(&self, ip: Ipv4Addr) -> Result<Option<Lease>, StoreError>;

    /// The newest offered or bound lease of a MAC in a subnet (expired or not).
    async fn lease_by_mac(&self, subnet: &str, mac: MacAddr) -> Result<Option<Lease>, StoreError>;

    /// Set the state (and expiry) of `ip` if it is held by `mac`; false when it is not. Committed
    /// before it returns, like `claim_lease` (and through the same batches).
    async fn end_lease(
        &self,
        ip: Ipv4Addr,
        mac: MacAddr,
        state: LeaseState,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Addresses of a subnet's rows that are not reusable at `now_ms`.
    async fn busy_ips(&self, subnet: &str, now_ms: i64) -> Result<Vec<Ipv4Addr>, StoreError>;

    /// Every lease of a MAC, newest first.
    async fn leases_of_mac(&self, mac: MacAddr) -> Result<Vec<Lease>, StoreError>;

    /// The inventory's reservation for a MAC.
    async fn reservation(&self, mac: MacAddr) -> Result<Option<Reservation>, StoreError>;

    /// The machines of the inventory that own any of `macs` (absent MACs are nobody's): one
    /// look-up for many, as the boot timeline resolves a batch of steps.
    async fn owners(&self, macs: &[MacAddr]) -> Result<Vec<(MacAddr, MachineId)>, StoreError> {
        let mut out = Vec::new();
        for mac in macs {
            if let Some(r) = self.reservation(*mac).await? {
                out.push((*mac, r.machine_id));
            }
        }
        Ok(out)
    }

    /// Is `ip` reserved in the inventory for a MAC other than `mac`?
    async fn reserved_for_other(&self, ip: Ipv4Addr, mac: MacAddr) -> Result<bool, StoreError>;

    /// `reservation`, `lease_by_mac` and `reserved_for_other` (for up to two addresses) in one
    /// query: the DHCP hot path asks this once per message.
    async fn client_facts(
        &self,
        subnet: &str,
        mac: MacAddr,
        ips: [Option<Ipv4Addr>; 2],
    ) -> Result<ClientFacts, StoreError>;

    /// Pin `machine` to `pin` unless it is pinned already (committed before it returns); the pin
    /// on record after (the first one wins).
    async fn pin_circuit(
        &self,
        machine: MachineId,
        pin: &CircuitPin,
    ) -> Result<CircuitPin, StoreError>;

    /// A machine's pin.
    async fn circuit_pin(&self, machine: MachineId) -> Result<Option<CircuitPin>, StoreError>;

    /// Set (`Some`) or clear (`None`) a machine's pin, as an operator does.
    async fn set_circuit_pin(
        &self,
        machine: MachineId,
        pin: Option<&CircuitPin>,
    ) -> Result<(), StoreError>;
}
