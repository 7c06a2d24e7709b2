//! The `InventoryStore` trait: what the service needs from a database. Implemented for SQLite and
//! PostgreSQL in `crate::store`; every write that must survive a crash is one transaction there.

use std::fmt;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::auth::{NewToken, TokenInfo};
use crate::domain::{LifecycleState, Machine, MachineId, MachineSpec, Role, UniqueKey};

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The row does not exist.
    #[error("not found")]
    NotFound,
    /// Optimistic concurrency: the row moved on.
    #[error("version {expected} is stale; current is {current}")]
    VersionMismatch {
        /// Version the caller based its change on.
        expected: i64,
        /// Version in the database.
        current: i64,
    },
    /// A uniqueness constraint refused the write.
    #[error("unique values already taken")]
    Conflict(Vec<Conflict>),
    /// The database itself failed (connection, I/O, a constraint we did not expect).
    #[error("database: {0}")]
    Backend(String),
}

/// One unique value that belongs to another machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Conflict {
    /// Field path in the caller's input, e.g. `interfaces[0].mac`.
    pub field: String,
    /// The value, as text.
    pub value: String,
    /// The machine that holds it.
    pub owner: MachineRef,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} already belongs to machine {} ({})",
            self.field, self.value, self.owner.name, self.owner.id
        )
    }
}

/// A short reference to a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MachineRef {
    /// Inventory id.
    pub id: MachineId,
    /// Hostname, serial or id.
    pub name: String,
}

/// What happens to a stored BMC password on a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordChange {
    /// Leave it as it is.
    Keep,
    /// Remove it.
    Clear,
    /// Replace it with this ciphertext (sealed by `SecretBox`).
    Set(Vec<u8>),
}

/// A validated machine plus what to do with its BMC password. `spec.bmc.password` is always `None`.
#[derive(Clone, Debug)]
pub struct MachineRecord {
    /// Validated spec, password stripped.
    pub spec: MachineSpec,
    /// Password change.
    pub password: PasswordChange,
}

/// An event to append.
#[derive(Clone, Debug)]
pub struct NewEvent {
    /// The machine it concerns, if any.
    pub machine_id: Option<MachineId>,
    /// Kind, e.g. `machine.created`.
    pub kind: String,
    /// Who: a token name, `cli`, or `plinth` for the server itself.
    pub actor: String,
    /// Details; never secrets.
    pub detail: serde_json::Value,
}

/// An event of the append-only log.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// Sequence number.
    pub id: i64,
    /// Machine it concerns.
    pub machine_id: Option<MachineId>,
    /// Kind.
    pub kind: String,
    /// Who did it.
    pub actor: String,
    /// Details.
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
    /// When.
    pub at: DateTime<Utc>,
}

/// Filters of the event log.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// Only this machine.
    pub machine_id: Option<MachineId>,
    /// Only kinds starting with this.
    pub kind_prefix: Option<String>,
    /// Only events after this sequence number.
    pub after_id: Option<i64>,
    /// At most this many (newest last).
    pub limit: u32,
}

/// Filters and page of a machine listing.
#[derive(Clone, Debug, Default)]
pub struct MachineFilter {
    /// Lifecycle state.
    pub state: Option<LifecycleState>,
    /// Site.
    pub site: Option<String>,
    /// Rack.
    pub rack: Option<String>,
    /// Cluster.
    pub cluster: Option<String>,
    /// Role.
    pub role: Option<Role>,
    /// Free text: substring of hostname, serial, asset tag, manufacturer, model or a MAC.
    pub q: Option<String>,
    /// Page size.
    pub limit: u32,
    /// Continue after this id (keyset pagination).
    pub after: Option<MachineId>,
}

/// One page of machines.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct MachinePage {
    /// The machines, ordered by id (creation time).
    pub items: Vec<Machine>,
    /// How many machines match the filter in all.
    pub total: i64,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// What the service needs from a database.
#[async_trait]
pub trait InventoryStore:
    super::leases::LeaseStore
    + super::bmc::BmcCapabilityStore
    + super::config::ConfigStore
    + super::workflow::ReinstallStore
    + super::ports::talos_state::TalosStateStore
    + Send
    + Sync
    + 'static
{
    /// Is the database reachable?
    async fn ping(&self) -> Result<(), StoreError>;

    /// Insert a machine and its event in one transaction.
    async fn create_machine(
        &self,
        id: MachineId,
        state: LifecycleState,
        rec: &MachineRecord,
        event: &NewEvent,
    ) -> Result<Machine, StoreError>;

    /// Replace a machine's spec if its version is still `expected_version`, with its event, in one
    /// transaction. Bumps the version.
    async fn update_machine(
        &self,
        id: MachineId,
        expected_version: i64,
        rec: &MachineRecord,
        event: &NewEvent,
    ) -> Result<Machine, StoreError>;

    /// Delete a machine if its version is still `expected_version`, with its event.
    async fn delete_machine(
        &self,
        id: MachineId,
        expected_version: i64,
        event: &NewEvent,
    ) -> Result<(), StoreError>;

    /// Move a machine from state `from` to `to` (with a reason, or none) if it is still in `from`
    /// (and at `expected_version`, when given), with its event, in one transaction. Bumps the
    /// version. `VersionMismatch` when the machine moved on meanwhile.
    async fn set_state(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        from: LifecycleState,
        to: LifecycleState,
        reason: Option<&str>,
        event: &NewEvent,
    ) -> Result<Machine, StoreError>;

    /// Insert many machines and their events in one transaction: all or none.
    async fn import_machines(
        &self,
        rows: &[(MachineId, MachineRecord)],
        actor: &str,
    ) -> Result<(), StoreError>;

    /// One machine by id.
    async fn get_machine(&self, id: MachineId) -> Result<Option<Machine>, StoreError>;

    /// One machine by a unique value.
    async fn find_machine(&self, key: &UniqueKey) -> Result<Option<Machine>, StoreError>;

    /// The machines that hold any of these unique values.
    async fn owners(&self, keys: &[UniqueKey]) -> Result<Vec<(UniqueKey, MachineRef)>, StoreError>;

    /// A page of machines.
    async fn list_machines(&self, filter: &MachineFilter) -> Result<MachinePage, StoreError>;

    /// The sealed BMC password of a machine.
    async fn bmc_password(&self, id: MachineId) -> Result<Option<Vec<u8>>, StoreError>;

    /// Append an event.
    async fn append_event(&self, event: &NewEvent) -> Result<(), StoreError>;

    /// Append events in order, in one transaction (one commit, one fsync): all of them or none.
    async fn append_events(&self, events: &[NewEvent]) -> Result<(), StoreError>;

    /// Read events, oldest first.
    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<Event>, StoreError>;

    /// Store a new API token (its hash only).
    async fn create_token(&self, token: &NewToken) -> Result<TokenInfo, StoreError>;

    /// A live (not revoked, not expired) token by the SHA-256 of its secret.
    async fn token_by_hash(&self, hash: &[u8]) -> Result<Option<TokenInfo>, StoreError>;

    /// All tokens (metadata only).
    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError>;

    /// Revoke a token; false when there was none.
    async fn revoke_token(&self, id: Uuid) -> Result<bool, StoreError>;
}
