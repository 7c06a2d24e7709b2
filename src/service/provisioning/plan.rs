//! The boot plan of one iPXE request for `/boot/machine.ipxe`: find the machine (or register it
//! as discovered), decide install / local disk / discovery / hold, and for an install boot mint
//! the boot's install ticket (its config token) and point it at the cached Talos image of its
//! cluster. The plan is recorded as the machine's `boot.*` event and returned as the iPXE script
//! that carries it out.
//!
//! Imports `domain` and the rest of `service`.

use std::net::IpAddr;

use super::identity::BootIdentity;
use super::images::{image_files, pull_command, Readiness};
use super::ProvisioningService;
use crate::domain::boot::{
    arch_of_buildarch, decide, error_script, generic_script, machine_script, BootPlan,
    InstallAssets,
};
use crate::domain::dhcp::Arch;
use crate::domain::{LifecycleState, MacAddr, Machine};
use crate::service::machine_config::Ticket;
use crate::service::ports::NewEvent;

/// An iPXE script request.
#[derive(Clone, Debug)]
pub struct ScriptRequest {
    /// What iPXE told.
    pub who: BootIdentity,
    /// Where the request came from.
    pub peer: IpAddr,
    /// The `Host` header, used when no public URL is configured.
    pub host: Option<String>,
}

/// How a script request went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptOutcome {
    /// The machine's script.
    Served,
    /// The request cannot be answered (no MAC): 400, with a script that says so.
    BadRequest,
    /// Plinth cannot decide now (a store fault): 503, with a script that retries.
    Unavailable,
    /// An unknown machine past a discovery bound: 429, with a script that retries later.
    Deferred,
}

/// A script and how it went.
#[derive(Clone, Debug)]
pub struct ScriptAnswer {
    /// The outcome.
    pub outcome: ScriptOutcome,
    /// The iPXE script.
    pub script: String,
}

/// Seconds an unknown machine past a discovery bound waits before it asks again.
const DEFERRED_RETRY_SECS: u32 = 60;

/// Seconds between polls of a machine whose install waits for something.
const HOLD_RETRY_SECS: u32 = 30;

impl ProvisioningService {
    /// `/boot.ipxe`: the generic first script.
    pub fn generic_script(&self, host: Option<&str>) -> String {
        generic_script(&self.base_url(host))
    }

    /// `/boot/machine.ipxe`: this machine's script.
    pub async fn machine_script(&self, req: &ScriptRequest) -> ScriptAnswer {
        let base = self.base_url(req.host.as_deref());
        let Some(mac) = req.who.mac() else {
            return ScriptAnswer {
                outcome: ScriptOutcome::BadRequest,
                script: error_script("the boot request carries no MAC address", Some(10)),
            };
        };
        let arch = req
            .who
            .buildarch
            .as_deref()
            .and_then(arch_of_buildarch)
            .unwrap_or(Arch::Amd64);
        let (m, discovered) = match self
            .inner
            .identities
            .find_or_discover(&self.inner.inventory, mac, &req.who, req.peer)
            .await
        {
            Ok(Some(x)) => x,
            Ok(None) => {
                return ScriptAnswer {
                    outcome: ScriptOutcome::Deferred,
                    script: error_script(
                        "too many unknown machines are booting: not registered yet, retrying",
                        Some(DEFERRED_RETRY_SECS),
                    ),
                };
            }
            Err(e) => {
                tracing::error!(error = %e, %mac, "boot: machine look-up failed");
                // A fault is a 5xx: iPXE's generic script retries.
                return ScriptAnswer {
                    outcome: ScriptOutcome::Unavailable,
                    script: error_script("inventory unavailable", None),
                };
            }
        };
        let plan = self.plan(&m, arch, &base, req.peer).await;
        let self_url = format!(
            "{base}/boot/machine.ipxe?mac={}&uuid={}&buildarch={}&platform={}",
            mac.to_string().replace(':', "-"),
            req.who.uuid.as_deref().unwrap_or(""),
            req.who.buildarch.as_deref().unwrap_or(""),
            req.who.platform.as_deref().unwrap_or("")
        );
        self.record_plan(&m, mac, &plan, discovered, req).await;
        ScriptAnswer {
            outcome: ScriptOutcome::Served,
            script: machine_script(&plan, &self_url),
        }
    }

    /// Decide the plan of `m`.
    async fn plan(&self, m: &Machine, arch: Arch, base: &str, peer: IpAddr) -> BootPlan {
        if m.state != LifecycleState::Provisioning {
            return decide(m, None);
        }
        match self.install_assets(m, arch, base, peer).await {
            Ok(Some(assets)) => decide(m, Some(assets)),
            Ok(None) => BootPlan::Hold {
                reason: format!(
                    "window closed: {name} has no open provisioning window (none was opened, or it expired or was closed): open one with `plinth machine provision {name}`, or stop with `plinth machine reinstall {name} --cancel`",
                    name = m.display_name()
                ),
                retry_secs: HOLD_RETRY_SECS,
            },
            Err(reason) => BootPlan::Hold {
                reason,
                retry_secs: HOLD_RETRY_SECS,
            },
        }
    }

    /// What an install boot of `m` loads: the cached kernel and initramfs of its cluster's Talos
    /// version and schematic, and its config URL with a token minted for this boot. `Ok(None)`: no
    /// provisioning window is open; `Err`: why it cannot install yet (shown on the console).
    async fn install_assets(
        &self,
        m: &Machine,
        arch: Arch,
        base: &str,
        peer: IpAddr,
    ) -> Result<Option<InstallAssets>, String> {
        let ready = |version: &str, schematic: &str| {
            match self.readiness(
            schematic,
            version,
            arch,
            Some(m.id),
        ) {
            Readiness::Ready => Ok(()),
            Readiness::Missing { file } => Err(format!(
                "image not cached: Talos {version} {file} of schematic {schematic} is not in the image cache and no Image Factory is configured: run `{}` (or `plinth image import`)",
                pull_command(schematic, version, arch)
            )),
            Readiness::Pulling { file, source } => Err(format!(
                "image not cached yet: Talos {version} {file} of schematic {schematic} is being downloaded from {source} (kernel and initramfs, once; image.pull_progress events); `{}` does the same by hand",
                pull_command(schematic, version, arch)
            )),
        }
        };
        let ticket = match self.inner.configs.install_ticket(m, peer, ready).await {
            Ok(Ticket::Issued(t)) => t,
            Ok(Ticket::NoWindow) => return Ok(None),
            Ok(Ticket::NotFromMachine) => {
                return Err(
                    "an install is handed out only to a request from the machine's own address"
                        .into(),
                )
            }
            Ok(Ticket::Waiting(why)) => return Err(why),
            Err(e) => {
                tracing::warn!(machine = %m.id, name = %m.display_name(), error = %e, "boot: the machine's config does not render");
                return Err(format!("the machine config does not render: {e}"));
            }
        };
        let (schematic, version) = (&ticket.schematic_id, &ticket.talos_version);
        let talos_version = version
            .parse::<crate::talos::TalosVersion>()
            .map_err(|e| format!("the cluster's talosVersion: {e}"))?;
        let images = format!(
            "{}/images/{schematic}/{version}",
            self.inner.settings.images_door.base(base)
        );
        let [kernel, initramfs] = image_files(arch);
        Ok(Some(InstallAssets {
            kernel_url: format!("{images}/{kernel}"),
            initramfs_url: format!("{images}/{initramfs}"),
            // Talos substitutes ${uuid} in the query string only (iPXE may already have).
            config_url: format!(
                "{base}/config/{}?token={}&uuid=${{uuid}}",
                m.id, ticket.token
            ),
            talos_args: crate::talos::kernel::pxe_args(
                talos_version,
                arch,
                &ticket.schematic_kernel_args,
            ),
            extra_args: ticket.kernel_args,
            wipe: ticket.wipe,
            approval_code: ticket.approval_code,
        }))
    }

    /// The plan as the machine's `boot.script` (or `boot.discovered`) event, and a log line.
    async fn record_plan(
        &self,
        m: &Machine,
        mac: MacAddr,
        plan: &BootPlan,
        discovered: bool,
        req: &ScriptRequest,
    ) {
        let mut detail = serde_json::json!({
            "plan": plan.name(), "mac": mac, "from": req.peer.to_string(),
            "platform": req.who.platform, "buildarch": req.who.buildarch, "state": m.state,
        });
        let reason = match plan {
            BootPlan::Hold { reason, .. } => Some(reason.clone()),
            BootPlan::Discovery => Some(format!(
                "unknown machine: waiting for an operator to accept it (`plinth machine state {} registered`)",
                mac
            )),
            _ => None,
        };
        if let (Some(reason), serde_json::Value::Object(o)) = (reason, &mut detail) {
            o.insert("reason".into(), reason.into());
        }
        let kind = if discovered {
            "boot.discovered"
        } else {
            "boot.script"
        };
        tracing::info!(machine = %m.id, name = %m.display_name(), %mac, plan = plan.name(), discovered, from = %req.peer, "boot script");
        // Anonymous requests write this event: a burst per machine, plan and address, then a
        // rate, the requests between counted into the next one.
        let Some(suppressed) = self.scripts.admit(&(m.id, kind, plan.name(), req.peer)) else {
            return;
        };
        if let (true, serde_json::Value::Object(o)) = (suppressed > 0, &mut detail) {
            o.insert("suppressed".into(), suppressed.into());
        }
        let event = NewEvent {
            machine_id: Some(m.id),
            kind: kind.into(),
            actor: "boot".into(),
            detail,
        };
        if let Err(e) = self.inner.events.append_event(&event).await {
            tracing::warn!(error = %e, "boot: timeline event not written");
        }
    }
}
