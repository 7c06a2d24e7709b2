//! Relay circuit pinning (issue 15): where a machine's DHCP arrives through a relay, its leases
//! are pinned to the relay (`giaddr`) and option-82 circuit (RFC 3046 sub-option 1, the switch
//! port) first seen for it, recorded in the inventory (`dhcp_circuit_pins`); an operator may
//! change or clear the pin. A DISCOVER or REQUEST for one of its MACs from another circuit, or
//! straight on a local segment, is not answered: it is counted
//! (`plinth_dhcp_dropped_total{reason="circuit_mismatch"}`) and is a `dhcp.circuit_mismatch` step
//! on the machine's timeline. Option 82 counts only from a configured relay agent. MACs the
//! inventory does not know are not pinned (they are no machine yet).
//!
//! Part of `DhcpService`; imports the ports and the timeline only.

use std::sync::Arc;

use super::{hex, DhcpRequest, DhcpService, Outcome};
use crate::domain::dhcp::Subnet;
use crate::service::ports::{CircuitPin, ClientFacts, StoreError};
use crate::service::provisioning::timeline::Step;

/// The circuit a request came through: (relay, circuit id as hex); `None` when it came straight
/// (no `giaddr`).
fn circuit_of(req: &DhcpRequest, subnet: &Subnet) -> Option<(String, Option<String>)> {
    if req.giaddr.is_unspecified() {
        return None;
    }
    let trusted = subnet.relay_agents.contains(&req.source);
    Some((
        req.giaddr.to_string(),
        trusted.then(|| hex(&req.circuit_id)).flatten(),
    ))
}

impl DhcpService {
    /// Check (and on a REQUEST, when `pin` is set, record the first) relay circuit of the known
    /// machine behind `req`; `Some(Outcome::Silent)` when it comes from another circuit.
    pub(super) async fn circuit_check(
        &self,
        req: &DhcpRequest,
        subnet: &Arc<Subnet>,
        facts: &ClientFacts,
        pin: bool,
    ) -> Result<Option<Outcome>, StoreError> {
        let Some(machine) = facts.machine else {
            return Ok(None);
        };
        let here = circuit_of(req, subnet);
        let on_record = match (&facts.pin, &here) {
            (None, None) => return Ok(None),
            (None, Some(_)) if !pin => return Ok(None),
            (None, Some((relay, circuit))) => {
                let first = CircuitPin {
                    relay: relay.clone(),
                    circuit_id: circuit.clone(),
                    remote_id: subnet
                        .relay_agents
                        .contains(&req.source)
                        .then(|| hex(&req.remote_id))
                        .flatten(),
                    pinned_at: chrono::Utc::now(),
                    pinned_by: "dhcp".into(),
                };
                let rec = self.store.pin_circuit(machine, &first).await?;
                if rec.is(relay, circuit.as_deref()) {
                    if rec.pinned_at == first.pinned_at {
                        self.step(req, machine, "dhcp.circuit_pinned", &rec, None);
                    }
                    return Ok(None);
                }
                rec
            }
            (Some(p), Some((relay, circuit))) if p.is(relay, circuit.as_deref()) => {
                return Ok(None)
            }
            (Some(p), _) => p.clone(),
        };
        tracing::warn!(mac = %req.mac, machine = %machine, pinned_relay = %on_record.relay,
            seen_relay = here.as_ref().map_or("direct", |(r, _)| r.as_str()),
            "dhcp: a pinned machine's MAC on another circuit: not answered");
        self.step(
            req,
            machine,
            "dhcp.circuit_mismatch",
            &on_record,
            Some(here),
        );
        Ok(Some(Outcome::Silent("circuit_mismatch")))
    }

    /// A pin or a mismatch on the machine's timeline (never waits).
    fn step(
        &self,
        req: &DhcpRequest,
        machine: crate::domain::MachineId,
        kind: &'static str,
        pin: &CircuitPin,
        seen: Option<Option<(String, Option<String>)>>,
    ) {
        let Some(timeline) = &self.timeline else {
            return;
        };
        let pinned = serde_json::json!({ "relay": pin.relay, "circuit_id": pin.circuit_id });
        let detail = match seen {
            None => serde_json::json!({ "pinned": pinned, "kind": format!("{:?}", req.kind) }),
            Some(seen) => serde_json::json!({
                "pinned": pinned,
                "seen": seen.map_or(serde_json::json!("direct"), |(relay, circuit)|
                    serde_json::json!({ "relay": relay, "circuit_id": circuit })),
                "kind": format!("{:?}", req.kind),
            }),
        };
        timeline.record(Step {
            kind,
            mac: Some(req.mac),
            ip: None,
            machine: Some(machine),
            detail,
        });
    }
}
