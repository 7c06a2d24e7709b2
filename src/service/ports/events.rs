//! The `EventStore` port: the append-only event log (who did what to which machine, and every
//! step of a boot). Imports `domain` and `StoreError` only.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use crate::domain::MachineId;

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
    /// That machine as people name it: its host name, else its serial, else its boot (or first)
    /// MAC address, else its SMBIOS UUID; absent when it has none of them or was removed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
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

/// The event log.
#[async_trait]
pub trait EventStore: Send + Sync + 'static {
    /// Append an event.
    async fn append_event(&self, event: &NewEvent) -> Result<(), StoreError>;

    /// Append events in order, in one transaction (one commit, one fsync): all of them or none.
    async fn append_events(&self, events: &[NewEvent]) -> Result<(), StoreError>;

    /// Read events, oldest first.
    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<Event>, StoreError>;

    /// The id of the newest event (0 when there is none).
    async fn last_event_id(&self) -> Result<i64, StoreError>;
}
