//! The `ReinstallStore` port: each machine's current (or last) reinstall, moved on stage by stage
//! with a compare-and-set so two instances never act twice on one stage; and the per-cluster
//! reinstall policy, declared with the cluster. Imports `domain` and the other ports only.

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::events::NewEvent;
use crate::domain::MachineId;

/// Stage of a reinstall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Set a one-time network boot and power-cycle.
    Power,
    /// Wait for the machine to fetch its install script.
    Netboot,
    /// Wait for the machine to fetch its config.
    Config,
    /// Wait for the Talos API to answer.
    TalosApi,
    /// Installed.
    Done,
    /// Failed (see `error`).
    Failed,
    /// Stopped by a person (see `cancelled_by`); the machine is left in `maintenance`.
    Cancelled,
}

impl Stage {
    /// The database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Power => "power",
            Stage::Netboot => "netboot",
            Stage::Config => "config",
            Stage::TalosApi => "talos_api",
            Stage::Done => "done",
            Stage::Failed => "failed",
            Stage::Cancelled => "cancelled",
        }
    }

    /// Still running.
    pub fn is_active(self) -> bool {
        !matches!(self, Stage::Done | Stage::Failed | Stage::Cancelled)
    }
}

impl std::str::FromStr for Stage {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "power" => Stage::Power,
            "netboot" => Stage::Netboot,
            "config" => Stage::Config,
            "talos_api" => Stage::TalosApi,
            "done" => Stage::Done,
            "failed" => Stage::Failed,
            "cancelled" => Stage::Cancelled,
            other => return Err(format!("`{other}` is not a reinstall stage")),
        })
    }
}

/// A machine's current (or last) reinstall.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Reinstall {
    /// The machine.
    pub machine_id: MachineId,
    /// Where it is.
    pub stage: Stage,
    /// When the stage began.
    pub stage_started_at: DateTime<Utc>,
    /// When the stage fails if nothing happened.
    pub stage_deadline: DateTime<Utc>,
    /// Wipe the system disk on the install boot.
    pub wipe: bool,
    /// Started by the scheduler (automatic reinstall) rather than a person.
    pub automatic: bool,
    /// Attempt number in a chain of automatic reinstalls (1 for manual ones).
    pub attempt: u32,
    /// Events after this id belong to this reinstall.
    #[serde(skip)]
    pub event_mark: i64,
    /// Address the config was fetched from: where the Talos API is expected.
    pub node_address: Option<String>,
    /// Who asked.
    pub requested_by: String,
    /// Started at.
    pub started_at: DateTime<Utc>,
    /// Finished at.
    pub finished_at: Option<DateTime<Utc>>,
    /// Why it failed.
    pub error: Option<String>,
    /// Who cancelled it (an event actor, e.g. `token:alice`).
    pub cancelled_by: Option<String>,
}

/// Reinstalls, one row per machine.
#[async_trait]
pub trait ReinstallStore: Send + Sync + 'static {
    /// A machine's current or last reinstall.
    async fn reinstall(&self, id: MachineId) -> Result<Option<Reinstall>, StoreError>;
    /// Every running reinstall.
    async fn active_reinstalls(&self) -> Result<Vec<Reinstall>, StoreError>;
    /// Start one (replacing the machine's finished one), with its event; false when one is
    /// already running for the machine.
    async fn start_reinstall(&self, r: &Reinstall, event: &NewEvent) -> Result<bool, StoreError>;
    /// Move one on, only if it is still at `from` (compare-and-set), with its event.
    async fn advance_reinstall(
        &self,
        r: &Reinstall,
        from: Stage,
        event: &NewEvent,
    ) -> Result<bool, StoreError>;
}

/// Per-cluster reinstall policy (`reinstall:` of a Cluster in the inventory directory).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReinstallPolicy {
    /// Reinstall failed machines automatically (off by default).
    #[serde(default)]
    pub auto: bool,
    /// Automatic attempts before the machine is left failed for a human.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Back-off before the first automatic attempt, doubled for each further one, seconds.
    #[serde(default = "default_backoff")]
    pub backoff_seconds: u64,
    /// Workers of one rack reinstalled at once (manual or automatic).
    #[serde(default = "default_workers_per_rack")]
    pub max_workers_per_rack: u32,
}

fn default_attempts() -> u32 {
    3
}
fn default_backoff() -> u64 {
    300
}
fn default_workers_per_rack() -> u32 {
    1
}

impl ReinstallPolicy {
    /// How long after the last failure automatic attempt `attempt` (1-based) may start:
    /// `backoffSeconds` before the first, doubled for each further one, at most a century (in
    /// range of any date arithmetic: it means "not in this machine's lifetime").
    pub fn backoff_before(&self, attempt: u32) -> Duration {
        const CENTURY: i64 = 100 * 366 * 24 * 3600;
        let factor = 1u64 << attempt.saturating_sub(1).min(16);
        let secs = self.backoff_seconds.saturating_mul(factor);
        Duration::seconds(i64::try_from(secs).unwrap_or(CENTURY).min(CENTURY))
    }
}

impl Default for ReinstallPolicy {
    fn default() -> Self {
        ReinstallPolicy {
            auto: false,
            max_attempts: default_attempts(),
            backoff_seconds: default_backoff(),
            max_workers_per_rack: default_workers_per_rack(),
        }
    }
}
