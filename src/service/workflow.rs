//! Provisioning workflows: the one-call reinstall and the automatic reinstall of failed machines.
//!
//! A reinstall opens the machine's provisioning window (its config must render and validate; the
//! machine becomes `provisioning`), then moves through stages, each with a deadline:
//! `power` (one-time network boot and a power cycle through the BMC, or "power-cycle it now" for a
//! tech when there is none) -> `netboot` (the machine fetched its install script) -> `config` (it
//! fetched its config) -> `talos_api` (its Talos API answers `Version` over mutual TLS on TCP
//! 50000 at the address the config was fetched from, with a certificate chained to the cluster's
//! OS CA and the version the cluster declares; see `clusters`) -> `done` (`installed`; the window
//! closes, later network boots boot the local disk). A stage that misses its deadline fails the
//! machine with the stage named; a node that answers with a foreign certificate or another
//! version fails it at once.
//!
//! A person can cancel a reinstall at any stage ([`Workflows::cancel`]): the machine goes to
//! `maintenance` (its window closes, its control-plane and rack slots free up) and the workflow
//! ends as `cancelled` with who did it. The scheduler never reinstalls a machine whose state a
//! person set (`manual_hold`), and a machine with a running reinstall is removed only by force.
//!
//! The engine keeps nothing in memory: [`Workflows::tick`] reads the active rows and moves each
//! on with a compare-and-set on its stage, so a restart or kill -9 resumes from the database and
//! two instances on one PostgreSQL never act twice on one stage. The scheduler (also in `tick`)
//! reinstalls failed machines of clusters whose policy asks for it, with back-off and a maximum
//! number of attempts, under safety rules it enforces itself: one control-plane machine of a
//! cluster at a time, and only while the measured etcd quorum margin allows losing it; at most N
//! workers per rack. After the steps, `tick` lets `clusters` bootstrap clusters that wait for it
//! and measure their health when due.
//!
//! Takes the reinstalls and events ports and the inventory, config and BMC use cases; imports
//! `domain` and nothing from `store`, `http` or `bmc`.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use std::sync::Arc;

use super::bmc::BmcService;
use super::clusters::{Clusters, Verification};
use super::error::ServiceError;
use super::inventory::Inventory;
use super::inventory::PLINTH_ACTOR;
use super::machine_config::ConfigService;
use super::ports::bmc::{BootTarget, PowerAction};
use super::ports::{
    Event, EventFilter, EventStore, MachineFilter, NewEvent, Reinstall, ReinstallPolicy,
    ReinstallStore, Stage,
};
use crate::domain::{LifecycleState, Machine, MachineId, Role};

/// Deadlines and knobs of the workflows (`[workflows]` in the config).
#[derive(Clone, Debug)]
pub struct WorkflowSettings {
    /// Stage `power`.
    pub power: Duration,
    /// Stage `netboot`.
    pub netboot: Duration,
    /// Stage `config`.
    pub config: Duration,
    /// Stage `talos_api`.
    pub talos_api: Duration,
    /// Port of the Talos API (apid).
    pub talos_api_port: u16,
    /// How often each cluster's health is measured.
    pub health_every: Duration,
    /// How long the provisioning window of a reinstall stays open.
    pub window: Duration,
    /// One-time boot target set through the BMC.
    pub boot_target: BootTarget,
}

impl Default for WorkflowSettings {
    fn default() -> Self {
        WorkflowSettings {
            power: Duration::minutes(5),
            netboot: Duration::minutes(15),
            config: Duration::minutes(15),
            talos_api: Duration::minutes(30),
            talos_api_port: 50000,
            health_every: Duration::seconds(60),
            window: Duration::hours(2),
            boot_target: BootTarget::Pxe,
        }
    }
}

impl WorkflowSettings {
    fn deadline(&self, stage: Stage) -> Duration {
        match stage {
            Stage::Power => self.power,
            Stage::Netboot => self.netboot,
            Stage::Config => self.config,
            Stage::TalosApi => self.talos_api,
            Stage::Done | Stage::Failed | Stage::Cancelled => Duration::zero(),
        }
    }
}

/// The workflow use cases.
#[derive(Clone)]
pub struct Workflows {
    inventory: Inventory,
    configs: ConfigService,
    bmc: BmcService,
    reinstalls: Arc<dyn ReinstallStore>,
    events: Arc<dyn EventStore>,
    clusters: Clusters,
    upgrades: Arc<dyn super::ports::upgrades::UpgradeStore>,
    settings: WorkflowSettings,
    measured: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, DateTime<Utc>>>>,
}

/// What a cancel did.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Cancelled {
    /// The machine's state now (`maintenance`).
    pub state: LifecycleState,
    /// The stage the reinstall was cancelled at (none: only a provisioning window was open).
    pub stage: Option<Stage>,
    /// The reinstall as it ended.
    pub reinstall: Option<Reinstall>,
}

/// What a started reinstall tells the caller.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Started {
    /// The reinstall.
    pub reinstall: Reinstall,
    /// What happens next, for the tech (e.g. "power-cycle it now" without a BMC).
    pub next: String,
    /// What the machine will wait for (e.g. its Talos image is not cached yet).
    pub warnings: Vec<String>,
}

fn event(id: MachineId, kind: &str, actor: &str, detail: serde_json::Value) -> NewEvent {
    NewEvent {
        machine_id: Some(id),
        kind: kind.into(),
        actor: actor.into(),
        detail,
    }
}

impl Workflows {
    /// Over the inventory, configs and BMCs, the reinstall rows, the event log, the clusters
    /// (the Talos API) and the upgrade rollouts (a reinstall waits for one).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        inventory: Inventory,
        configs: ConfigService,
        bmc: BmcService,
        reinstalls: Arc<dyn ReinstallStore>,
        events: Arc<dyn EventStore>,
        clusters: Clusters,
        upgrades: Arc<dyn super::ports::upgrades::UpgradeStore>,
        settings: WorkflowSettings,
    ) -> Self {
        Workflows {
            inventory,
            configs,
            bmc,
            reinstalls,
            events,
            clusters,
            upgrades,
            settings,
            measured: std::sync::Arc::default(),
        }
    }

    /// The reinstalls still running, fleet-wide.
    pub async fn active(&self) -> Result<Vec<Reinstall>, ServiceError> {
        Ok(self.reinstalls.active_reinstalls().await?)
    }

    /// The cluster use cases.
    pub fn clusters(&self) -> &Clusters {
        &self.clusters
    }

    /// The reinstall policy of a machine's cluster.
    async fn policy(&self, m: &Machine) -> Result<ReinstallPolicy, ServiceError> {
        let Some(c) = &m.cluster else {
            return Ok(ReinstallPolicy::default());
        };
        let sources = self.configs.sources().await?;
        Ok(sources
            .clusters
            .get(c)
            .and_then(|c| c.spec.reinstall.clone())
            .unwrap_or_default())
    }

    /// Every machine of a cluster.
    async fn cluster_machines(&self, cluster: &str) -> Result<Vec<Machine>, ServiceError> {
        self.inventory
            .all(&MachineFilter {
                cluster: Some(cluster.to_string()),
                limit: 1000,
                ..Default::default()
            })
            .await
    }

    /// The safety rules: `Err` names the rule a reinstall of `m` would break now.
    pub async fn safety(&self, m: &Machine) -> Result<(), String> {
        let Some(cluster) = &m.cluster else {
            return Ok(());
        };
        // A rollout takes nodes down one at a time by its own rules: a reinstall beside it could
        // take a second control plane (or a rack's last worker) down.
        match self.upgrades.latest_rollout(cluster).await {
            Ok(Some((r, _))) if r.state.is_active() => {
                return Err(format!(
                    "cluster {cluster} has an upgrade rollout to {} ({}, {}): reinstalls wait until it ends (plinth cluster upgrade {cluster} --status)",
                    r.to_version, r.state, r.id
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(format!("the upgrade rollouts cannot be read: {e}")),
        }
        let machines = self
            .cluster_machines(cluster)
            .await
            .map_err(|e| e.to_string())?;
        let busy = |o: &Machine| o.id != m.id && o.state == LifecycleState::Provisioning;
        match m.role {
            Some(Role::ControlPlane) => {
                let cps: Vec<&Machine> = machines
                    .iter()
                    .filter(|o| o.role == Some(Role::ControlPlane))
                    .collect();
                if let Some(other) = cps.iter().find(|o| busy(o)) {
                    return Err(format!(
                        "control-plane machine {} of cluster {cluster} is being (re)installed; control planes are reinstalled one at a time so etcd keeps quorum",
                        other.display_name()
                    ));
                }
                let healthy = cps
                    .iter()
                    .filter(|o| o.id != m.id && o.state == LifecycleState::Installed)
                    .count();
                if m.state == LifecycleState::Installed && cps.len() > 1 && healthy == 0 {
                    return Err(format!(
                        "no other control-plane machine of cluster {cluster} is installed: reinstalling this one would take the whole control plane down"
                    ));
                }
                self.quorum_allows(cluster, m).await?;
            }
            Some(Role::Worker) | None => {
                let policy = self.policy(m).await.map_err(|e| e.to_string())?;
                let rack_busy = machines
                    .iter()
                    .filter(|o| o.role != Some(Role::ControlPlane) && o.rack == m.rack)
                    .filter(|o| busy(o))
                    .count();
                if rack_busy >= policy.max_workers_per_rack as usize {
                    return Err(format!(
                        "{rack_busy} worker(s) of rack {} are being (re)installed; the cluster allows {} at once",
                        m.rack.as_deref().unwrap_or("(none)"),
                        policy.max_workers_per_rack
                    ));
                }
            }
        }
        Ok(())
    }

    /// The measured etcd quorum margin must allow taking `m` out when it is a healthy member:
    /// the last measurement when it is fresh (two health intervals), else one made now.
    async fn quorum_allows(&self, cluster: &str, m: &Machine) -> Result<(), String> {
        let fresh = Utc::now() - self.settings.health_every * 2;
        let health = match self.clusters.last_health(cluster).await {
            Ok(Some(h)) if h.checked_at > fresh => h,
            _ => self.clusters.measure(cluster).await.map_err(|e| {
                format!("the etcd quorum of cluster {cluster} cannot be measured: {e}")
            })?,
        };
        let Some(etcd) = &health.etcd else {
            // Not bootstrapped, or no control plane answers: nothing to lose.
            return Ok(());
        };
        let member = health
            .nodes
            .iter()
            .any(|n| n.machine_id == m.id && n.etcd_member_id.is_some());
        if member && etcd.quorum_margin < 1 {
            return Err(format!(
                "etcd of cluster {cluster} has {} healthy member(s) of {} (quorum {}, margin {}, measured {}): taking {} out now would lose quorum",
                etcd.healthy_members,
                etcd.members.len(),
                etcd.quorum,
                etcd.quorum_margin,
                health.checked_at.to_rfc3339(),
                m.display_name()
            ));
        }
        Ok(())
    }

    /// Start a reinstall of machine `id`.
    pub async fn start(
        &self,
        id: MachineId,
        wipe: bool,
        actor: &str,
    ) -> Result<Started, ServiceError> {
        self.start_attempt(id, wipe, actor, false, 1).await
    }

    /// The one-time boot a reinstall of `m` sets through its BMC: its profile's `bootTarget`
    /// (UEFI HTTP boot, virtual media with the profile's `bootMediaUrl`) or else
    /// `[workflows] boot_target`.
    async fn boot_target_of(
        &self,
        m: &crate::domain::Machine,
    ) -> Result<(BootTarget, Option<String>), ServiceError> {
        let profile = match &m.profile {
            Some(p) => self.configs.sources().await?.profiles.get(p).cloned(),
            None => None,
        };
        let target = profile
            .as_ref()
            .and_then(|p| p.boot_target.as_deref())
            .and_then(|t| t.parse::<BootTarget>().ok())
            .unwrap_or(self.settings.boot_target);
        Ok((target, profile.and_then(|p| p.boot_media_url)))
    }

    async fn start_attempt(
        &self,
        id: MachineId,
        wipe: bool,
        actor: &str,
        automatic: bool,
        attempt: u32,
    ) -> Result<Started, ServiceError> {
        let m = self.inventory.get(id).await?;
        if let Some(r) = self.reinstalls.reinstall(id).await? {
            if r.stage.is_active() {
                return Err(ServiceError::Busy(format!(
                    "a reinstall of {} is already running (stage {})",
                    m.display_name(),
                    r.stage.as_str()
                )));
            }
        }
        if !crate::domain::lifecycle::allowed(m.state, LifecycleState::Provisioning) {
            return Err(ServiceError::InvalidTransition {
                from: m.state,
                to: LifecycleState::Provisioning,
            });
        }
        self.safety(&m).await.map_err(ServiceError::Busy)?;
        let mark = self.events.last_event_id().await?;
        self.configs
            .open_window(&self.inventory, id, self.settings.window, wipe, actor)
            .await
            .map_err(|e| match e {
                super::machine_config::OpenError::Service(s) => s,
                super::machine_config::OpenError::Config(c) => ServiceError::from(c),
            })?;
        let now = Utc::now();
        let r = Reinstall {
            machine_id: id,
            stage: Stage::Power,
            stage_started_at: now,
            stage_deadline: now + self.settings.power,
            wipe,
            automatic,
            attempt,
            event_mark: mark,
            node_address: None,
            requested_by: actor.to_string(),
            started_at: now,
            finished_at: None,
            error: None,
            cancelled_by: None,
        };
        let ev = event(
            id,
            "reinstall.started",
            actor,
            serde_json::json!({"wipe": wipe, "automatic": automatic, "attempt": attempt}),
        );
        if !self.reinstalls.start_reinstall(&r, &ev).await? {
            return Err(ServiceError::Busy(format!(
                "a reinstall of {} is already running",
                m.display_name()
            )));
        }
        let next = if m.bmc.is_some() {
            format!(
                "Plinth sets a one-time {} boot and power-cycles the machine through its BMC",
                self.boot_target_of(&m).await?.0
            )
        } else {
            "this machine has no BMC: power-cycle it now and let it boot from the network".into()
        };
        tracing::info!(machine = %id, name = %m.display_name(), actor, automatic, attempt, "reinstall started");
        Ok(Started {
            reinstall: r,
            next,
            warnings: Vec::new(),
        })
    }

    /// Cancel the reinstall of machine `id` at whatever stage it is, as `actor`: the machine is
    /// put in `maintenance` (which closes its provisioning window and frees its control-plane and
    /// rack slots; a person set that state, so the automatic reinstall leaves it alone), then the
    /// workflow ends as `cancelled` with who cancelled it. A provisioning machine without a running
    /// workflow (a window opened by `provision`) is stopped the same way. `Busy` when there is
    /// nothing to cancel.
    pub async fn cancel(&self, id: MachineId, actor: &str) -> Result<Cancelled, ServiceError> {
        let m = self.inventory.get(id).await?;
        let running = self
            .reinstalls
            .reinstall(id)
            .await?
            .filter(|r| r.stage.is_active());
        if running.is_none() && m.state != LifecycleState::Provisioning {
            return Err(ServiceError::Busy(format!(
                "nothing to cancel: {} has no running reinstall and is {}",
                m.display_name(),
                m.state
            )));
        }
        // The machine first: a crash before the workflow's write leaves a machine in maintenance
        // whose workflow the next tick ends as cancelled (see `step`).
        let stage = running.as_ref().map(|r| r.stage);
        if m.state != LifecycleState::Maintenance
            && crate::domain::lifecycle::allowed(m.state, LifecycleState::Maintenance)
        {
            let reason = match stage {
                Some(st) => format!("reinstall cancelled by {actor} at stage {}", st.as_str()),
                None => format!("provisioning cancelled by {actor}"),
            };
            self.inventory
                .set_state_held(
                    id,
                    None,
                    LifecycleState::Maintenance,
                    Some(reason),
                    actor,
                    true,
                )
                .await?;
        }
        let mut reinstall = None;
        if running.is_some() {
            // The tick may move the stage between our read and our write: read again and retry.
            for _ in 0..5 {
                let Some(r) = self.reinstalls.reinstall(id).await? else {
                    break;
                };
                if !r.stage.is_active() {
                    reinstall = Some(r);
                    break;
                }
                if let Some(done) = self.finish_cancelled(&r, actor).await? {
                    reinstall = Some(done);
                    break;
                }
            }
        }
        let m = self.inventory.get(id).await?;
        tracing::info!(machine = %id, name = %m.display_name(), actor, stage = stage.map(Stage::as_str), "reinstall cancelled");
        Ok(Cancelled {
            state: m.state,
            stage,
            reinstall,
        })
    }

    /// End `r` as cancelled by `by`; `None` when it moved on meanwhile.
    async fn finish_cancelled(
        &self,
        r: &Reinstall,
        by: &str,
    ) -> Result<Option<Reinstall>, ServiceError> {
        let mut next = r.clone();
        next.cancelled_by = Some(by.to_string());
        next.error = Some(format!("cancelled by {by} at stage {}", r.stage.as_str()));
        self.advance_as(
            &next,
            Stage::Cancelled,
            serde_json::json!({"stage": r.stage.as_str(), "cancelled_by": by}),
            by,
        )
        .await
    }

    /// Remove machine `id` (at `expected_version`). A machine with a running reinstall is refused
    /// (`Busy`, naming how to cancel it) unless `force`, which cancels the reinstall first (an
    /// event says who) and then removes it.
    pub async fn remove(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        force: bool,
        actor: &str,
    ) -> Result<(), ServiceError> {
        let m = self.inventory.get(id).await?;
        let running = self
            .reinstalls
            .reinstall(id)
            .await?
            .filter(|r| r.stage.is_active());
        let Some(r) = running else {
            return self.inventory.delete(id, expected_version, actor).await;
        };
        let name = m.display_name();
        if !force {
            return Err(ServiceError::Busy(format!(
                "a reinstall of {name} is running (stage {}): cancel it first (plinth machine reinstall {name} --cancel), or remove the machine anyway with --force (?force=true)",
                r.stage.as_str()
            )));
        }
        let expected = expected_version.ok_or(ServiceError::PreconditionRequired)?;
        if expected != m.version {
            return Err(ServiceError::PreconditionFailed {
                expected,
                current: m.version,
            });
        }
        self.cancel(id, actor).await?;
        // The cancel moved the machine to maintenance (a new version): remove that one.
        let now = self.inventory.get(id).await?;
        self.inventory.delete(id, Some(now.version), actor).await
    }

    /// A machine's name for a log line (its id when it cannot be read).
    async fn name_of(&self, id: MachineId) -> String {
        match self.inventory.get(id).await {
            Ok(m) => m.display_name(),
            Err(_) => id.to_string(),
        }
    }

    /// A machine's current or last reinstall.
    pub async fn status(&self, id: MachineId) -> Result<Option<Reinstall>, ServiceError> {
        Ok(self.reinstalls.reinstall(id).await?)
    }

    /// Move every running reinstall on, then let the scheduler start automatic ones. Called
    /// periodically by the server; safe to call from several instances at once.
    pub async fn tick(&self) -> Result<(), ServiceError> {
        for r in self.reinstalls.active_reinstalls().await? {
            if let Err(e) = self.step(r.clone()).await {
                let name = self.name_of(r.machine_id).await;
                tracing::warn!(machine = %r.machine_id, %name, stage = r.stage.as_str(), error = %e, "reinstall step failed");
            }
        }
        if let Err(e) = self.clusters.bootstrap_pending().await {
            tracing::warn!(error = %e, "automatic bootstrap failed");
        }
        self.measure_due().await;
        self.schedule().await
    }

    /// Measure the health of clusters not measured for `health_every`, off the tick.
    async fn measure_due(&self) {
        let Ok(names) = self.clusters.names().await else {
            return;
        };
        let now = Utc::now();
        for name in names {
            let due = match self.measured.lock() {
                Ok(mut seen) => {
                    let due = seen
                        .get(&name)
                        .is_none_or(|at| now - *at >= self.settings.health_every);
                    if due {
                        seen.insert(name.clone(), now);
                    }
                    due
                }
                Err(_) => false,
            };
            if due {
                let clusters = self.clusters.clone();
                tokio::spawn(async move {
                    if let Err(e) = clusters.measure(&name).await {
                        tracing::warn!(cluster = %name, error = %e, "cluster health not measured");
                    }
                });
            }
        }
    }

    async fn advance(
        &self,
        r: &Reinstall,
        to: Stage,
        detail: serde_json::Value,
    ) -> Result<Option<Reinstall>, ServiceError> {
        self.advance_as(r, to, detail, PLINTH_ACTOR).await
    }

    /// Move `r` on to `to` (compare-and-set on its stage) with its event, written as `actor`.
    async fn advance_as(
        &self,
        r: &Reinstall,
        to: Stage,
        detail: serde_json::Value,
        actor: &str,
    ) -> Result<Option<Reinstall>, ServiceError> {
        let now = Utc::now();
        let mut next = r.clone();
        next.stage = to;
        next.stage_started_at = now;
        next.stage_deadline = now + self.settings.deadline(to);
        if !to.is_active() {
            next.finished_at = Some(now);
        }
        let ev = event(
            r.machine_id,
            &format!("reinstall.{}", to.as_str()),
            actor,
            detail,
        );
        Ok(self
            .reinstalls
            .advance_reinstall(&next, r.stage, &ev)
            .await?
            .then_some(next))
    }

    async fn fail(&self, r: &Reinstall, why: String) -> Result<(), ServiceError> {
        // The machine's state first (unless it is already failed, keeping the reason it has): a
        // crash between the two writes leaves a failed machine whose workflow the next tick
        // closes, never a closed workflow whose machine stays provisioning with its window open.
        let m = self.inventory.get(r.machine_id).await?;
        if m.state != LifecycleState::Failed {
            match self
                .inventory
                .set_state(
                    r.machine_id,
                    None,
                    LifecycleState::Failed,
                    Some(format!("reinstall: {why}")),
                    "plinth",
                )
                .await
            {
                Ok(_) | Err(ServiceError::InvalidTransition { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let mut failed = r.clone();
        failed.error = Some(why.clone());
        if self
            .advance(
                &failed,
                Stage::Failed,
                serde_json::json!({"stage": r.stage.as_str(), "error": why}),
            )
            .await?
            .is_some()
        {
            let name = self.name_of(r.machine_id).await;
            tracing::warn!(machine = %r.machine_id, %name, stage = r.stage.as_str(), error = %why, "reinstall failed");
        }
        Ok(())
    }

    async fn seen(&self, r: &Reinstall, kind: &str) -> Result<Vec<Event>, ServiceError> {
        Ok(self
            .events
            .list_events(&EventFilter {
                machine_id: Some(r.machine_id),
                kind_prefix: Some(kind.to_string()),
                after_id: Some(r.event_mark),
                limit: 100,
            })
            .await?)
    }

    async fn step(&self, r: Reinstall) -> Result<(), ServiceError> {
        let now = Utc::now();
        let m = match self.inventory.get(r.machine_id).await {
            Ok(m) => m,
            Err(ServiceError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        // Someone put the machine in maintenance (a cancel that stopped between its two writes,
        // or a person by hand): the workflow ends as cancelled, by whoever did it.
        if m.state == LifecycleState::Maintenance {
            let by = m.state_by.clone().unwrap_or_else(|| "unknown".into());
            self.finish_cancelled(&r, &by).await?;
            return Ok(());
        }
        // Someone moved the machine out of provisioning by hand: the workflow ends with it.
        if m.state != LifecycleState::Provisioning && r.stage != Stage::Power {
            if m.state == LifecycleState::Installed {
                self.advance(
                    &r,
                    Stage::Done,
                    serde_json::json!({"node_address": r.node_address, "installed_by": "state change"}),
                )
                .await?;
            } else {
                self.fail(
                    &r,
                    format!(
                        "the machine was set to {} during stage {}",
                        m.state,
                        r.stage.as_str()
                    ),
                )
                .await?;
            }
            return Ok(());
        }
        match r.stage {
            Stage::Power => {
                // Claim the stage first: only one instance power-cycles.
                let Some(next) = self
                    .advance(
                        &r,
                        Stage::Netboot,
                        serde_json::json!({"bmc": m.bmc.is_some()}),
                    )
                    .await?
                else {
                    return Ok(());
                };
                if m.bmc.is_none() {
                    self.events
                        .append_event(&event(
                            m.id,
                            "reinstall.power_cycle_needed",
                            "plinth",
                            serde_json::json!({"message": "no BMC: power-cycle this machine now and let it boot from the network"}),
                        ))
                        .await?;
                    return Ok(());
                }
                let reference = m.id.to_string();
                let (target, media) = self.boot_target_of(&m).await?;
                // The BMC may take minutes (power transitions are waited for): off the tick, so
                // one slow BMC never holds up the other reinstalls or the scheduler.
                let this = self.clone();
                tokio::spawn(async move {
                    let result = async {
                        if target == BootTarget::Cd {
                            let url = media.clone().unwrap_or_default();
                            this.bmc.media_insert(&reference, &url, "plinth").await?;
                        }
                        this.bmc
                            .boot_once(&reference, target, None, "plinth")
                            .await?;
                        let state = this.bmc.power_state(&reference).await?;
                        let action = if state.power_state == "off" {
                            PowerAction::On
                        } else {
                            PowerAction::Cycle
                        };
                        this.bmc.power(&reference, action, "plinth").await
                    }
                    .await;
                    if let Err(e) = result {
                        // Only if the reinstall is still where this power-cycle left it.
                        let current = this.reinstalls.reinstall(next.machine_id).await;
                        if let Ok(Some(cur)) = current {
                            if cur.stage == next.stage
                                && cur.stage_started_at == next.stage_started_at
                            {
                                if let Err(e2) = this
                                    .fail(&cur, format!("stage power: the BMC failed: {e}"))
                                    .await
                                {
                                    tracing::warn!(machine = %cur.machine_id, error = %e2, "reinstall: could not record the BMC failure");
                                }
                            }
                        }
                    }
                });
            }
            Stage::Netboot => {
                let scripts = self.seen(&r, "boot.script").await?;
                let installing = scripts
                    .iter()
                    .any(|e| e.detail.get("plan").and_then(|p| p.as_str()) == Some("install"));
                let fetched = !self.seen(&r, "config.served").await?.is_empty();
                if installing || fetched {
                    self.advance(&r, Stage::Config, serde_json::json!({}))
                        .await?;
                } else if now > r.stage_deadline {
                    self.missed(&r).await?;
                }
            }
            Stage::Config => {
                let served = self.seen(&r, "config.served").await?;
                if let Some(e) = served.last() {
                    let mut next = r.clone();
                    next.node_address = e
                        .detail
                        .get("from")
                        .and_then(|f| f.as_str())
                        .map(str::to_string);
                    self.advance(
                        &next,
                        Stage::TalosApi,
                        serde_json::json!({"node_address": next.node_address}),
                    )
                    .await?;
                } else if now > r.stage_deadline {
                    self.missed(&r).await?;
                }
            }
            Stage::TalosApi => {
                let verified = match &r.node_address {
                    Some(a) => self.clusters.verify_install(&m, a).await?,
                    None => Verification::NotYet("no node address".into()),
                };
                if let Verification::Rejected(why) = &verified {
                    self.fail(&r, format!("stage talos_api: {why}")).await?;
                    return Ok(());
                }
                if let Verification::Verified(v) = verified {
                    // The machine's state first: a crash between the two writes leaves an
                    // installed machine whose workflow the next tick closes (see above), never
                    // a finished workflow whose machine stays provisioning.
                    self.inventory
                        .set_state(m.id, None, LifecycleState::Installed, None, "plinth")
                        .await?;
                    self.advance(
                        &r,
                        Stage::Done,
                        serde_json::json!({"node_address": r.node_address,
                            "talos_version": v.talos_version, "cert_sha256": v.cert_sha256}),
                    )
                    .await?;
                    tracing::info!(machine = %m.id, name = %m.display_name(), talos_version = %v.talos_version, "reinstall done: installed");
                } else if now > r.stage_deadline {
                    self.missed(&r).await?;
                }
            }
            Stage::Done | Stage::Failed | Stage::Cancelled => {}
        }
        Ok(())
    }

    async fn missed(&self, r: &Reinstall) -> Result<(), ServiceError> {
        let secs = self.settings.deadline(r.stage).num_seconds();
        self.fail(
            r,
            format!("stage {} missed its deadline of {secs} s", r.stage.as_str()),
        )
        .await
    }

    /// Start automatic reinstalls of failed machines whose cluster asks for them.
    async fn schedule(&self) -> Result<(), ServiceError> {
        let mut failed = self
            .inventory
            .all(&MachineFilter {
                state: Some(LifecycleState::Failed),
                limit: 1000,
                ..Default::default()
            })
            .await?;
        if failed.is_empty() {
            return Ok(());
        }
        let sources = self.configs.sources().await?;
        // Oldest failure first, so machines take turns under the safety rules.
        failed.sort_by_key(|m| m.updated_at);
        let now = Utc::now();
        for m in failed {
            let Some(policy) = m
                .cluster
                .as_ref()
                .and_then(|c| sources.clusters.get(c))
                .and_then(|c| c.spec.reinstall.clone())
            else {
                continue;
            };
            if !policy.auto {
                continue;
            }
            // A person marked it failed (or cancelled its reinstall): theirs to decide.
            if m.manual_hold {
                tracing::debug!(machine = %m.id, name = %m.display_name(), by = ?m.state_by, "automatic reinstall skipped: a person set the machine's state");
                continue;
            }
            let last = self.reinstalls.reinstall(m.id).await?;
            let (attempts, since) = match &last {
                Some(r) if r.stage.is_active() => continue,
                Some(r) if r.automatic && r.stage == Stage::Failed => {
                    (r.attempt, r.finished_at.unwrap_or(m.updated_at))
                }
                _ => (0, m.updated_at),
            };
            if attempts >= policy.max_attempts {
                continue;
            }
            if now < since + policy.backoff_before(attempts + 1) {
                continue;
            }
            match self
                .start_attempt(m.id, false, "plinth", true, attempts + 1)
                .await
            {
                Ok(_) => {}
                Err(ServiceError::Busy(why)) => {
                    tracing::debug!(machine = %m.id, name = %m.display_name(), why, "automatic reinstall waits");
                }
                Err(e) => {
                    tracing::warn!(machine = %m.id, name = %m.display_name(), error = %e, "automatic reinstall not started");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_first_automatic_attempt() {
        let p = ReinstallPolicy {
            auto: true,
            max_attempts: 5,
            backoff_seconds: 10,
            max_workers_per_rack: 1,
        };
        let secs: Vec<i64> = (1..=4).map(|a| p.backoff_before(a).num_seconds()).collect();
        assert_eq!(secs, [10, 20, 40, 80]);
        let huge = ReinstallPolicy {
            backoff_seconds: u64::MAX,
            ..p
        };
        assert_eq!(huge.backoff_before(40), Duration::days(100 * 366));
    }
}
