//! The BMC use cases: power, one-time boot override, virtual media, out-of-band inspection and
//! capability probing of a machine's BMC, each recorded as an event (actor, action, result; never
//! the password).
//!
//! `BmcService` loads a machine's BMC record and its decrypted password from the inventory and keeps
//! one client per machine, rebuilt only when the URL, user, TLS settings or password change: the
//! client's session and its per-BMC limit of concurrent requests only work when it is reused.
//! Inspection merges what the BMC reports into the inventory as one versioned change: empty fields
//! are filled and unknown NICs and disks added; values that contradict what a tech registered, or
//! that belong to another machine, are reported and never overwritten.
//!
//! The traits it needs from outside are the BMC port (`service::ports::bmc`: `Bmc`,
//! `BmcConnector`, `BmcCapabilityStore`), re-exported here by name for the front doors and the
//! Redfish client. This module imports `domain`, the ports and the inventory use case, nothing
//! from `bmc`, `store` or `http`.

pub use super::ports::bmc::{
    disk_type_of, Bmc, BmcCapabilityStore, BmcConnector, BmcError, BootMode, BootOverride,
    BootTarget, Capabilities, CapabilityRecord, DriveSource, EtagSupport, InspectedDrive,
    InspectedHardware, InspectedNic, MediaLocation, PowerAction, PowerState, VirtualMediaStatus,
};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::error::ServiceError;
use super::inventory::Inventory;
use super::ports::NewEvent;
use crate::domain::{self, Disk, Interface, MacAddr, Machine, MachineId, MachineRef, UniqueKey};

/// A power state as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PowerReport {
    /// The machine.
    pub machine: MachineRef,
    /// The operation run, absent for a status read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<PowerAction>,
    /// `on`, `off`, `powering-on`, `powering-off`, `paused`, or the BMC's own word.
    pub power_state: String,
    /// How long the operation took, confirmation included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
}

/// The boot override a BMC holds after a one-time boot request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BootOnceReport {
    /// The machine.
    pub machine: MachineRef,
    /// What was asked.
    pub target: BootTarget,
    /// The firmware mode asked for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<BootMode>,
    /// What the BMC holds, read back after the change.
    pub boot_override: BootOverride,
}

/// The virtual CD/DVD slot of a machine's BMC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MediaReport {
    /// The machine.
    pub machine: MachineRef,
    /// The slot, read back from the BMC.
    pub media: VirtualMediaStatus,
}

/// A field of the inventory that an inspection changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FieldChange {
    /// Field path, e.g. `serial`, `interfaces[2]`, `disks[0].model`.
    pub field: String,
    /// Value before (null when empty or new).
    #[schema(value_type = Object)]
    pub before: Value,
    /// Value after.
    #[schema(value_type = Object)]
    pub after: Value,
}

/// A value the BMC reports that contradicts the inventory; it was not written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InspectConflict {
    /// Field path, e.g. `serial`, `interfaces`, `disks[1].model`.
    pub field: String,
    /// What the inventory holds for this machine, if anything.
    pub registered: Option<String>,
    /// What the BMC reports.
    pub found: String,
    /// The other machine that holds the value, when that is the conflict.
    pub owner: Option<MachineRef>,
    /// The conflict in words.
    pub message: String,
}

/// What an out-of-band inspection found and did to the inventory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InspectionReport {
    /// The machine.
    pub machine: MachineRef,
    /// The machine's version after the inspection (unchanged when nothing changed).
    pub version: i64,
    /// Fields filled and NICs and disks added.
    pub changes: Vec<FieldChange>,
    /// Values not written because they contradict the inventory.
    pub conflicts: Vec<InspectConflict>,
    /// Everything the BMC reported.
    pub hardware: InspectedHardware,
}

struct Cached {
    key: [u8; 32],
    bmc: Arc<dyn Bmc>,
}

struct Inner {
    inventory: Inventory,
    caps: Arc<dyn BmcCapabilityStore>,
    connector: Arc<dyn BmcConnector>,
    clients: Mutex<HashMap<MachineId, Cached>>,
}

/// The BMC use cases.
#[derive(Clone)]
pub struct BmcService {
    inner: Arc<Inner>,
}

/// How often an inspection retries when the machine changed under it.
const MERGE_ATTEMPTS: usize = 3;

fn machine_ref(m: &Machine) -> MachineRef {
    MachineRef {
        id: m.id,
        name: m.display_name(),
    }
}

/// Identifies the settings a client was built from; the password enters only through a digest.
fn client_key(b: &domain::Bmc, password: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [
        b.url.as_str(),
        b.username.as_str(),
        b.tls.as_str(),
        b.fingerprint.as_deref().unwrap_or(""),
        password,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

impl BmcService {
    /// The service over the inventory, a capability store and a way to reach BMCs.
    pub fn new(
        inventory: Inventory,
        caps: Arc<dyn BmcCapabilityStore>,
        connector: Arc<dyn BmcConnector>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                inventory,
                caps,
                connector,
                clients: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The machine named by `reference` (id or host name) and a client for its BMC.
    async fn client(&self, reference: &str) -> Result<(Machine, Arc<dyn Bmc>), ServiceError> {
        let m = self.inner.inventory.resolve(reference).await?;
        let bmc = self.client_of(&m).await?;
        Ok((m, bmc))
    }

    async fn client_of(&self, m: &Machine) -> Result<Arc<dyn Bmc>, ServiceError> {
        let Some(b) = &m.bmc else {
            return Err(ServiceError::NoBmc(m.display_name()));
        };
        let password = self
            .inner
            .inventory
            .bmc_password(m.id)
            .await?
            .unwrap_or_default();
        let key = client_key(b, &password);
        let mut clients = self
            .inner
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(c) = clients.get(&m.id) {
            if c.key == key {
                return Ok(c.bmc.clone());
            }
        }
        // A replaced client logs out when its last user drops it.
        let bmc = self
            .inner
            .connector
            .connect(b, &password)
            .map_err(ServiceError::Bmc)?;
        clients.insert(
            m.id,
            Cached {
                key,
                bmc: bmc.clone(),
            },
        );
        Ok(bmc)
    }

    /// Drop the cached client of a machine (after it was removed from the inventory).
    pub fn forget(&self, id: MachineId) {
        let mut clients = self
            .inner
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        clients.remove(&id);
    }

    /// Append an event; a failure is logged, since the BMC action it describes already happened.
    async fn event(&self, m: &Machine, kind: &str, actor: &str, detail: Value) {
        let ev = NewEvent {
            machine_id: Some(m.id),
            kind: kind.into(),
            actor: actor.into(),
            detail,
        };
        if let Err(e) = self.inner.inventory.append_event(&ev).await {
            tracing::error!(machine = %m.id, kind, error = %e, "cannot record BMC event");
        }
    }

    /// Record an action's outcome as an event and a log line, then hand the outcome back.
    async fn finish<T>(
        &self,
        m: &Machine,
        kind: &str,
        actor: &str,
        mut detail: Map<String, Value>,
        started: Instant,
        result: Result<T, BmcError>,
    ) -> Result<T, ServiceError> {
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        detail.insert("elapsed_ms".into(), json!(elapsed_ms));
        match &result {
            Ok(_) => {
                detail.insert("result".into(), json!("ok"));
                tracing::info!(machine = %m.id, action = kind, actor, elapsed_ms, "BMC action done");
            }
            Err(e) => {
                detail.insert("result".into(), json!("failed"));
                detail.insert("error".into(), json!(e.to_string()));
                if let BmcError::BootNotApplied { wanted, actual } = e {
                    detail.insert("wanted".into(), json!(wanted));
                    detail.insert("actual".into(), json!(actual));
                }
                tracing::warn!(machine = %m.id, action = kind, actor, elapsed_ms, error = %e, "BMC action failed");
            }
        }
        self.event(m, kind, actor, Value::Object(detail)).await;
        result.map_err(ServiceError::Bmc)
    }

    /// The current power state.
    pub async fn power_state(&self, reference: &str) -> Result<PowerReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let state = bmc.power_state().await.map_err(ServiceError::Bmc)?;
        Ok(PowerReport {
            machine: machine_ref(&m),
            action: None,
            power_state: state.to_string(),
            elapsed_ms: None,
        })
    }

    /// Run a power operation and wait until the BMC reports the state it implies.
    pub async fn power(
        &self,
        reference: &str,
        action: PowerAction,
        actor: &str,
    ) -> Result<PowerReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.power(action).await;
        let mut detail = Map::new();
        detail.insert("action".into(), json!(action));
        if let Ok(state) = &result {
            detail.insert("power_state".into(), json!(state.to_string()));
        }
        let state = self
            .finish(&m, "bmc.power", actor, detail, started, result)
            .await?;
        Ok(PowerReport {
            machine: machine_ref(&m),
            action: Some(action),
            power_state: state.to_string(),
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).ok(),
        })
    }

    /// Set a one-time boot override and confirm the BMC kept it.
    pub async fn boot_once(
        &self,
        reference: &str,
        target: BootTarget,
        mode: Option<BootMode>,
        actor: &str,
    ) -> Result<BootOnceReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.boot_once(target, mode).await;
        let mut detail = Map::new();
        detail.insert("target".into(), json!(target));
        detail.insert("mode".into(), json!(mode));
        if let Ok(o) = &result {
            detail.insert("boot_override".into(), json!(o));
        }
        let boot_override = self
            .finish(&m, "bmc.boot_once", actor, detail, started, result)
            .await?;
        Ok(BootOnceReport {
            machine: machine_ref(&m),
            target,
            mode,
            boot_override,
        })
    }

    /// The virtual CD/DVD slot.
    pub async fn media_status(&self, reference: &str) -> Result<MediaReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let media = bmc.media_status().await.map_err(ServiceError::Bmc)?;
        Ok(MediaReport {
            machine: machine_ref(&m),
            media,
        })
    }

    /// Insert an image (an http or https URL the BMC can fetch) into the virtual CD/DVD slot.
    pub async fn media_insert(
        &self,
        reference: &str,
        image: &str,
        actor: &str,
    ) -> Result<MediaReport, ServiceError> {
        let image = image.trim();
        let valid = (image.starts_with("http://") || image.starts_with("https://"))
            && image.len() <= 2048
            && !image.chars().any(|c| c.is_whitespace() || c.is_control());
        if !valid {
            let mut e = domain::ValidationErrors::default();
            e.push(
                "image",
                "must be an http:// or https:// URL the BMC can download (at most 2048 characters)",
            );
            return Err(ServiceError::Invalid(e));
        }
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.media_insert(image).await;
        let mut detail = Map::new();
        detail.insert("image".into(), json!(image));
        if let Ok(s) = &result {
            detail.insert("slot".into(), json!(s.slot));
        }
        let media = self
            .finish(&m, "bmc.media.insert", actor, detail, started, result)
            .await?;
        Ok(MediaReport {
            machine: machine_ref(&m),
            media,
        })
    }

    /// Eject the virtual CD/DVD slot.
    pub async fn media_eject(
        &self,
        reference: &str,
        actor: &str,
    ) -> Result<MediaReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.media_eject().await;
        let mut detail = Map::new();
        if let Ok(s) = &result {
            detail.insert("slot".into(), json!(s.slot));
        }
        let media = self
            .finish(&m, "bmc.media.eject", actor, detail, started, result)
            .await?;
        Ok(MediaReport {
            machine: machine_ref(&m),
            media,
        })
    }

    /// Inspect the machine out of band and merge what the BMC reports into the inventory.
    pub async fn inspect(
        &self,
        reference: &str,
        actor: &str,
    ) -> Result<InspectionReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.inspect().await;
        let hw = match result {
            Ok(hw) => hw,
            Err(e) => {
                return self
                    .finish(&m, "bmc.inspect", actor, Map::new(), started, Err(e))
                    .await
            }
        };
        let mut machine = m;
        let mut attempt = 0;
        let (updated, merge) = loop {
            attempt += 1;
            let owners = self.inner.inventory.owners(&inspected_keys(&hw)).await?;
            let merge = merge_inspection(&machine, &hw, &owners);
            if merge.patch.is_empty() {
                break (machine, merge);
            }
            let patch = Value::Object(merge.patch.clone());
            match self
                .inner
                .inventory
                .update(machine.id, Some(machine.version), patch, actor)
                .await
            {
                Ok(updated) => break (updated, merge),
                // Someone edited the machine, or took one of its new values, meanwhile: merge again
                // against what the inventory holds now.
                Err(ServiceError::PreconditionFailed { .. } | ServiceError::Conflict(_))
                    if attempt < MERGE_ATTEMPTS =>
                {
                    machine = self.inner.inventory.get(machine.id).await?;
                }
                Err(e) => return Err(e),
            }
        };
        let mut detail = Map::new();
        detail.insert("version".into(), json!(updated.version));
        detail.insert("changes".into(), json!(merge.changes));
        detail.insert("conflicts".into(), json!(merge.conflicts));
        detail.insert("nics".into(), json!(hw.host_macs().len()));
        detail.insert("drives".into(), json!(hw.drives.len()));
        if !merge.conflicts.is_empty() {
            tracing::warn!(machine = %updated.id, conflicts = merge.conflicts.len(), "inspection found values that contradict the inventory; not overwritten");
        }
        self.finish(&updated, "bmc.inspect", actor, detail, started, Ok(()))
            .await?;
        Ok(InspectionReport {
            machine: machine_ref(&updated),
            version: updated.version,
            changes: merge.changes,
            conflicts: merge.conflicts,
            hardware: hw,
        })
    }

    /// The stored capability record of a machine's BMC.
    pub async fn capabilities(&self, reference: &str) -> Result<CapabilityRecord, ServiceError> {
        let m = self.inner.inventory.resolve(reference).await?;
        let Some(b) = &m.bmc else {
            return Err(ServiceError::NoBmc(m.display_name()));
        };
        let mut rec = self
            .inner
            .caps
            .bmc_capabilities(m.id)
            .await?
            .ok_or_else(|| {
                ServiceError::NotFound(format!(
                    "capability record of the BMC of {} (probe it first)",
                    m.display_name()
                ))
            })?;
        rec.stale = rec.bmc_url != b.url;
        Ok(rec)
    }

    /// Probe the BMC now and store what it can do. A failed probe is stored too (keeping the
    /// capabilities of the last good one) and returned as the error.
    pub async fn probe(
        &self,
        reference: &str,
        actor: &str,
    ) -> Result<CapabilityRecord, ServiceError> {
        let m = self.inner.inventory.resolve(reference).await?;
        self.probe_machine(&m, actor).await
    }

    async fn probe_machine(
        &self,
        m: &Machine,
        actor: &str,
    ) -> Result<CapabilityRecord, ServiceError> {
        let Some(b) = &m.bmc else {
            return Err(ServiceError::NoBmc(m.display_name()));
        };
        let started = Instant::now();
        let result = match self.client_of(m).await {
            Ok(bmc) => bmc.capabilities().await,
            Err(ServiceError::Bmc(e)) => Err(e),
            Err(other) => return Err(other),
        };
        let previous = self.inner.caps.bmc_capabilities(m.id).await?;
        let now = Utc::now();
        let rec = match &result {
            Ok(c) => CapabilityRecord {
                machine_id: m.id,
                bmc_url: b.url.clone(),
                capabilities: Some(c.clone()),
                probed_at: Some(now),
                last_error: None,
                attempted_at: now,
                stale: false,
            },
            Err(e) => {
                // Keep what the last good probe found, if it was of this same BMC URL.
                let (capabilities, probed_at) = match previous {
                    Some(p) if p.bmc_url == b.url => (p.capabilities, p.probed_at),
                    _ => (None, None),
                };
                CapabilityRecord {
                    machine_id: m.id,
                    bmc_url: b.url.clone(),
                    capabilities,
                    probed_at,
                    last_error: Some(e.to_string()),
                    attempted_at: now,
                    stale: false,
                }
            }
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let detail = match &result {
            Ok(c) => json!({
                "result": "ok", "elapsed_ms": elapsed_ms, "vendor": c.vendor, "quirks": c.quirks,
                "redfish_version": c.redfish_version,
            }),
            Err(e) => json!({"result": "failed", "elapsed_ms": elapsed_ms, "error": e.to_string()}),
        };
        let event = NewEvent {
            machine_id: Some(m.id),
            kind: "bmc.probe".into(),
            actor: actor.into(),
            detail,
        };
        self.inner.caps.put_bmc_capabilities(&rec, &event).await?;
        match result {
            Ok(_) => {
                tracing::info!(machine = %m.id, actor, elapsed_ms, "BMC capabilities probed");
                Ok(rec)
            }
            Err(e) => {
                tracing::warn!(machine = %m.id, actor, elapsed_ms, error = %e, "BMC capability probe failed; recorded");
                Err(ServiceError::Bmc(e))
            }
        }
    }

    /// Probe a machine's BMC in the background (after registration or a change of its BMC): the
    /// outcome, good or bad, ends up in the capability record and the event log.
    pub fn probe_in_background(&self, id: MachineId, actor: &str) {
        let svc = self.clone();
        let actor = actor.to_string();
        tokio::spawn(async move {
            let m = match svc.inner.inventory.get(id).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(machine = %id, error = %e, "BMC probe skipped");
                    return;
                }
            };
            if m.bmc.is_none() {
                return;
            }
            // Failures are recorded and logged by probe_machine.
            let _ = svc.probe_machine(&m, &actor).await;
        });
    }
}

/// The unique values an inspection may write: serial, SMBIOS UUID and the host NICs' MACs.
fn inspected_keys(hw: &InspectedHardware) -> Vec<UniqueKey> {
    let mut keys = Vec::new();
    if let Some(s) = hw.serial.as_deref().and_then(clean) {
        keys.push(UniqueKey::Serial(s));
    }
    if let Some(u) = hw.smbios_uuid {
        keys.push(UniqueKey::SmbiosUuid(u));
    }
    keys.extend(hw.host_macs().into_iter().map(UniqueKey::Mac));
    keys
}

/// A text value as the inventory would accept it, or nothing.
fn clean(s: &str) -> Option<String> {
    let t = s.trim();
    (!t.is_empty() && t.chars().count() <= 255 && !t.chars().any(char::is_control))
        .then(|| t.to_string())
}

fn usable_mac(mac: &MacAddr) -> bool {
    mac.0[0] & 1 == 0 && mac.0 != [0; 6]
}

/// The result of merging an inspection into a machine.
#[derive(Debug, Default)]
pub struct Merge {
    /// JSON merge patch of the machine's spec; empty when nothing changes.
    pub patch: Map<String, Value>,
    /// What the patch changes, field by field.
    pub changes: Vec<FieldChange>,
    /// What was not written.
    pub conflicts: Vec<InspectConflict>,
}

impl Merge {
    fn scalar(
        &mut self,
        field: &str,
        registered: Option<String>,
        found: Option<String>,
        owner: Option<&MachineRef>,
    ) {
        let Some(found) = found else { return };
        match registered {
            Some(r) if r == found => {}
            Some(r) => self.conflicts.push(InspectConflict {
                field: field.into(),
                message: format!(
                    "the inventory has {field} `{r}`, the BMC reports `{found}`; not overwritten"
                ),
                registered: Some(r),
                found,
                owner: None,
            }),
            None => match owner {
                Some(o) => self.conflicts.push(InspectConflict {
                    field: field.into(),
                    message: format!(
                        "the BMC reports {field} `{found}`, which belongs to machine {} ({}); not written",
                        o.name, o.id
                    ),
                    registered: None,
                    found,
                    owner: Some(o.clone()),
                }),
                None => {
                    self.patch.insert(field.into(), json!(found));
                    self.changes.push(FieldChange {
                        field: field.into(),
                        before: Value::Null,
                        after: json!(found),
                    });
                }
            },
        }
    }
}

/// Merge inspected hardware into a machine: fill empty fields, add NICs and disks not yet known,
/// and report (never overwrite) values that contradict the inventory. `owners` says which machines
/// hold the inspected unique values.
pub fn merge_inspection(
    m: &Machine,
    hw: &InspectedHardware,
    owners: &[(UniqueKey, MachineRef)],
) -> Merge {
    let other_owner = |key: &UniqueKey| {
        owners
            .iter()
            .find(|(k, o)| k == key && o.id != m.id)
            .map(|(_, o)| o)
    };
    let mut merge = Merge::default();

    let uuid_found = hw.smbios_uuid;
    merge.scalar(
        "smbios_uuid",
        m.smbios_uuid.map(|u: Uuid| u.to_string()),
        uuid_found.map(|u| u.to_string()),
        uuid_found.and_then(|u| other_owner(&UniqueKey::SmbiosUuid(u))),
    );
    let serial = hw.serial.as_deref().and_then(clean);
    let serial_owner = serial
        .as_ref()
        .and_then(|s| other_owner(&UniqueKey::Serial(s.clone())));
    merge.scalar("serial", m.serial.clone(), serial, serial_owner);
    merge.scalar(
        "manufacturer",
        m.manufacturer.clone(),
        hw.manufacturer.as_deref().and_then(clean),
        None,
    );
    merge.scalar(
        "model",
        m.model.clone(),
        hw.model.as_deref().and_then(clean),
        None,
    );

    // NICs: add the host NICs the inventory does not know; a MAC of another machine is a conflict.
    let mut nics = m.interfaces.clone();
    for mac in hw.host_macs() {
        if !usable_mac(&mac) || nics.iter().any(|n| n.mac == mac) {
            continue;
        }
        if let Some(o) = other_owner(&UniqueKey::Mac(mac)) {
            merge.conflicts.push(InspectConflict {
                field: "interfaces".into(),
                registered: None,
                found: mac.to_string(),
                owner: Some(o.clone()),
                message: format!(
                    "the BMC reports NIC {mac}, which belongs to machine {} ({}); not added",
                    o.name, o.id
                ),
            });
            continue;
        }
        let name = hw
            .nics
            .iter()
            .find(|n| n.mac == mac)
            .and_then(|n| clean(&n.id));
        let nic = Interface {
            mac,
            ipv4: None,
            boot: false,
            name,
        };
        merge.changes.push(FieldChange {
            field: format!("interfaces[{}]", nics.len()),
            before: Value::Null,
            after: json!(nic),
        });
        nics.push(nic);
    }
    if nics.len() != m.interfaces.len() {
        merge.patch.insert("interfaces".into(), json!(nics));
    }

    // Disks: a drive with a serial is the disk with that serial; one without is the first
    // unmatched disk without a serial of the same model and size.
    let mut disks = m.disks.clone();
    let mut matched = vec![false; disks.len()];
    let mut disks_changed = false;
    for d in &hw.drives {
        let serial = d.serial.as_deref().and_then(clean);
        let model = d.model.as_deref().and_then(clean);
        let size = d.capacity_bytes.filter(|s| *s > 0 && *s <= i64::MAX as u64);
        let found = match &serial {
            Some(s) => disks.iter().position(|k| k.serial.as_deref() == Some(s)),
            None => disks.iter().enumerate().position(|(i, k)| {
                !matched.get(i).copied().unwrap_or(true)
                    && k.serial.is_none()
                    && k.model == model
                    && k.size_bytes == size
            }),
        };
        match found {
            Some(i) => {
                if let Some(flag) = matched.get_mut(i) {
                    *flag = true;
                }
                let disk = &mut disks[i];
                let mut fill = |name: &str, have: &mut Option<String>, want: Option<String>| {
                    let Some(want) = want else { return };
                    match have {
                        None => {
                            merge.changes.push(FieldChange {
                                field: format!("disks[{i}].{name}"),
                                before: Value::Null,
                                after: json!(want),
                            });
                            *have = Some(want);
                            disks_changed = true;
                        }
                        Some(h) if *h == want => {}
                        Some(h) => merge.conflicts.push(InspectConflict {
                            field: format!("disks[{i}].{name}"),
                            message: format!(
                                "the inventory has disk {name} `{h}`, the BMC reports `{want}`; not overwritten"
                            ),
                            registered: Some(h.clone()),
                            found: want,
                            owner: None,
                        }),
                    }
                };
                fill("model", &mut disk.model, model);
                let mut size_text = disk.size_bytes.map(|s| s.to_string());
                fill("size_bytes", &mut size_text, size.map(|s| s.to_string()));
                disk.size_bytes = size_text.and_then(|s| s.parse().ok());
                let mut type_text = disk.disk_type.map(|t| t.as_str().to_string());
                fill(
                    "type",
                    &mut type_text,
                    d.disk_type.map(|t| t.as_str().to_string()),
                );
                disk.disk_type = type_text.and_then(|t| t.parse().ok());
            }
            None => {
                let disk = Disk {
                    serial,
                    wwid: None,
                    model,
                    size_bytes: size,
                    disk_type: d.disk_type,
                    bus_path: None,
                    data_disk: false,
                };
                merge.changes.push(FieldChange {
                    field: format!("disks[{}]", disks.len()),
                    before: Value::Null,
                    after: json!(disk),
                });
                disks.push(disk);
                disks_changed = true;
            }
        }
    }
    if disks_changed {
        merge.patch.insert("disks".into(), json!(disks));
    }
    merge
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DiskType, LifecycleState};

    fn machine() -> Machine {
        Machine {
            id: MachineId::new(),
            hostname: Some("n1".into()),
            smbios_uuid: None,
            serial: None,
            asset_tag: None,
            manufacturer: None,
            model: None,
            site: None,
            rack: None,
            rack_unit: None,
            role: None,
            cluster: None,
            profile: None,
            state: LifecycleState::Registered,
            state_reason: None,
            interfaces: Vec::new(),
            disks: Vec::new(),
            bmc: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            version: 1,
        }
    }

    fn nic(id: &str, mac: &str, host_if: bool) -> InspectedNic {
        InspectedNic {
            id: id.into(),
            mac: mac.parse().expect("mac"),
            permanent_mac: None,
            enabled: None,
            link_status: None,
            interface_type: None,
            bmc_host_interface: host_if,
        }
    }

    fn drive(serial: Option<&str>, model: &str, size: u64) -> InspectedDrive {
        InspectedDrive {
            name: None,
            model: Some(model.into()),
            serial: serial.map(str::to_string),
            manufacturer: None,
            capacity_bytes: Some(size),
            media_type: Some("SSD".into()),
            protocol: Some("NVMe".into()),
            disk_type: Some(DiskType::Nvme),
        }
    }

    fn hardware() -> InspectedHardware {
        InspectedHardware {
            smbios_uuid: Some(
                "4c4c4544-0035-3410-8050-c6c04f314733"
                    .parse()
                    .expect("uuid"),
            ),
            serial: Some(" SN-1 ".into()),
            manufacturer: Some("Dell Inc.".into()),
            model: Some("PowerEdge R750".into()),
            bios_version: Some("1.8.2".into()),
            nics: vec![
                nic("NIC.1", "70:b5:e8:f0:52:dc", false),
                nic("NIC.2", "70:b5:e8:f0:52:dd", false),
                nic("ToManager", "be:3a:f2:b6:05:9f", true),
            ],
            drives: vec![drive(Some("D1"), "CM6", 1_920_383_410_176)],
            drive_source: DriveSource::Storage,
        }
    }

    #[test]
    fn fills_an_empty_machine() {
        let m = machine();
        let merge = merge_inspection(&m, &hardware(), &[]);
        assert!(merge.conflicts.is_empty());
        assert_eq!(merge.patch["serial"], "SN-1");
        assert_eq!(merge.patch["manufacturer"], "Dell Inc.");
        assert_eq!(
            merge.patch["smbios_uuid"],
            "4c4c4544-0035-3410-8050-c6c04f314733"
        );
        let nics = merge.patch["interfaces"].as_array().expect("nics");
        assert_eq!(nics.len(), 2, "the BMC host interface is not a NIC");
        assert_eq!(nics[0]["name"], "NIC.1");
        assert_eq!(merge.patch["disks"][0]["serial"], "D1");
        assert_eq!(merge.patch["disks"][0]["type"], "nvme");
        assert_eq!(merge.changes.len(), 4 + 2 + 1);
    }

    #[test]
    fn reports_conflicts_and_leaves_them() {
        let mut m = machine();
        m.serial = Some("REGISTERED".into());
        m.disks.push(Disk {
            serial: Some("D1".into()),
            model: Some("Other".into()),
            ..Disk::default()
        });
        let other = MachineRef {
            id: MachineId::new(),
            name: "n2".into(),
        };
        let owners = vec![(
            UniqueKey::Mac("70:b5:e8:f0:52:dd".parse().expect("mac")),
            other.clone(),
        )];
        let merge = merge_inspection(&m, &hardware(), &owners);
        assert!(merge.patch.get("serial").is_none());
        let fields: Vec<&str> = merge.conflicts.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["serial", "interfaces", "disks[0].model"]);
        assert_eq!(merge.conflicts[1].owner.as_ref(), Some(&other));
        let nics = merge.patch["interfaces"].as_array().expect("nics");
        assert_eq!(nics.len(), 1);
        // The known disk gains its size and type, keeps its model, and no disk is added.
        let disks = merge.patch["disks"].as_array().expect("disks");
        assert_eq!(disks.len(), 1);
        assert_eq!(disks[0]["model"], "Other");
        assert_eq!(disks[0]["size_bytes"], 1_920_383_410_176_u64);
    }

    #[test]
    fn a_second_inspection_changes_nothing() {
        let m = machine();
        let hw = hardware();
        let merge = merge_inspection(&m, &hw, &[]);
        let mut after = m.clone();
        after.serial = Some("SN-1".into());
        after.smbios_uuid = hw.smbios_uuid;
        after.manufacturer = hw.manufacturer.clone();
        after.model = hw.model.clone();
        after.interfaces = serde_json::from_value(merge.patch["interfaces"].clone()).expect("nics");
        after.disks = serde_json::from_value(merge.patch["disks"].clone()).expect("disks");
        let again = merge_inspection(&after, &hw, &[]);
        assert!(again.patch.is_empty(), "{:?}", again.patch);
        assert!(again.changes.is_empty() && again.conflicts.is_empty());
    }

    #[test]
    fn drives_without_serial_match_by_model_and_size() {
        let mut m = machine();
        m.disks.push(Disk {
            model: Some("CM6".into()),
            size_bytes: Some(100),
            ..Disk::default()
        });
        let mut hw = hardware();
        hw.drives = vec![drive(None, "CM6", 100), drive(None, "CM6", 100)];
        let merge = merge_inspection(&m, &hw, &[]);
        let disks = merge.patch["disks"].as_array().expect("disks");
        assert_eq!(disks.len(), 2, "one known, one added");
    }

    #[test]
    fn client_key_changes_with_password() {
        let b = domain::Bmc {
            url: "https://bmc".into(),
            username: "root".into(),
            tls: domain::TlsMode::Insecure,
            fingerprint: None,
            has_password: true,
        };
        assert_eq!(client_key(&b, "a"), client_key(&b, "a"));
        assert_ne!(client_key(&b, "a"), client_key(&b, "b"));
    }
}
