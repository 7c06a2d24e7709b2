//! The one-time boot override: `Boot.BootSourceOverrideTarget`, `...Enabled` and `...Mode` on the
//! ComputerSystem. The target is mapped to what the BMC allows (and what its quirk row prefers for
//! the virtual CD), the mode is sent as the quirk row says, and the override is read back (a few
//! polls) and compared with what was written.
//!
//! What the BMC holds is read by `boot_override` alone, which the capability probe uses too: a
//! `BootSourceOverrideMode` that is absent or `null` makes the mode "not settable" for both.

use serde_json::{json, Value};

use super::RedfishBmc;
use crate::bmc::odata::{text_at, texts_at};
use crate::bmc::quirks::{ModeInPatch, Quirks};
use crate::bmc::transport::Doc;
use crate::bmc::BmcError;
use crate::service::ports::bmc::{BootMode, BootOverride, BootTarget};

/// The boot override a ComputerSystem shows (each field `None` when absent, `null` or blank; so is
/// every field when `Boot` itself is absent or `null`).
pub(super) fn boot_override(sys: &Value) -> BootOverride {
    BootOverride {
        target: text_at(sys, "/Boot/BootSourceOverrideTarget"),
        enabled: text_at(sys, "/Boot/BootSourceOverrideEnabled"),
        mode: text_at(sys, "/Boot/BootSourceOverrideMode"),
    }
}

/// The `BootSourceOverrideTarget` values a ComputerSystem allows; empty when it does not say.
pub(super) fn boot_targets(sys: &Value) -> Vec<String> {
    texts_at(
        sys,
        "/Boot/BootSourceOverrideTarget@Redfish.AllowableValues",
    )
}

impl RedfishBmc {
    async fn boot_override_of(&self) -> Result<(Doc, BootOverride), BmcError> {
        let sys = self.system().await?;
        let ov = boot_override(&sys.json);
        Ok((sys, ov))
    }

    /// Set a one-time boot override and confirm the BMC kept target, enablement and mode.
    pub(super) async fn set_boot_once(
        &self,
        target: BootTarget,
        mode: Option<BootMode>,
    ) -> Result<BootOverride, BmcError> {
        let d = self.discover().await?;
        if target == BootTarget::Http && mode == Some(BootMode::Legacy) {
            return Err(BmcError::NotSupported(
                "HTTP boot needs UEFI mode, not legacy".into(),
            ));
        }
        let (sys, current) = self.boot_override_of().await?;
        let allowed = boot_targets(&sys.json);
        let rf_target = redfish_target(target, &allowed, d.quirks)?;
        let mode_settable = current.mode.is_some();
        if mode.is_some() && !mode_settable {
            return Err(BmcError::NotSupported(
                "the BMC exposes no BootSourceOverrideMode (absent or null; the capability probe reports that as \
                 boot_mode_settable: false), so the boot mode cannot be set: leave the mode out to \
                 boot in the mode the firmware is in"
                    .into(),
            ));
        }
        let wanted_mode: Option<String> = match (mode, d.quirks.mode_in_patch) {
            (Some(m), ModeInPatch::Always) => Some(m.redfish().to_string()),
            (None, ModeInPatch::Always) => current.mode.clone(),
            (Some(m), ModeInPatch::WhenChanging) => {
                if current.mode.as_deref() == Some(m.redfish()) {
                    None
                } else {
                    Some(m.redfish().to_string())
                }
            }
            (None, ModeInPatch::WhenChanging) => None,
        };
        let mut boot = serde_json::Map::new();
        boot.insert("BootSourceOverrideTarget".into(), json!(rf_target));
        boot.insert("BootSourceOverrideEnabled".into(), json!("Once"));
        if let Some(m) = &wanted_mode {
            boot.insert("BootSourceOverrideMode".into(), json!(m));
        }
        let wanted = BootOverride {
            target: Some(rf_target.clone()),
            enabled: Some("Once".into()),
            mode: mode
                .map(|m| m.redfish().to_string())
                .or(current.mode.clone()),
        };
        tracing::info!(target = %rf_target, mode = ?wanted_mode, "BMC boot override");
        self.t
            .patch(
                &sys.uri,
                &json!({ "Boot": Value::Object(boot) }),
                sys.etag.clone(),
            )
            .await?;

        // Read back; a BMC may apply the PATCH a moment later, so give it a few polls.
        let mut actual = BootOverride::default();
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(self.t.options().poll_interval).await;
            }
            actual = self.boot_override_of().await?.1;
            let enabled_ok = actual.enabled.as_deref() == Some("Once")
                || (d.quirks.once_reads_back_continuous
                    && actual.enabled.as_deref() == Some("Continuous"));
            let mode_ok = mode.is_none() || actual.mode == wanted.mode;
            if actual.target == wanted.target && enabled_ok && mode_ok {
                if actual.enabled.as_deref() != Some("Once") {
                    tracing::warn!(enabled = ?actual.enabled, quirks = d.quirks.name,
                        "BMC keeps the boot override as it reads back, not Once");
                }
                return Ok(actual);
            }
        }
        Err(BmcError::BootNotApplied {
            wanted: Box::new(wanted),
            actual: Box::new(actual),
        })
    }
}

fn redfish_target(target: BootTarget, allowed: &[String], q: &Quirks) -> Result<String, BmcError> {
    let candidates: Vec<&str> = match target {
        BootTarget::Pxe => vec!["Pxe"],
        BootTarget::Http => vec!["UefiHttp"],
        BootTarget::Cd => q.cd_boot_target.into_iter().chain(["Cd"]).collect(),
    };
    if allowed.is_empty() {
        // The BMC does not list its targets: the standard name.
        return Ok(candidates.last().copied().unwrap_or("None").to_string());
    }
    candidates
        .iter()
        .find(|c| allowed.iter().any(|a| a == *c))
        .map(|c| c.to_string())
        .ok_or_else(|| {
            BmcError::NotSupported(format!(
                "boot target {target} (the BMC allows: {})",
                allowed.join(", ")
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_null_mode_or_boot_reads_as_absent() {
        let sys = json!({"Boot": {"BootSourceOverrideTarget": "Pxe",
            "BootSourceOverrideEnabled": "Once", "BootSourceOverrideMode": null,
            "BootSourceOverrideTarget@Redfish.AllowableValues": null}});
        let ov = boot_override(&sys);
        assert_eq!(ov.target.as_deref(), Some("Pxe"));
        assert_eq!(ov.mode, None);
        assert!(boot_targets(&sys).is_empty());
        assert_eq!(
            boot_override(&json!({"Boot": null})),
            BootOverride::default()
        );
        assert_eq!(
            boot_override(&json!({"Boot": {"BootSourceOverrideMode": " "}})).mode,
            None
        );
    }
}
