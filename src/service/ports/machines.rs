//! The `MachineStore` port: machines with their NICs, disks and BMC records, written with
//! optimistic concurrency and each change in one transaction with its event. Implemented for
//! SQLite and PostgreSQL in `crate::store`. Imports `domain` and the other ports only.

use async_trait::async_trait;
use serde::Serialize;

use super::error::StoreError;
use super::events::NewEvent;
use crate::domain::{LifecycleState, Machine, MachineId, MachineRef, MachineSpec, Role, UniqueKey};

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

/// One machine an `import --update` replaces: its spec at the version it was read at, with its
/// event.
#[derive(Clone, Debug)]
pub struct MachineUpdate {
    /// The machine.
    pub id: MachineId,
    /// The version the update was computed from; another writer in between fails the import.
    pub expected_version: i64,
    /// The new spec and password change.
    pub rec: MachineRecord,
    /// Its `machine.updated` event.
    pub event: NewEvent,
}

/// One batch of a streamed import: machines to insert and machines to replace, in file order.
#[derive(Clone, Debug, Default)]
pub struct ImportBatch {
    /// New machines (each gets its `machine.created` event).
    pub creates: Vec<(MachineId, MachineRecord)>,
    /// Machines replaced, each with its event.
    pub updates: Vec<MachineUpdate>,
}

/// Where a streamed import's batches come from: the store pulls them one at a time inside its
/// one transaction, so an import of any size holds one batch in memory, not the file.
#[async_trait]
pub trait ImportBatches: Send {
    /// The next batch; `Ok(None)` once the import is whole (the store commits), an error to
    /// abandon it (the store rolls back and returns the error).
    async fn next_batch(&mut self) -> Result<Option<ImportBatch>, StoreError>;
}

/// A source of one batch already in memory.
struct OneBatch(Option<ImportBatch>);

#[async_trait]
impl ImportBatches for OneBatch {
    async fn next_batch(&mut self) -> Result<Option<ImportBatch>, StoreError> {
        Ok(self.0.take())
    }
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

/// The column a table of machines is ordered by (then by id, so pages never overlap).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MachineSort {
    /// Host name (machines without one last).
    #[default]
    Hostname,
    /// Site, rack and unit.
    Location,
    /// Lifecycle state.
    State,
    /// Serial number.
    Serial,
    /// Asset tag.
    AssetTag,
    /// When the record last changed.
    Updated,
}

impl MachineSort {
    /// Every column, in the order a table shows them.
    pub const ALL: [MachineSort; 6] = [
        MachineSort::Hostname,
        MachineSort::Location,
        MachineSort::State,
        MachineSort::Serial,
        MachineSort::AssetTag,
        MachineSort::Updated,
    ];

    /// The query-string spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MachineSort::Hostname => "hostname",
            MachineSort::Location => "location",
            MachineSort::State => "state",
            MachineSort::Serial => "serial",
            MachineSort::AssetTag => "asset_tag",
            MachineSort::Updated => "updated",
        }
    }
}

impl std::str::FromStr for MachineSort {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MachineSort::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                format!("`{s}` is not a column: hostname, location, state, serial, asset_tag or updated")
            })
    }
}

/// Machines of the inventory.
#[async_trait]
pub trait MachineStore: Send + Sync + 'static {
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
    /// (and at `expected_version`, when given), with its event, in one transaction; the event's
    /// actor is recorded as who set the state, and `manual_hold` whether a person did. Bumps the
    /// version. `VersionMismatch` when the machine moved on meanwhile.
    #[allow(clippy::too_many_arguments)]
    async fn set_state(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        from: LifecycleState,
        to: LifecycleState,
        reason: Option<&str>,
        manual_hold: bool,
        event: &NewEvent,
    ) -> Result<Machine, StoreError>;

    /// Write every batch `batches` gives (inserting its `creates`, replacing its `updates`, each
    /// still at its expected version, with their events) in one transaction: all or none. The
    /// batches are pulled as they are written; an error from `batches` or from a write rolls
    /// everything back.
    async fn import_batches(
        &self,
        batches: &mut dyn ImportBatches,
        actor: &str,
    ) -> Result<(), StoreError>;

    /// Insert many machines and their events in one transaction: all or none.
    async fn import_machines(
        &self,
        rows: &[(MachineId, MachineRecord)],
        actor: &str,
    ) -> Result<(), StoreError> {
        self.import_and_update(rows, &[], actor).await
    }

    /// Insert `creates` and replace `updates` (each still at its expected version), with their
    /// events, in one transaction: all or none (`import --update`).
    async fn import_and_update(
        &self,
        creates: &[(MachineId, MachineRecord)],
        updates: &[MachineUpdate],
        actor: &str,
    ) -> Result<(), StoreError> {
        let mut one = OneBatch(Some(ImportBatch {
            creates: creates.to_vec(),
            updates: updates.to_vec(),
        }));
        self.import_batches(&mut one, actor).await
    }

    /// One machine by id.
    async fn get_machine(&self, id: MachineId) -> Result<Option<Machine>, StoreError>;

    /// One machine by a unique value.
    async fn find_machine(&self, key: &UniqueKey) -> Result<Option<Machine>, StoreError>;

    /// The machines that hold any of these unique values.
    async fn owners(&self, keys: &[UniqueKey]) -> Result<Vec<(UniqueKey, MachineRef)>, StoreError>;

    /// A page of machines.
    async fn list_machines(&self, filter: &MachineFilter) -> Result<MachinePage, StoreError>;

    /// Every machine `filter` selects, page by page (`filter.limit` a page, from `filter.after`):
    /// each page goes to `visit` until it returns `false` or the last page is read. The one
    /// paging loop of the crate; provided, so a store implements `list_machines` only.
    async fn visit_machines(
        &self,
        filter: &MachineFilter,
        visit: &mut (dyn for<'p> FnMut(&'p [Machine]) -> bool + Send),
    ) -> Result<(), StoreError> {
        let mut filter = filter.clone();
        loop {
            let page = self.list_machines(&filter).await?;
            let go_on = visit(&page.items) && page.next_cursor.is_some();
            match page.items.last().map(|m| m.id) {
                Some(last) if go_on => filter.after = Some(last),
                _ => return Ok(()),
            }
        }
    }

    /// Every machine `filter` selects (say, every machine of a cluster), read page by page with
    /// [`MachineStore::visit_machines`].
    async fn all_machines(&self, filter: &MachineFilter) -> Result<Vec<Machine>, StoreError> {
        let mut out = Vec::new();
        self.visit_machines(filter, &mut |page| {
            out.extend_from_slice(page);
            true
        })
        .await?;
        Ok(out)
    }

    /// The sealed BMC password of a machine.
    async fn bmc_password(&self, id: MachineId) -> Result<Option<Vec<u8>>, StoreError>;

    /// A page of a table of machines: `filter` (its `after` ignored), ordered by `sort`, then
    /// id, skipping `offset` rows and returning at most `filter.limit` (1-1000). The database
    /// sorts and pages; `next_cursor` is the next offset when there are more rows.
    async fn machine_table(
        &self,
        filter: &MachineFilter,
        sort: MachineSort,
        descending: bool,
        offset: u32,
    ) -> Result<MachinePage, StoreError>;
}
