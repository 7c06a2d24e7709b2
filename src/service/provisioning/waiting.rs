//! Why machines wait, for the operator's overview: the provisioning machines whose boot holds now
//! (with the reason their last boot plan gave: image not cached, window closed, a config that
//! does not render; or a config release awaiting approval), and the image cache of every declared
//! cluster (cached or not, and the command that fills it). Read-only: looking never starts a
//! pull.
//!
//! Part of `ProvisioningService`; imports `domain`, the ports and the rest of `service`.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::images::{image_files, pull_command};
use super::ProvisioningService;
use crate::domain::dhcp::Arch;
use crate::domain::{LifecycleState, Machine};
use crate::service::{EventFilter, MachineFilter, ServiceError};

/// Provisioning machines looked at for holds, at most (one indexed read each).
const HOLDS_SCANNED: u32 = 200;

/// A machine whose boot waits, and why.
#[derive(Clone, Debug)]
pub struct Held {
    /// The machine.
    pub machine: Machine,
    /// Why, as its boot plan (or its config's release) says.
    pub reason: String,
    /// Since when the reason was given (its last boot poll); `None` for an approval hold.
    pub since: Option<DateTime<Utc>>,
}

/// The machines in provisioning whose boot holds.
#[derive(Clone, Debug, Default)]
pub struct Holds {
    /// Held machines, in inventory order.
    pub held: Vec<Held>,
    /// Machines in provisioning in all.
    pub provisioning: i64,
    /// How many of them were looked at (the first [`HOLDS_SCANNED`]).
    pub scanned: usize,
}

/// One architecture's image of a declared cluster.
#[derive(Clone, Debug, Serialize)]
pub struct ArchImage {
    /// `amd64` or `arm64`.
    pub arch: &'static str,
    /// Both kernel and initramfs are in the cache.
    pub cached: bool,
    /// Files missing from the cache.
    pub missing: Vec<String>,
    /// The command that puts them there.
    pub pull_command: String,
}

/// The image cache of one declared cluster.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterImage {
    /// Cluster name.
    pub cluster: String,
    /// Talos version.
    pub version: String,
    /// Image Factory schematic.
    pub schematic: String,
    /// Per architecture.
    pub arches: Vec<ArchImage>,
}

fn arch_name(a: Arch) -> &'static str {
    match a {
        Arch::Amd64 => "amd64",
        Arch::Arm64 => "arm64",
    }
}

/// The hold reason of a boot plan event (`boot.script` with plan `hold`), if it is one.
fn hold_reason(e: &crate::service::Event) -> Option<String> {
    if e.detail.get("plan").and_then(|p| p.as_str()) != Some("hold") {
        return None;
    }
    e.detail
        .get("reason")
        .and_then(|r| r.as_str())
        .map(str::to_string)
}

impl ProvisioningService {
    /// The machines in provisioning whose boot holds now: a config release awaiting approval, or
    /// a last boot plan that held (its reason). At most the first 200 provisioning machines are
    /// looked at; `Holds` says how many there are.
    pub async fn holds(&self) -> Result<Holds, ServiceError> {
        let page = self
            .inner
            .inventory
            .list(&MachineFilter {
                state: Some(LifecycleState::Provisioning),
                limit: HOLDS_SCANNED,
                ..Default::default()
            })
            .await?;
        let mut held = Vec::new();
        for m in &page.items {
            if let Some(reason) = self.inner.configs.hold(m).await? {
                held.push(Held {
                    machine: m.clone(),
                    reason,
                    since: None,
                });
                continue;
            }
            let last = self
                .inner
                .inventory
                .events(&EventFilter {
                    machine_id: Some(m.id),
                    kind_prefix: Some("boot.".into()),
                    after_id: None,
                    limit: 1,
                })
                .await?;
            if let Some((e, reason)) = last.last().and_then(|e| Some((e, hold_reason(e)?))) {
                held.push(Held {
                    machine: m.clone(),
                    reason,
                    since: Some(e.at),
                });
            }
        }
        Ok(Holds {
            held,
            provisioning: page.total,
            scanned: page.items.len(),
        })
    }

    /// The image cache of every declared cluster: for amd64 and arm64, whether kernel and
    /// initramfs of its Talos version and schematic are cached, and the pull command.
    pub async fn image_cache(&self) -> Result<Vec<ClusterImage>, ServiceError> {
        let images = &self.inner.images;
        let clusters = self.inner.configs.cluster_images().await?;
        Ok(clusters
            .into_iter()
            .map(|(cluster, version, schematic)| {
                let arches = [Arch::Amd64, Arch::Arm64]
                    .into_iter()
                    .map(|arch| {
                        let missing: Vec<String> = image_files(arch)
                            .into_iter()
                            .filter(|f| {
                                !matches!(images.cached(&schematic, &version, f), Ok(Some(_)))
                            })
                            .collect();
                        ArchImage {
                            arch: arch_name(arch),
                            cached: missing.is_empty(),
                            missing,
                            pull_command: pull_command(&schematic, &version, arch),
                        }
                    })
                    .collect();
                ClusterImage {
                    cluster,
                    version,
                    schematic,
                    arches,
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(detail: serde_json::Value) -> crate::service::Event {
        crate::service::Event {
            id: 1,
            machine_id: None,
            machine: None,
            kind: "boot.script".into(),
            actor: "boot".into(),
            detail,
            at: Utc::now(),
        }
    }

    #[test]
    fn only_a_held_plan_is_a_hold() {
        assert_eq!(
            hold_reason(&event(
                serde_json::json!({"plan": "hold", "reason": "window closed: x"})
            )),
            Some("window closed: x".into())
        );
        assert_eq!(
            hold_reason(&event(serde_json::json!({"plan": "install"}))),
            None
        );
        assert_eq!(
            hold_reason(&event(
                serde_json::json!({"plan": "discovery", "reason": "unknown machine"})
            )),
            None
        );
    }
}
