//! The relay circuit a machine's DHCP is pinned to (see `provisioning::dhcp::circuit`), as an
//! operator sees and changes it: show it, set it (say, after moving the machine to another switch
//! port), or clear it so the next relayed REQUEST pins the circuit it comes through. Each change
//! is an event of the machine. Also where a machine's DHCP came relayed from (`switch_port`): its
//! pin, or the option-82 data its newest relayed lease recorded (a discovered machine has no pin).

use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::ConfigService;
use crate::domain::{Machine, MachineId, ValidationErrors};
use crate::service::error::ServiceError;
use crate::service::ports::{CircuitPin, NewEvent};

/// Longest option-82 sub-option value: 255 bytes (RFC 3046 section 2.0), as hex.
const MAX_HEX: usize = 510;

/// A hex value of at most 255 bytes, lower-cased; `field` names it in the refusal.
fn hex_value(field: &str, v: Option<&str>, errors: &mut ValidationErrors) -> Option<String> {
    let v = v?.trim().to_ascii_lowercase();
    if v.is_empty() {
        return None;
    }
    if v.len() > MAX_HEX || v.len() % 2 != 0 || !v.chars().all(|c| c.is_ascii_hexdigit()) {
        errors.push(
            field,
            "must be the option-82 value as hex digits (an even number, at most 510), e.g. 0a01",
        );
        return None;
    }
    Some(v)
}

/// Interfaces of one machine whose leases are looked at, at most.
const PORT_MACS: usize = 8;

/// The switch port a machine's DHCP came through a relay agent from, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SwitchPort {
    /// The relay agent's address (`giaddr`).
    pub relay: String,
    /// Option 82 sub-option 1 (circuit id: the switch port), hex; absent when the relay sent none
    /// or is not a configured relay agent.
    pub circuit_id: Option<String>,
    /// Option 82 sub-option 2 (remote id: the switch), hex.
    pub remote_id: Option<String>,
    /// When it was pinned or last seen.
    pub at: DateTime<Utc>,
    /// Where this comes from: `pinned by WHO`, or `lease of MAC`.
    pub source: String,
}

impl ConfigService {
    /// Where machine `m`'s DHCP came relayed from: its circuit pin, else the newest relayed lease
    /// of its interfaces (the first eight); `None` when its DHCP never came through a relay.
    pub async fn switch_port(&self, m: &Machine) -> Result<Option<SwitchPort>, ServiceError> {
        if let Some(p) = self.leases.circuit_pin(m.id).await? {
            return Ok(Some(SwitchPort {
                relay: p.relay,
                circuit_id: p.circuit_id,
                remote_id: p.remote_id,
                at: p.pinned_at,
                source: format!("pinned by {}", p.pinned_by),
            }));
        }
        let mut newest: Option<SwitchPort> = None;
        for nic in m.interfaces.iter().take(PORT_MACS) {
            let relayed = self
                .leases
                .leases_of_mac(nic.mac)
                .await?
                .into_iter()
                .find(|l| l.giaddr.is_some());
            let Some(l) = relayed else { continue };
            let at = DateTime::<Utc>::from_timestamp_millis(l.updated_ms).unwrap_or_default();
            if newest.as_ref().is_some_and(|n| n.at >= at) {
                continue;
            }
            newest = Some(SwitchPort {
                relay: l.giaddr.unwrap_or_default(),
                circuit_id: l.relay_circuit_id,
                remote_id: l.relay_remote_id,
                at,
                source: format!("lease of {}", l.mac),
            });
        }
        Ok(newest)
    }

    /// A machine's relay circuit pin.
    pub async fn circuit_pin(&self, id: MachineId) -> Result<Option<CircuitPin>, ServiceError> {
        Ok(self.leases.circuit_pin(id).await?)
    }

    /// Pin machine `id` to the circuit of `relay` (its `giaddr`) and `circuit_id` (hex), or clear
    /// its pin (`relay` absent); an event either way.
    pub async fn set_circuit_pin(
        &self,
        id: MachineId,
        relay: Option<&str>,
        circuit_id: Option<&str>,
        remote_id: Option<&str>,
        actor: &str,
    ) -> Result<Option<CircuitPin>, ServiceError> {
        let mut errors = ValidationErrors::default();
        let relay = match relay.map(str::trim) {
            None | Some("") => None,
            Some(r) => match r.parse::<Ipv4Addr>() {
                Ok(ip) if !ip.is_unspecified() => Some(ip.to_string()),
                _ => {
                    errors.push(
                        "relay",
                        "must be the relay agent's IPv4 address (its giaddr)",
                    );
                    None
                }
            },
        };
        let circuit_id = hex_value("circuit_id", circuit_id, &mut errors);
        let remote_id = hex_value("remote_id", remote_id, &mut errors);
        if relay.is_none() && (circuit_id.is_some() || remote_id.is_some()) {
            errors.push("relay", "required with circuit_id or remote_id");
        }
        errors.into_result().map_err(ServiceError::Invalid)?;
        let before = self.leases.circuit_pin(id).await?;
        let pin = relay.map(|relay| CircuitPin {
            relay,
            circuit_id,
            remote_id,
            pinned_at: chrono::Utc::now(),
            pinned_by: actor.to_string(),
        });
        self.leases.set_circuit_pin(id, pin.as_ref()).await?;
        let show = |p: &Option<CircuitPin>| {
            p.as_ref().map(|p| {
                serde_json::json!({ "relay": p.relay, "circuit_id": p.circuit_id,
                    "remote_id": p.remote_id, "pinned_by": p.pinned_by })
            })
        };
        let event = NewEvent {
            machine_id: Some(id),
            kind: if pin.is_some() {
                "dhcp.circuit_set".into()
            } else {
                "dhcp.circuit_cleared".into()
            },
            actor: actor.into(),
            detail: serde_json::json!({ "before": show(&before), "after": show(&pin) }),
        };
        if let Err(e) = self.events.append_event(&event).await {
            tracing::warn!(error = %e, "circuit pin changed; its event was not written");
        }
        Ok(pin)
    }
}
