//! Provisioning windows and config delivery: opening and closing a machine's window, minting
//! the token of an install boot (`InstallTicket`), and the checks before a config is handed out
//! (open window, provisioning state, this boot's token, SMBIOS UUID, source address), every
//! answer an event. Never logs a config or a token.

use std::collections::HashSet;
use std::net::IpAddr;

use base64::Engine as _;
use chrono::{DateTime, Duration, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::{sealed_context, ConfigService, MachineConfigError, RenderedMachine};
use crate::domain::{LifecycleState, Machine, MachineId};
use crate::service::error::ServiceError;
use crate::service::inventory::Inventory;
use crate::service::ports::{LeaseState, NewEvent, ProvisionWindow, ServedConfig, StoreError};

/// The outcome of a config fetch that is not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No such machine, or nothing may be served to it now: 404.
    NotFound,
    /// A window is open but the request does not prove it comes from the machine: 403.
    Forbidden,
    /// The store failed: nothing can be decided now, the machine retries: 503 (never a 404).
    Unavailable,
}

/// What an install boot needs from the config side.
#[derive(Clone)]
pub struct InstallTicket {
    /// The token minted into this boot's kernel command line.
    pub token: String,
    /// Talos version, `v1.11.6`.
    pub talos_version: String,
    /// Schematic id.
    pub schematic_id: String,
    /// Extra kernel arguments.
    pub kernel_args: Vec<String>,
    /// Wipe the system disk on this boot.
    pub wipe: bool,
}

impl std::fmt::Debug for InstallTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallTicket")
            .field("talos_version", &self.talos_version)
            .field("schematic_id", &self.schematic_id)
            .finish_non_exhaustive()
    }
}

/// SHA-256 of a token, hex.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl ConfigService {
    /// The config last served to a machine, in the clear.
    pub async fn last_served(
        &self,
        id: MachineId,
    ) -> Result<Option<(String, DateTime<Utc>)>, MachineConfigError> {
        let (_, served) = self.configs.machine_config(id).await?;
        match served {
            Some(s) => {
                let yaml = self.open_text(&sealed_context("served", &id.to_string()), &s.sealed)?;
                Ok(Some((yaml, s.at)))
            }
            None => Ok(None),
        }
    }

    /// A machine's provisioning window, open or not.
    pub async fn window(
        &self,
        id: MachineId,
    ) -> Result<Option<ProvisionWindow>, MachineConfigError> {
        Ok(self.configs.window(id).await?)
    }

    /// The config last served to a machine, sealed, if any.
    pub async fn served(&self, id: MachineId) -> Result<Option<ServedConfig>, MachineConfigError> {
        let (_, served) = self.configs.machine_config(id).await?;
        Ok(served)
    }

    /// Open a machine's provisioning window for `ttl`. The config must render and validate
    /// first; the machine moves to `provisioning`.
    pub async fn open_window(
        &self,
        inventory: &Inventory,
        id: MachineId,
        ttl: Duration,
        wipe: bool,
        actor: &str,
    ) -> Result<(ProvisionWindow, RenderedMachine), OpenError> {
        let m = inventory.get(id).await.map_err(OpenError::Service)?;
        let rendered = self.render_machine(&m).await.map_err(OpenError::Config)?;
        if m.state != LifecycleState::Provisioning {
            inventory
                .set_state(id, None, LifecycleState::Provisioning, None, actor)
                .await
                .map_err(OpenError::Service)?;
        }
        let now = Utc::now();
        let w = ProvisionWindow {
            machine_id: id,
            opened_at: now,
            expires_at: now + ttl,
            opened_by: actor.to_string(),
            wipe,
            token_sha256: None,
            token_minted_at: None,
            closed_at: None,
            close_reason: None,
        };
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.window_opened".into(),
            actor: actor.into(),
            detail: serde_json::json!({
                "expires_at": w.expires_at, "wipe": wipe, "config_sha256": rendered.sha256,
                "warnings": rendered.warnings,
            }),
        };
        self.configs
            .put_window(&w, &event)
            .await
            .map_err(|e| OpenError::Config(e.into()))?;
        Ok((w, rendered))
    }

    /// Close a machine's window; false when none was open.
    pub async fn close_window(
        &self,
        id: MachineId,
        reason: &str,
        actor: &str,
    ) -> Result<bool, MachineConfigError> {
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.window_closed".into(),
            actor: actor.into(),
            detail: serde_json::json!({ "reason": reason }),
        };
        Ok(self
            .configs
            .close_window(id, Utc::now(), reason, &event)
            .await?)
    }

    /// For an install boot of `m`: mint the token of this boot, when the window is open and the
    /// config renders. `Ok(None)`: no window is open.
    pub async fn install_ticket(
        &self,
        m: &Machine,
    ) -> Result<Option<InstallTicket>, MachineConfigError> {
        let now = Utc::now();
        let Some(w) = self.configs.window(m.id).await? else {
            return Ok(None);
        };
        if !w.is_open(now) {
            return Ok(None);
        }
        let rendered = self.render_machine(m).await?;
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        if !self
            .configs
            .set_window_token(m.id, &token_hash(&token), now)
            .await?
        {
            return Ok(None);
        }
        Ok(Some(InstallTicket {
            token,
            talos_version: rendered.version.to_string(),
            schematic_id: rendered.schematic_id,
            kernel_args: rendered.kernel_args,
            wipe: w.wipe || rendered.wipe,
        }))
    }

    /// Serve the config of machine `id` to a request carrying `token`, the SMBIOS `uuid` Talos
    /// substituted, from address `from`. Every answer is an event.
    pub async fn fetch(
        &self,
        inventory: &Inventory,
        id: MachineId,
        token: Option<&str>,
        uuid: Option<&str>,
        from: IpAddr,
    ) -> Result<String, Refusal> {
        let m = match inventory.get(id).await {
            Ok(m) => m,
            Err(ServiceError::NotFound(_)) => return Err(Refusal::NotFound),
            Err(e) => {
                tracing::error!(error = %e, "config fetch: machine look-up failed");
                return Err(Refusal::Unavailable);
            }
        };
        let now = Utc::now();
        let refuse = |refusal: Refusal, reason: &str| {
            let event = NewEvent {
                machine_id: Some(id),
                kind: "config.refused".into(),
                actor: "talos".into(),
                detail: serde_json::json!({ "reason": reason, "from": from.to_string(),
                    "status": if refusal == Refusal::NotFound { 404 } else { 403 } }),
            };
            let events = self.events.clone();
            async move {
                if let Err(e) = events.append_event(&event).await {
                    tracing::warn!(error = %e, "config fetch: event not written");
                }
                tracing::info!(machine = %id, %from, reason = event.detail["reason"].as_str().unwrap_or(""), "config refused");
                Err(refusal)
            }
        };
        let window = match self.configs.window(id).await {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "config fetch: window look-up failed");
                return Err(Refusal::Unavailable);
            }
        };
        let Some(w) = window.filter(|w| w.closed_at.is_none()) else {
            return refuse(Refusal::NotFound, "no open provisioning window").await;
        };
        if m.state != LifecycleState::Provisioning {
            return refuse(Refusal::NotFound, "machine is not provisioning").await;
        }
        if w.expires_at <= now {
            return refuse(Refusal::Forbidden, "provisioning window expired").await;
        }
        let token_ok = match (token, &w.token_sha256) {
            (Some(t), Some(h)) => constant_time_eq(token_hash(t).as_bytes(), h.as_bytes()),
            _ => false,
        };
        if !token_ok {
            return refuse(Refusal::Forbidden, "token does not match this boot's").await;
        }
        if let Some(want) = m.smbios_uuid {
            let got = uuid.and_then(|u| u.trim().parse::<uuid::Uuid>().ok());
            if got != Some(want) {
                return refuse(Refusal::Forbidden, "SMBIOS UUID does not match the machine").await;
            }
        }
        match self.expected_addresses(&m).await {
            Ok(addrs) if !addrs.is_empty() => {
                let ok = match from {
                    IpAddr::V4(v4) => addrs.contains(&v4),
                    IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| addrs.contains(&v4)),
                };
                if !ok {
                    return refuse(
                        Refusal::Forbidden,
                        "source address is not the machine's leased or reserved address",
                    )
                    .await;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "config fetch: lease look-up failed");
                return Err(Refusal::Unavailable);
            }
        }
        let rendered = match self.render_machine(&m).await {
            Ok(r) => r,
            // The store failed while loading the render's inputs: the config is not at fault,
            // the machine is not failed for it.
            Err(MachineConfigError::Store(e)) => {
                tracing::error!(error = %e, "config fetch: render inputs not loaded");
                return Err(Refusal::Unavailable);
            }
            Err(e) => {
                let reason = e.to_string();
                let _ = inventory
                    .set_state(
                        id,
                        None,
                        LifecycleState::Failed,
                        Some(format!("config not served: {reason}")),
                        "plinth",
                    )
                    .await;
                return refuse(Refusal::NotFound, &format!("config invalid: {reason}")).await;
            }
        };
        let served = ServedConfig {
            sealed: self.secrets.seal(
                &sealed_context("served", &id.to_string()),
                rendered.yaml.as_bytes(),
            ),
            sha256: rendered.sha256.clone(),
            at: now,
        };
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.served".into(),
            actor: "talos".into(),
            detail: serde_json::json!({ "sha256": rendered.sha256, "from": from.to_string(),
                "talos_version": rendered.version.to_string() }),
        };
        if let Err(e) = self.configs.record_served(id, &served, &event).await {
            tracing::error!(error = %e, "config fetch: could not record the served config");
            return Err(Refusal::Unavailable);
        }
        tracing::info!(machine = %id, %from, sha256 = %rendered.sha256, "config served");
        Ok(rendered.yaml)
    }

    /// Addresses a request for `m`'s config may come from: its reserved addresses and its bound
    /// leases. Empty when Plinth hands out none of them.
    async fn expected_addresses(
        &self,
        m: &Machine,
    ) -> Result<HashSet<std::net::Ipv4Addr>, StoreError> {
        let mut out: HashSet<std::net::Ipv4Addr> =
            m.interfaces.iter().filter_map(|i| i.ipv4).collect();
        let now_ms = Utc::now().timestamp_millis();
        for i in &m.interfaces {
            for l in self.leases.leases_of_mac(i.mac).await? {
                if l.state == LeaseState::Bound && l.expires_ms > now_ms {
                    out.insert(l.ip);
                }
            }
        }
        Ok(out)
    }
}

/// Why a window could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The machine or its state.
    #[error(transparent)]
    Service(ServiceError),
    /// The config does not render or validate.
    #[error(transparent)]
    Config(MachineConfigError),
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_open_and_close() {
        let now = Utc::now();
        let mut w = ProvisionWindow {
            machine_id: MachineId::new(),
            opened_at: now,
            expires_at: now + Duration::minutes(5),
            opened_by: "t".into(),
            wipe: false,
            token_sha256: None,
            token_minted_at: None,
            closed_at: None,
            close_reason: None,
        };
        assert!(w.is_open(now));
        assert!(!w.is_open(now + Duration::minutes(6)));
        w.closed_at = Some(now);
        assert!(!w.is_open(now));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
