//! Power: the system's `PowerState`, the `ComputerSystem.Reset` action and the reset types it
//! allows (from `ResetType@Redfish.AllowableValues`, else its `@Redfish.ActionInfo`), and power
//! operations confirmed by polling `PowerState` to the target under a deadline. A cycle where
//! `PowerCycle` is not allowed is off, wait for Off, on.

use std::time::Instant;

use serde_json::{json, Value};

use super::RedfishBmc;
use crate::bmc::odata::{action, list, text, texts_at};
use crate::bmc::transport::Doc;
use crate::bmc::BmcError;
use crate::service::ports::bmc::{PowerAction, PowerState};

const RESET_ACTION: &str = "#ComputerSystem.Reset";

impl RedfishBmc {
    /// Allowed reset types: from `ResetType@Redfish.AllowableValues`, else the action's
    /// `@Redfish.ActionInfo`. Empty when the BMC does not say.
    pub(super) async fn reset_types(&self, sys: &Value) -> Result<Vec<String>, BmcError> {
        let Some(action) = action(sys, RESET_ACTION) else {
            return Ok(Vec::new());
        };
        let listed = texts_at(action, "/ResetType@Redfish.AllowableValues");
        if !listed.is_empty() {
            return Ok(listed);
        }
        if let Some(info) = text(action, "@Redfish.ActionInfo") {
            let doc = self.t.get(&info).await?;
            for p in list(&doc.json, "Parameters") {
                if text(p, "Name").as_deref() == Some("ResetType") {
                    return Ok(texts_at(p, "/AllowableValues"));
                }
            }
        }
        Ok(Vec::new())
    }

    async fn reset(&self, sys: &Value, allowed: &[String], kind: &str) -> Result<(), BmcError> {
        let target = action(sys, RESET_ACTION)
            .and_then(|a| text(a, "target"))
            .ok_or_else(|| {
                BmcError::NotSupported("the system has no ComputerSystem.Reset action".into())
            })?;
        if !allowed.is_empty() && !allowed.iter().any(|a| a == kind) {
            return Err(BmcError::NotSupported(format!(
                "reset type {kind} (allowed: {})",
                allowed.join(", ")
            )));
        }
        tracing::info!(reset = kind, "BMC reset");
        self.t.post(&target, &json!({ "ResetType": kind })).await?;
        Ok(())
    }

    /// Pick the first allowed of `kinds` (or the first when the BMC lists nothing).
    fn pick<'a>(allowed: &[String], kinds: &[&'a str]) -> Option<&'a str> {
        if allowed.is_empty() {
            return kinds.first().copied();
        }
        kinds
            .iter()
            .copied()
            .find(|k| allowed.iter().any(|a| a == k))
    }

    async fn wait_power(
        &self,
        target: PowerState,
        started: Instant,
    ) -> Result<PowerState, BmcError> {
        let limit = self.t.options().power_timeout;
        let deadline = started + limit;
        loop {
            let sys = self.system().await?;
            let state = power_of(&sys)?;
            if state == target {
                return Ok(state);
            }
            if Instant::now() + self.t.options().poll_interval > deadline {
                return Err(BmcError::Deadline {
                    what: format!("power {target}"),
                    after: limit,
                    last: state.to_string(),
                });
            }
            tokio::time::sleep(self.t.options().poll_interval).await;
        }
    }

    /// Run a power operation and wait until the system reaches the state it implies.
    pub(super) async fn power_now(&self, action: PowerAction) -> Result<PowerState, BmcError> {
        let started = Instant::now();
        let sys = self.system().await?;
        let state = power_of(&sys)?;
        let allowed = self.reset_types(&sys.json).await?;
        match action {
            PowerAction::On => {
                if state == PowerState::On {
                    return Ok(state);
                }
                let kind = Self::pick(&allowed, &["On", "ForceOn", "PushPowerButton"]).ok_or_else(
                    || {
                        BmcError::NotSupported(format!(
                            "power on (allowed: {})",
                            allowed.join(", ")
                        ))
                    },
                )?;
                self.reset(&sys.json, &allowed, kind).await?;
                self.wait_power(PowerState::On, started).await
            }
            PowerAction::Off => {
                if state == PowerState::Off {
                    return Ok(state);
                }
                let kind = Self::pick(
                    &allowed,
                    &["ForceOff", "GracefulShutdown", "PushPowerButton"],
                )
                .ok_or_else(|| {
                    BmcError::NotSupported(format!("power off (allowed: {})", allowed.join(", ")))
                })?;
                self.reset(&sys.json, &allowed, kind).await?;
                self.wait_power(PowerState::Off, started).await
            }
            PowerAction::Cycle => {
                if state == PowerState::Off {
                    // Cycling a machine that is off means turning it on.
                    return Box::pin(self.power_now(PowerAction::On)).await;
                }
                if allowed.iter().any(|a| a == "PowerCycle") {
                    self.reset(&sys.json, &allowed, "PowerCycle").await?;
                    return self.wait_power(PowerState::On, started).await;
                }
                tracing::info!("PowerCycle not allowed; cycling as off, wait for Off, on");
                let off = Self::pick(&allowed, &["ForceOff"]).ok_or_else(|| {
                    BmcError::NotSupported(format!("power cycle (allowed: {})", allowed.join(", ")))
                })?;
                self.reset(&sys.json, &allowed, off).await?;
                self.wait_power(PowerState::Off, started).await?;
                let on = Self::pick(&allowed, &["On", "ForceOn"]).ok_or_else(|| {
                    BmcError::NotSupported(format!("power on (allowed: {})", allowed.join(", ")))
                })?;
                let sys = self.system().await?;
                self.reset(&sys.json, &allowed, on).await?;
                self.wait_power(PowerState::On, started).await
            }
            PowerAction::GracefulRestart => {
                if state != PowerState::On {
                    return Err(BmcError::NotSupported(format!(
                        "graceful restart of a system that is {state}"
                    )));
                }
                self.reset(&sys.json, &allowed, "GracefulRestart").await?;
                self.wait_power(PowerState::On, started).await
            }
        }
    }
}

pub(super) fn power_of(sys: &Doc) -> Result<PowerState, BmcError> {
    text(&sys.json, "PowerState")
        .map(|s| PowerState::from_redfish(&s))
        .ok_or_else(|| BmcError::Protocol {
            path: sys.uri.clone(),
            reason: "the system reports no PowerState".into(),
        })
}
