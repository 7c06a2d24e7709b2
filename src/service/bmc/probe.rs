//! Capability probing: ask the BMC what it can do, keep the answer as the machine's capability
//! record (with its event, in one transaction), and on failure keep what the last good probe of
//! the same URL found beside the error. A probe runs after registration and after a change of the
//! BMC, in the background, and on demand.

use std::time::Instant;

use chrono::Utc;
use serde_json::json;

use super::BmcService;
use crate::domain::{Machine, MachineId};
use crate::service::error::ServiceError;
use crate::service::ports::bmc::CapabilityRecord;
use crate::service::ports::NewEvent;

impl BmcService {
    /// The stored capability record of a machine's BMC.
    pub async fn capabilities(&self, reference: &str) -> Result<CapabilityRecord, ServiceError> {
        let m = self.inner.inventory.resolve(reference).await?;
        let Some(b) = &m.bmc else {
            return Err(ServiceError::NoBmc(m.display_name()));
        };
        let mut rec = self
            .inner
            .caps
            .bmc_capabilities(m.id)
            .await?
            .ok_or_else(|| {
                ServiceError::NotFound(format!(
                    "capability record of the BMC of {} (probe it first)",
                    m.display_name()
                ))
            })?;
        rec.stale = rec.bmc_url != b.url;
        Ok(rec)
    }

    /// Probe the BMC now and store what it can do. A failed probe is stored too (keeping the
    /// capabilities of the last good one) and returned as the error.
    pub async fn probe(
        &self,
        reference: &str,
        actor: &str,
    ) -> Result<CapabilityRecord, ServiceError> {
        let m = self.inner.inventory.resolve(reference).await?;
        self.probe_machine(&m, actor).await
    }

    async fn probe_machine(
        &self,
        m: &Machine,
        actor: &str,
    ) -> Result<CapabilityRecord, ServiceError> {
        let Some(b) = &m.bmc else {
            return Err(ServiceError::NoBmc(m.display_name()));
        };
        let started = Instant::now();
        let result = match self.client_of(m).await {
            Ok(bmc) => bmc.capabilities().await,
            Err(ServiceError::Bmc(e)) => Err(e),
            Err(other) => return Err(other),
        };
        let previous = self.inner.caps.bmc_capabilities(m.id).await?;
        let now = Utc::now();
        let rec = match &result {
            Ok(c) => CapabilityRecord {
                machine_id: m.id,
                bmc_url: b.url.clone(),
                capabilities: Some(c.clone()),
                probed_at: Some(now),
                last_error: None,
                attempted_at: now,
                stale: false,
            },
            Err(e) => {
                // Keep what the last good probe found, if it was of this same BMC URL.
                let (capabilities, probed_at) = match previous {
                    Some(p) if p.bmc_url == b.url => (p.capabilities, p.probed_at),
                    _ => (None, None),
                };
                CapabilityRecord {
                    machine_id: m.id,
                    bmc_url: b.url.clone(),
                    capabilities,
                    probed_at,
                    last_error: Some(e.to_string()),
                    attempted_at: now,
                    stale: false,
                }
            }
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let detail = match &result {
            Ok(c) => json!({
                "result": "ok", "elapsed_ms": elapsed_ms, "vendor": c.vendor, "quirks": c.quirks,
                "redfish_version": c.redfish_version,
            }),
            Err(e) => json!({"result": "failed", "elapsed_ms": elapsed_ms, "error": e.to_string()}),
        };
        let event = NewEvent {
            machine_id: Some(m.id),
            kind: "bmc.probe".into(),
            actor: actor.into(),
            detail,
        };
        self.inner.caps.put_bmc_capabilities(&rec, &event).await?;
        match result {
            Ok(_) => {
                tracing::info!(machine = %m.id, name = %m.display_name(), actor, elapsed_ms, "BMC capabilities probed");
                Ok(rec)
            }
            Err(e) => {
                tracing::warn!(machine = %m.id, name = %m.display_name(), actor, elapsed_ms, error = %e, "BMC capability probe failed; recorded");
                Err(ServiceError::Bmc(e))
            }
        }
    }

    /// Probe a machine's BMC in the background (after registration or a change of its BMC): the
    /// outcome, good or bad, ends up in the capability record and the event log.
    pub fn probe_in_background(&self, id: MachineId, actor: &str) {
        let svc = self.clone();
        let actor = actor.to_string();
        tokio::spawn(async move {
            let m = match svc.inner.inventory.get(id).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(machine = %id, error = %e, "BMC probe skipped");
                    return;
                }
            };
            if m.bmc.is_none() {
                return;
            }
            // Failures are recorded and logged by probe_machine.
            let _ = svc.probe_machine(&m, &actor).await;
        });
    }
}
