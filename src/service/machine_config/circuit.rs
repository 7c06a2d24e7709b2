//! The relay circuit a machine's DHCP is pinned to (see `provisioning::dhcp::circuit`), as an
//! operator sees and changes it: show it, set it (say, after moving the machine to another switch
//! port), or clear it so the next relayed REQUEST pins the circuit it comes through. Each change
//! is an event of the machine.

use std::net::Ipv4Addr;

use super::ConfigService;
use crate::domain::{MachineId, ValidationErrors};
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

impl ConfigService {
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
