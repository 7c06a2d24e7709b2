//! The inventory use cases: register, edit (optimistic concurrency), remove, look up, list and bulk
//! import machines. Every mutation writes an event with the before/after of the changed fields;
//! BMC passwords are sealed here before they reach a store and never leave it in clear.
//!
//! Takes the machines, events, configs (a machine leaving `provisioning` closes its window) and
//! store-health ports; imports `domain` and nothing from `store` or the front doors.
//!
//! A BMC password belongs to its BMC's origin (`scheme://host:port`): it is sealed with the machine
//! id and that origin as associated data, so a row whose URL was changed behind Plinth's back does
//! not open for the new origin; and an edit that moves `bmc.url` to another origin discards the
//! stored password unless the same edit brings a new one (and says so in its answer and event).
//! Passwords sealed before this binding (machine id only) are re-sealed once, at start, by
//! `reseal_bmc_passwords`.

use std::sync::Arc;

use serde_json::{json, Value};

use super::error::ServiceError;
use super::ports::{
    ConfigStore, Event, EventFilter, EventStore, MachineFilter, MachinePage, MachineRecord,
    MachineStore, NewEvent, PasswordChange, StoreError, StoreHealth,
};
use super::secrets::SecretBox;
use crate::domain::import::ParsedRow;
use crate::domain::{
    spec_diff, unique_keys, Conflict, LifecycleState, Machine, MachineId, MachineRef, MachineSpec,
    UniqueKey, ValidationErrors,
};

pub use crate::domain::import::RowError;
pub use import::{ImportOutcome, IMPORT_BATCH, MAX_ROW_ERRORS};

mod import;

/// A row of a bulk import, as the service receives it.
pub type ImportRow = ParsedRow;

/// Fields of a machine that only Plinth writes.
const READ_ONLY: &[&str] = &[
    "id",
    "state",
    "state_reason",
    "state_by",
    "manual_hold",
    "created_at",
    "updated_at",
];

/// The actor of Plinth's own state changes (workflows, config checks). A state set by any other
/// actor was set by a person (or a person's script) and holds off the automatic reinstall.
pub const PLINTH_ACTOR: &str = "plinth";

/// The inventory service.
#[derive(Clone)]
pub struct Inventory {
    machines: Arc<dyn MachineStore>,
    events: Arc<dyn EventStore>,
    configs: Arc<dyn ConfigStore>,
    health: Arc<dyn StoreHealth>,
    secrets: SecretBox,
}

/// Associated data of a BMC password: the machine and the origin the password belongs to.
fn password_context(id: MachineId, origin: &str) -> String {
    format!("bmc-password:{id}:{origin}")
}

/// Associated data of a BMC password sealed before passwords were bound to an origin.
fn legacy_password_context(id: MachineId) -> String {
    format!("bmc-password:{id}")
}

/// A machine after an edit, and what the edit did that the caller should be told.
#[derive(Clone, Debug)]
pub struct Edited {
    /// The machine as stored.
    pub machine: Machine,
    /// Side effects in words, e.g. a BMC password discarded because the BMC's origin changed.
    pub notices: Vec<String>,
}

/// What `/healthz` learns of the database (the texts are for the log, never for a client).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatabaseHealth {
    /// Reads and writes work.
    Ok,
    /// A read round trip failed.
    Unreachable(String),
    /// Reads work, the heartbeat write did not (a full disk, a read-only file or replica, a lock
    /// held too long).
    ReadOnly(String),
}

/// What `reseal_bmc_passwords` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resealed {
    /// Passwords re-sealed with their BMC's origin.
    pub resealed: usize,
    /// Passwords already bound to their origin.
    pub current: usize,
    /// Passwords that open neither way (another key, or a row edited behind Plinth's back); left
    /// as they are.
    pub unreadable: usize,
}

impl Inventory {
    /// A service over the machines, the event log, the provisioning windows (`configs`) and the
    /// database's health, sealing secrets with `secrets`.
    pub fn new(
        machines: Arc<dyn MachineStore>,
        events: Arc<dyn EventStore>,
        configs: Arc<dyn ConfigStore>,
        health: Arc<dyn StoreHealth>,
        secrets: SecretBox,
    ) -> Self {
        Self {
            machines,
            events,
            configs,
            health,
            secrets,
        }
    }

    /// Is the database reachable?
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.health.ping().await
    }

    /// Is the database reachable, and does it take writes? A read round trip, then the upsert of
    /// this instance's heartbeat row; each bounded by `limit` (a database that hangs is as bad as
    /// one that refuses).
    pub async fn health(&self, instance: &str, limit: std::time::Duration) -> DatabaseHealth {
        match tokio::time::timeout(limit, self.health.ping()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return DatabaseHealth::Unreachable(e.to_string()),
            Err(_) => return DatabaseHealth::Unreachable("no answer in time".into()),
        }
        match tokio::time::timeout(limit, self.health.write_probe(instance)).await {
            Ok(Ok(())) => DatabaseHealth::Ok,
            Ok(Err(e)) => DatabaseHealth::ReadOnly(e.to_string()),
            Err(_) => DatabaseHealth::ReadOnly("the write probe got no answer in time".into()),
        }
    }

    /// Turn a validated spec into a store record, sealing the password for the BMC's origin. With
    /// `discard_kept`, a stored password is dropped unless the spec brings a new one.
    fn record(&self, id: MachineId, mut spec: MachineSpec, discard_kept: bool) -> MachineRecord {
        let origin = spec
            .bmc
            .as_ref()
            .and_then(|b| crate::domain::bmc_origin(&b.url).ok());
        let password = match (spec.bmc.as_mut().and_then(|b| b.password.take()), origin) {
            (None, _) if discard_kept => PasswordChange::Clear,
            (None, _) => PasswordChange::Keep,
            (Some(p), _) if p.is_empty() => PasswordChange::Clear,
            (Some(p), Some(origin)) => PasswordChange::Set(
                self.secrets
                    .seal(&password_context(id, &origin), p.as_bytes()),
            ),
            // A validated spec has a usable URL; without one, no password is kept for it.
            (Some(_), None) => PasswordChange::Clear,
        };
        if spec.bmc.is_none() {
            return MachineRecord {
                spec,
                password: PasswordChange::Clear,
            };
        }
        MachineRecord { spec, password }
    }

    /// Which unique values of `spec` already belong to a machine other than `exclude`.
    async fn conflicts(
        &self,
        spec: &MachineSpec,
        exclude: Option<MachineId>,
    ) -> Result<Vec<Conflict>, ServiceError> {
        let keys = unique_keys(spec);
        let plain: Vec<UniqueKey> = keys.iter().map(|(_, k)| k.clone()).collect();
        let owners = self.machines.owners(&plain).await?;
        let mut out = Vec::new();
        for (field, key) in keys {
            for (k, owner) in &owners {
                if *k == key && Some(owner.id) != exclude {
                    out.push(Conflict {
                        field: field.clone(),
                        value: unique_value(&key),
                        owner: owner.clone(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// A store conflict without details (a race past our pre-check): find who holds what.
    async fn explain(
        &self,
        e: StoreError,
        spec: &MachineSpec,
        exclude: Option<MachineId>,
    ) -> ServiceError {
        match e {
            StoreError::Conflict(c) if c.is_empty() => match self.conflicts(spec, exclude).await {
                Ok(found) if !found.is_empty() => ServiceError::Conflict(found),
                Ok(_) => ServiceError::Store(StoreError::Backend(
                    "unique constraint refused the write".into(),
                )),
                Err(e) => e,
            },
            other => other.into(),
        }
    }

    /// Register a machine (state `registered`).
    pub async fn create(&self, spec: MachineSpec, actor: &str) -> Result<Machine, ServiceError> {
        self.create_in_state(spec, LifecycleState::Registered, actor)
            .await
    }

    /// Register a machine in a given initial state (`discovered` for machines that booted unknown).
    pub async fn create_in_state(
        &self,
        spec: MachineSpec,
        state: LifecycleState,
        actor: &str,
    ) -> Result<Machine, ServiceError> {
        let spec = spec.validate().map_err(ServiceError::Invalid)?;
        let conflicts = self.conflicts(&spec, None).await?;
        if !conflicts.is_empty() {
            return Err(ServiceError::Conflict(conflicts));
        }
        let id = MachineId::new();
        let event = NewEvent {
            machine_id: Some(id),
            kind: "machine.created".into(),
            actor: actor.into(),
            detail: json!({"state": state, "changes": spec_diff(None, Some(&spec))}),
        };
        let rec = self.record(id, spec.clone(), false);
        match self.machines.create_machine(id, state, &rec, &event).await {
            Ok(m) => Ok(m),
            Err(e) => Err(self.explain(e, &spec, None).await),
        }
    }

    /// One machine by id.
    pub async fn get(&self, id: MachineId) -> Result<Machine, ServiceError> {
        self.machines
            .get_machine(id)
            .await?
            .ok_or_else(|| ServiceError::NotFound(format!("machine {id}")))
    }

    /// One machine by id (UUID text) or host name.
    pub async fn resolve(&self, reference: &str) -> Result<Machine, ServiceError> {
        if let Ok(id) = reference.parse::<MachineId>() {
            if let Some(m) = self.machines.get_machine(id).await? {
                return Ok(m);
            }
        }
        let host = reference.trim().to_ascii_lowercase();
        self.machines
            .find_machine(&UniqueKey::Hostname(host))
            .await?
            .ok_or_else(|| ServiceError::NotFound(format!("machine {reference}")))
    }

    /// One machine by a unique value.
    pub async fn lookup(&self, key: &UniqueKey) -> Result<Machine, ServiceError> {
        self.machines
            .find_machine(key)
            .await?
            .ok_or_else(|| ServiceError::NotFound(format!("machine with {key}")))
    }

    /// A page of machines.
    pub async fn list(&self, filter: &MachineFilter) -> Result<MachinePage, ServiceError> {
        Ok(self.machines.list_machines(filter).await?)
    }

    /// Every machine `filter` selects, read page by page (`filter.limit` a page).
    pub async fn all(&self, filter: &MachineFilter) -> Result<Vec<Machine>, ServiceError> {
        Ok(self.machines.all_machines(filter).await?)
    }

    /// A page of a sorted table of machines (the database sorts and pages; see
    /// `MachineStore::machine_table`).
    pub async fn table(
        &self,
        filter: &MachineFilter,
        sort: crate::service::ports::MachineSort,
        descending: bool,
        offset: u32,
    ) -> Result<MachinePage, ServiceError> {
        Ok(self
            .machines
            .machine_table(filter, sort, descending, offset)
            .await?)
    }

    /// Apply a JSON merge patch (RFC 7386) to a machine's spec. `expected_version` comes from
    /// `If-Match`; a `version` member of the patch is accepted instead. See [`Inventory::edit`].
    pub async fn update(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        patch: Value,
        actor: &str,
    ) -> Result<Machine, ServiceError> {
        Ok(self.edit(id, expected_version, patch, actor).await?.machine)
    }

    /// Apply a JSON merge patch (RFC 7386) to a machine's spec, and say what else it did. Moving
    /// `bmc.url` to another origin (scheme, host or port) discards the stored BMC password unless
    /// the same patch sets a new one.
    pub async fn edit(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        mut patch: Value,
        actor: &str,
    ) -> Result<Edited, ServiceError> {
        let current = self.get(id).await?;
        let Some(obj) = patch.as_object_mut() else {
            let mut e = ValidationErrors::default();
            e.push(
                "-",
                "the body must be a JSON object of the fields to change",
            );
            return Err(ServiceError::Invalid(e));
        };
        let body_version = match obj.remove("version") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_i64() {
                Some(n) => Some(n),
                None => {
                    let mut e = ValidationErrors::default();
                    e.push("version", "must be an integer");
                    return Err(ServiceError::Invalid(e));
                }
            },
        };
        let expected = expected_version
            .or(body_version)
            .ok_or(ServiceError::PreconditionRequired)?;
        if expected != current.version {
            return Err(ServiceError::PreconditionFailed {
                expected,
                current: current.version,
            });
        }
        // Read-only fields may be sent back unchanged (a GET document edited and returned).
        let shown = serde_json::to_value(&current).unwrap_or(Value::Null);
        let mut errs = ValidationErrors::default();
        for key in READ_ONLY {
            if let Some(v) = obj.remove(*key) {
                if shown.get(key) != Some(&v) {
                    errs.push(*key, "is read-only: Plinth sets it");
                }
            }
        }
        if let Some(Value::Object(b)) = obj.get_mut("bmc") {
            b.remove("has_password");
        }
        errs.into_result().map_err(ServiceError::Invalid)?;

        let before = current.spec();
        let mut doc = serde_json::to_value(&before).unwrap_or(Value::Null);
        merge_patch(&mut doc, &patch);
        let spec: MachineSpec = serde_path_to_error::deserialize(doc).map_err(|e| {
            let mut v = ValidationErrors::default();
            v.push(
                crate::domain::import::json_path(e.path()),
                e.inner().to_string(),
            );
            ServiceError::Invalid(v)
        })?;
        let spec = spec.validate().map_err(ServiceError::Invalid)?;
        let moved = bmc_moved(&current, &spec);
        // Whether the BMC has a password after this edit: a new one, or the stored one kept.
        let with_password = spec.bmc.as_ref().is_some_and(|b| match &b.password {
            Some(p) => !p.is_empty(),
            None => current.bmc.as_ref().is_some_and(|c| c.has_password) && moved.is_none(),
        });
        if let Some(b) = &spec.bmc {
            if let Err(e) = b.check_transport(with_password) {
                let mut v = ValidationErrors::default();
                v.push("bmc.tls", e);
                return Err(ServiceError::Invalid(v));
            }
        }
        let conflicts = self.conflicts(&spec, Some(id)).await?;
        if !conflicts.is_empty() {
            return Err(ServiceError::Conflict(conflicts));
        }
        let mut changes = spec_diff(Some(&before), Some(&spec));
        let mut notices = Vec::new();
        if let Some(moved) = &moved {
            notices.push(format!(
                "bmc.password discarded: bmc.url moved from {} to {}, and a stored BMC password only \
                 goes to the origin it was given for; set bmc.password again (in the same edit as \
                 the URL to keep one)",
                moved.from, moved.to
            ));
            if let Value::Object(c) = &mut changes {
                c.insert(
                    "bmc.password".into(),
                    json!(format!(
                        "discarded: the BMC origin changed from {} to {}",
                        moved.from, moved.to
                    )),
                );
            }
        }
        let event = NewEvent {
            machine_id: Some(id),
            kind: "machine.updated".into(),
            actor: actor.into(),
            detail: json!({"version": current.version + 1, "changes": changes}),
        };
        let rec = self.record(id, spec.clone(), moved.is_some());
        match self
            .machines
            .update_machine(id, expected, &rec, &event)
            .await
        {
            Ok(machine) => {
                if let Some(moved) = &moved {
                    tracing::info!(machine = %id, name = %machine.display_name(), from = %moved.from, to = %moved.to, actor,
                        "BMC origin changed; its stored password was discarded");
                }
                Ok(Edited { machine, notices })
            }
            Err(e) => Err(self.explain(e, &spec, Some(id)).await),
        }
    }

    /// Remove a machine (its NICs, disks and BMC go with it; its events stay).
    pub async fn delete(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        actor: &str,
    ) -> Result<(), ServiceError> {
        let current = self.get(id).await?;
        let expected = expected_version.ok_or(ServiceError::PreconditionRequired)?;
        if expected != current.version {
            return Err(ServiceError::PreconditionFailed {
                expected,
                current: current.version,
            });
        }
        let event = NewEvent {
            machine_id: Some(id),
            kind: "machine.deleted".into(),
            actor: actor.into(),
            detail: json!({"name": current.display_name(), "changes": spec_diff(Some(&current.spec()), None)}),
        };
        Ok(self.machines.delete_machine(id, expected, &event).await?)
    }

    /// Move a machine to another lifecycle state. Refused (`InvalidTransition`) when the lifecycle
    /// does not allow it; the same state again is a no-op. `failed` needs a reason. A state set by
    /// anyone but Plinth itself ([`PLINTH_ACTOR`]) holds off the automatic reinstall.
    pub async fn set_state(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        to: LifecycleState,
        reason: Option<String>,
        actor: &str,
    ) -> Result<Machine, ServiceError> {
        let hold = actor != PLINTH_ACTOR;
        self.set_state_held(id, expected_version, to, reason, actor, hold)
            .await
    }

    /// [`Inventory::set_state`], saying whether the change holds off the automatic reinstall
    /// (`manual_hold`): a monitor that marks a machine failed for the cluster's policy to
    /// reinstall it says `false`.
    pub async fn set_state_held(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        to: LifecycleState,
        reason: Option<String>,
        actor: &str,
        manual_hold: bool,
    ) -> Result<Machine, ServiceError> {
        let current = self.get(id).await?;
        if let Some(v) = expected_version {
            if v != current.version {
                return Err(ServiceError::PreconditionFailed {
                    expected: v,
                    current: current.version,
                });
            }
        }
        if current.state == to && reason.is_none() {
            return Ok(current);
        }
        if !crate::domain::lifecycle::allowed(current.state, to) {
            return Err(ServiceError::InvalidTransition {
                from: current.state,
                to,
            });
        }
        let reason = reason
            .map(|r| r.trim().chars().take(1000).collect::<String>())
            .filter(|r| !r.is_empty());
        if to == LifecycleState::Failed && reason.is_none() {
            let mut e = ValidationErrors::default();
            e.push(
                "reason",
                "required when marking a machine failed: say what failed",
            );
            return Err(ServiceError::Invalid(e));
        }
        let event = NewEvent {
            machine_id: Some(id),
            kind: "machine.state".into(),
            actor: actor.into(),
            detail: json!({"from": current.state, "to": to, "reason": reason, "manual_hold": manual_hold}),
        };
        let m = self
            .machines
            .set_state(
                id,
                Some(current.version),
                current.state,
                to,
                reason.as_deref(),
                manual_hold,
                &event,
            )
            .await
            .map_err(|e| match e {
                // Someone else moved it between our read and our write.
                StoreError::VersionMismatch { current: c, .. } => {
                    ServiceError::PreconditionFailed {
                        expected: current.version,
                        current: c,
                    }
                }
                other => other.into(),
            })?;
        // A provisioning window means something only while the machine provisions: leaving that
        // state (installed, failed, maintenance...) closes it. Configs are never served outside
        // `provisioning` anyway, so a crash between the two writes serves nothing.
        if to != LifecycleState::Provisioning {
            let reason = format!("machine is {to}");
            let close = NewEvent {
                machine_id: Some(id),
                kind: "config.window_closed".into(),
                actor: actor.into(),
                detail: json!({ "reason": reason }),
            };
            if let Err(e) = self
                .configs
                .close_window(id, chrono::Utc::now(), &reason, &close)
                .await
            {
                tracing::warn!(machine = %id, error = %e, "provisioning window not closed");
            }
        }
        Ok(m)
    }

    /// The BMC password of a machine, decrypted for the origin of the BMC URL the machine has
    /// now, for the Redfish client only. A password sealed for another origin does not open.
    pub async fn bmc_password(&self, m: &Machine) -> Result<Option<String>, ServiceError> {
        let Some(b) = &m.bmc else {
            return Ok(None);
        };
        let Some(sealed) = self.machines.bmc_password(m.id).await? else {
            return Ok(None);
        };
        let unusable = |why: String| {
            ServiceError::Store(StoreError::Backend(format!(
                "the stored BMC password of machine {} cannot be used: {why}; set bmc.password again",
                m.id
            )))
        };
        let origin = crate::domain::bmc_origin(&b.url).map_err(unusable)?;
        match self.secrets.open(&password_context(m.id, &origin), &sealed) {
            Ok(plain) => Ok(Some(String::from_utf8_lossy(&plain).into_owned())),
            Err(e) => {
                let why = if self
                    .secrets
                    .open(&legacy_password_context(m.id), &sealed)
                    .is_ok()
                {
                    "it was sealed by an older Plinth and is not yet bound to its BMC's origin \
                     (restart Plinth to re-seal it)"
                        .to_string()
                } else {
                    format!("it was not sealed for {origin} ({e})")
                };
                Err(unusable(why))
            }
        }
    }

    /// Re-seal BMC passwords sealed before they were bound to an origin (machine id only) for the
    /// origin of the machine's BMC URL, each as a versioned change with a `bmc.password_resealed`
    /// event. Run at start, before the front doors serve. Nothing is lost: a password that opens
    /// neither way is left as it is, and one whose machine changed meanwhile is tried again (and,
    /// failing that, at the next start).
    pub async fn reseal_bmc_passwords(&self, actor: &str) -> Result<Resealed, ServiceError> {
        let mut done = Resealed::default();
        let mut with_password = Vec::new();
        let every = MachineFilter {
            limit: 1000,
            ..Default::default()
        };
        self.machines
            .visit_machines(&every, &mut |page| {
                with_password.extend(
                    page.iter()
                        .filter(|m| m.bmc.as_ref().is_some_and(|b| b.has_password))
                        .map(|m| m.id),
                );
                true
            })
            .await?;
        for id in with_password {
            self.reseal_one(id, actor, &mut done).await?;
        }
        if done.resealed > 0 || done.unreadable > 0 {
            tracing::info!(
                resealed = done.resealed,
                unreadable = done.unreadable,
                "BMC passwords bound to their BMC's origin"
            );
        }
        Ok(done)
    }

    async fn reseal_one(
        &self,
        id: MachineId,
        actor: &str,
        done: &mut Resealed,
    ) -> Result<(), ServiceError> {
        for _ in 0..3 {
            let Some(m) = self.machines.get_machine(id).await? else {
                return Ok(());
            };
            let (Some(b), Some(sealed)) = (&m.bmc, self.machines.bmc_password(id).await?) else {
                return Ok(());
            };
            let Ok(origin) = crate::domain::bmc_origin(&b.url) else {
                done.unreadable += 1;
                return Ok(());
            };
            if self
                .secrets
                .open(&password_context(id, &origin), &sealed)
                .is_ok()
            {
                done.current += 1;
                return Ok(());
            }
            let Ok(plain) = self.secrets.open(&legacy_password_context(id), &sealed) else {
                tracing::warn!(machine = %id, name = %m.display_name(), "stored BMC password opens neither for its origin nor as a legacy value; left as it is");
                done.unreadable += 1;
                return Ok(());
            };
            let rec = MachineRecord {
                spec: m.spec(),
                password: PasswordChange::Set(
                    self.secrets.seal(&password_context(id, &origin), &plain),
                ),
            };
            let event = NewEvent {
                machine_id: Some(id),
                kind: "bmc.password_resealed".into(),
                actor: actor.into(),
                detail: json!({"origin": origin, "version": m.version + 1}),
            };
            match self
                .machines
                .update_machine(id, m.version, &rec, &event)
                .await
            {
                Ok(_) => {
                    done.resealed += 1;
                    return Ok(());
                }
                // Edited meanwhile: read it again.
                Err(StoreError::VersionMismatch { .. }) => continue,
                Err(StoreError::NotFound) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        tracing::warn!(machine = %id, "BMC password not re-sealed: the machine kept changing; next start tries again");
        Ok(())
    }

    /// Events, oldest first.
    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<Event>, ServiceError> {
        Ok(self.events.list_events(filter).await?)
    }

    /// The id of the newest event (0 when there is none): where a live event stream starts.
    pub async fn last_event_id(&self) -> Result<i64, ServiceError> {
        Ok(self.events.last_event_id().await?)
    }

    /// Append an event.
    pub async fn append_event(&self, event: &NewEvent) -> Result<(), ServiceError> {
        Ok(self.events.append_event(event).await?)
    }

    /// The machines that hold any of these unique values.
    pub async fn owners(
        &self,
        keys: &[UniqueKey],
    ) -> Result<Vec<(UniqueKey, MachineRef)>, ServiceError> {
        Ok(self.machines.owners(keys).await?)
    }
}

/// A BMC that stays configured but moves to another origin.
struct Moved {
    from: String,
    to: String,
}

/// Whether an edit moves the machine's BMC, with a stored password, to another origin (scheme,
/// host or port) without bringing a new password: then the stored one is discarded.
fn bmc_moved(current: &Machine, after: &MachineSpec) -> Option<Moved> {
    let before = current.bmc.as_ref().filter(|b| b.has_password)?;
    let after = after.bmc.as_ref().filter(|b| b.password.is_none())?;
    let to = crate::domain::bmc_origin(&after.url).ok()?;
    match crate::domain::bmc_origin(&before.url) {
        Ok(from) if from == to => None,
        Ok(from) => Some(Moved { from, to }),
        Err(_) => Some(Moved {
            from: before.url.clone(),
            to,
        }),
    }
}

fn unique_value(k: &UniqueKey) -> String {
    match k {
        UniqueKey::Hostname(v) | UniqueKey::Serial(v) | UniqueKey::AssetTag(v) => v.clone(),
        UniqueKey::SmbiosUuid(v) => v.to_string(),
        UniqueKey::Mac(v) => v.to_string(),
        UniqueKey::Ipv4(v) => v.to_string(),
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(serde_json::Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_rfc7386_examples() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        let mut t = json!({"a": [1, 2]});
        merge_patch(&mut t, &json!({"a": [3]}));
        assert_eq!(t, json!({"a": [3]}));
    }
}
