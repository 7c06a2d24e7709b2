//! `RedfishBmc`: the `Bmc` trait over a Redfish service, found entirely by following links from
//! the service root (root -> Systems -> the system -> its Manager, Storage, EthernetInterfaces,
//! VirtualMedia).
//!
//! State changes are confirmed, not assumed: power polls `PowerState` to the target under a
//! deadline, the boot override and virtual media are read back after they are written.

use std::time::Instant;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::OnceCell;
use uuid::Uuid;

use super::odata::{link, links_at, members, same_link, text, texts_at, under};
use super::quirks::{quirks_for, ModeInPatch, Quirks};
use super::transport::{AuthMode, BmcEndpoint, BmcOptions, Doc, Transport, SERVICE_ROOT};
use super::BmcError;
use crate::domain::MacAddr;
use crate::service::bmc::{
    disk_type_of, Bmc, BootMode, BootOverride, BootTarget, Capabilities, DriveSource, EtagSupport,
    InspectedDrive, InspectedHardware, InspectedNic, MediaLocation, PowerAction, PowerState,
    VirtualMediaStatus,
};

/// What discovery found once per client: the root, the system and its manager, and the quirks.
#[derive(Debug)]
struct Discovered {
    root: Value,
    system: String,
    manager: Option<String>,
    vendor: Option<String>,
    model: Option<String>,
    quirks: &'static Quirks,
}

/// A Redfish BMC.
pub struct RedfishBmc {
    t: Transport,
    found: OnceCell<Discovered>,
}

impl std::fmt::Debug for RedfishBmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishBmc")
            .field("auth", &self.t.auth_mode())
            .field("tls", self.t.tls())
            .finish_non_exhaustive()
    }
}

const RESET_ACTION: &str = "#ComputerSystem.Reset";

impl RedfishBmc {
    /// A client for one BMC. No I/O happens until the first call; the session is created then.
    pub fn new(endpoint: BmcEndpoint, options: BmcOptions) -> Result<Self, BmcError> {
        Ok(RedfishBmc {
            t: Transport::new(&endpoint, options)?,
            found: OnceCell::new(),
        })
    }

    /// How the client authenticates right now (`None` before the first request).
    pub fn auth_mode(&self) -> AuthMode {
        self.t.auth_mode()
    }

    /// The Redfish URI of the system this client drives.
    pub async fn system_uri(&self) -> Result<String, BmcError> {
        Ok(self.discover().await?.system.clone())
    }

    /// The quirk row that applies to this BMC.
    pub async fn quirks(&self) -> Result<&'static Quirks, BmcError> {
        Ok(self.discover().await?.quirks)
    }

    async fn discover(&self) -> Result<&Discovered, BmcError> {
        self.found.get_or_try_init(|| self.discover_now()).await
    }

    async fn discover_now(&self) -> Result<Discovered, BmcError> {
        let root = self.t.get(SERVICE_ROOT).await?;
        let systems = link(&root.json, "Systems").ok_or_else(|| BmcError::Protocol {
            path: SERVICE_ROOT.into(),
            reason: "the service root links no Systems collection".into(),
        })?;
        let list = members(&self.t, &systems).await?;
        let system = match &self.t.options().system {
            None => list.first().cloned(),
            Some(want) => list
                .iter()
                .find(|m| {
                    same_link(m, want) || m.trim_end_matches('/').rsplit('/').next() == Some(want)
                })
                .cloned(),
        }
        .ok_or_else(|| BmcError::Protocol {
            path: self.t.path_of(&systems),
            reason: match &self.t.options().system {
                Some(w) => format!("no system `{w}` among {list:?}"),
                None => "the Systems collection is empty".into(),
            },
        })?;
        let sys = self.t.get(&system).await?;
        let mut manager = links_at(&sys.json, "/Links/ManagedBy").into_iter().next();
        if manager.is_none() {
            if let Some(managers) = link(&root.json, "Managers") {
                manager = members(&self.t, &managers).await?.into_iter().next();
            }
        }
        let manager_doc = match &manager {
            Some(m) => self.t.get(m).await.ok(),
            None => None,
        };
        let root_vendor = text(&root.json, "Vendor");
        let sys_maker = text(&sys.json, "Manufacturer");
        let mgr_maker = manager_doc
            .as_ref()
            .and_then(|d| text(&d.json, "Manufacturer"));
        let oem_keys: Vec<String> = root
            .json
            .get("Oem")
            .and_then(Value::as_object)
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let mut names: Vec<&str> = Vec::new();
        names.extend(root_vendor.as_deref());
        names.extend(sys_maker.as_deref());
        names.extend(mgr_maker.as_deref());
        names.extend(oem_keys.iter().map(String::as_str));
        let model = text(&sys.json, "Model");
        let quirks = quirks_for(&names, model.as_deref());
        if quirks.if_match_required {
            self.t.require_if_match();
        }
        tracing::debug!(system = %self.t.path_of(&system), quirks = quirks.name, "BMC discovered");
        Ok(Discovered {
            root: root.json,
            system,
            manager,
            vendor: root_vendor.or(sys_maker),
            model,
            quirks,
        })
    }

    async fn system(&self) -> Result<Doc, BmcError> {
        let d = self.discover().await?;
        self.t.get(&d.system).await
    }

    /// Allowed reset types: from `ResetType@Redfish.AllowableValues`, else the action's
    /// `@Redfish.ActionInfo`. Empty when the BMC does not say.
    async fn reset_types(&self, sys: &Value) -> Result<Vec<String>, BmcError> {
        let action = sys.pointer("/Actions").and_then(|a| a.get(RESET_ACTION));
        let Some(action) = action else {
            return Ok(Vec::new());
        };
        let listed = texts_at(action, "/ResetType@Redfish.AllowableValues");
        if !listed.is_empty() {
            return Ok(listed);
        }
        if let Some(info) = action.get("@Redfish.ActionInfo").and_then(Value::as_str) {
            let doc = self.t.get(info).await?;
            let params = doc
                .json
                .get("Parameters")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for p in params {
                if p.get("Name").and_then(Value::as_str) == Some("ResetType") {
                    return Ok(texts_at(&p, "/AllowableValues"));
                }
            }
        }
        Ok(Vec::new())
    }

    async fn reset(&self, sys: &Value, allowed: &[String], kind: &str) -> Result<(), BmcError> {
        let target = sys
            .pointer("/Actions")
            .and_then(|a| a.get(RESET_ACTION))
            .and_then(|a| a.get("target"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                BmcError::NotSupported("the system has no ComputerSystem.Reset action".into())
            })?;
        if !allowed.is_empty() && !allowed.iter().any(|a| a == kind) {
            return Err(BmcError::NotSupported(format!(
                "reset type {kind} (allowed: {})",
                allowed.join(", ")
            )));
        }
        tracing::info!(reset = kind, "BMC reset");
        self.t.post(target, &json!({ "ResetType": kind })).await?;
        Ok(())
    }

    /// Pick the first allowed of `kinds` (or the first when the BMC lists nothing).
    fn pick<'a>(allowed: &[String], kinds: &[&'a str]) -> Option<&'a str> {
        if allowed.is_empty() {
            return kinds.first().copied();
        }
        kinds
            .iter()
            .copied()
            .find(|k| allowed.iter().any(|a| a == k))
    }

    async fn wait_power(
        &self,
        target: PowerState,
        started: Instant,
    ) -> Result<PowerState, BmcError> {
        let limit = self.t.options().power_timeout;
        let deadline = started + limit;
        loop {
            let sys = self.system().await?;
            let state = power_of(&sys)?;
            if state == target {
                return Ok(state);
            }
            if Instant::now() + self.t.options().poll_interval > deadline {
                return Err(BmcError::Deadline {
                    what: format!("power {target}"),
                    after: limit,
                    last: state.to_string(),
                });
            }
            tokio::time::sleep(self.t.options().poll_interval).await;
        }
    }

    /// The virtual CD/DVD slot: from the System's and the Manager's VirtualMedia links, in the
    /// order the quirks prefer, the first slot whose MediaTypes include CD or DVD.
    async fn cd_slot(&self) -> Result<(Doc, MediaLocation), BmcError> {
        let d = self.discover().await?;
        let sys = self.system().await?;
        let mut collections: Vec<String> = Vec::new();
        let sys_vm = link(&sys.json, "VirtualMedia");
        let mgr_vm = match &d.manager {
            Some(m) => link(&self.t.get(m).await?.json, "VirtualMedia"),
            None => None,
        };
        let (first, second) = match d.quirks.media_location {
            MediaLocation::System => (sys_vm, mgr_vm),
            MediaLocation::Manager => (mgr_vm, sys_vm),
        };
        for c in [first, second].into_iter().flatten() {
            if !collections.iter().any(|x| same_link(x, &c)) {
                collections.push(c);
            }
        }
        if collections.is_empty() {
            return Err(BmcError::NotSupported(
                "neither the System nor the Manager links VirtualMedia".into(),
            ));
        }
        let mut fallback: Option<Doc> = None;
        for c in &collections {
            for m in members(&self.t, c).await? {
                let slot = self.t.get(&m).await?;
                let types = texts_at(&slot.json, "/MediaTypes");
                let is_cd = types
                    .iter()
                    .any(|t| t.eq_ignore_ascii_case("CD") || t.eq_ignore_ascii_case("DVD"));
                if is_cd {
                    let loc = self.location_of(&slot.uri, d);
                    return Ok((slot, loc));
                }
                let named_cd = text(&slot.json, "Id")
                    .or_else(|| text(&slot.json, "Name"))
                    .is_some_and(|n| n.to_ascii_uppercase().contains("CD"));
                if types.is_empty() && named_cd && fallback.is_none() {
                    fallback = Some(slot);
                }
            }
        }
        match fallback {
            Some(slot) => {
                let loc = self.location_of(&slot.uri, d);
                Ok((slot, loc))
            }
            None => Err(BmcError::NotSupported(format!(
                "no CD/DVD slot in {}",
                collections
                    .iter()
                    .map(|c| self.t.path_of(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    fn location_of(&self, slot: &str, d: &Discovered) -> MediaLocation {
        let slot = self.t.path_of(slot);
        match &d.manager {
            Some(m) if under(&slot, &self.t.path_of(m)) => MediaLocation::Manager,
            _ => MediaLocation::System,
        }
    }

    fn media_status(slot: &Doc, location: MediaLocation) -> VirtualMediaStatus {
        VirtualMediaStatus {
            slot: slot.uri.clone(),
            location,
            inserted: slot
                .json
                .get("Inserted")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            image: text(&slot.json, "Image"),
            connected_via: text(&slot.json, "ConnectedVia"),
            media_types: texts_at(&slot.json, "/MediaTypes"),
        }
    }

    /// Read a slot again until `done` holds, a few polls at most.
    async fn settle_media(
        &self,
        slot: &str,
        location: MediaLocation,
        done: impl Fn(&VirtualMediaStatus) -> bool,
    ) -> Result<VirtualMediaStatus, BmcError> {
        let mut status = Self::media_status(&self.t.get(slot).await?, location);
        for _ in 0..5 {
            if done(&status) {
                break;
            }
            tokio::time::sleep(self.t.options().poll_interval).await;
            status = Self::media_status(&self.t.get(slot).await?, location);
        }
        Ok(status)
    }

    async fn eject_slot(
        &self,
        slot: &Doc,
        location: MediaLocation,
    ) -> Result<VirtualMediaStatus, BmcError> {
        let eject = slot
            .json
            .pointer("/Actions")
            .and_then(|a| a.get("#VirtualMedia.EjectMedia"))
            .and_then(|a| a.get("target"))
            .and_then(Value::as_str);
        match eject {
            Some(target) => {
                self.t.post(target, &json!({})).await?;
            }
            None => {
                self.t
                    .patch(
                        &slot.uri,
                        &json!({"Image": null, "Inserted": false}),
                        slot.etag.clone(),
                    )
                    .await?;
            }
        }
        let status = self
            .settle_media(&slot.uri, location, |s| !s.inserted)
            .await?;
        if status.inserted {
            return Err(BmcError::MediaNotApplied {
                slot: slot.uri.clone(),
                reason: format!(
                    "eject accepted but media is still inserted ({})",
                    status.image.as_deref().unwrap_or("no image shown")
                ),
            });
        }
        Ok(status)
    }

    /// Parameters InsertMedia accepts, from its `@Redfish.ActionInfo` (None: not described).
    async fn insert_params(&self, action: &Value) -> Result<Option<Vec<String>>, BmcError> {
        let Some(info) = action.get("@Redfish.ActionInfo").and_then(Value::as_str) else {
            return Ok(None);
        };
        let doc = self.t.get(info).await?;
        Ok(Some(
            doc.json
                .get("Parameters")
                .and_then(Value::as_array)
                .map(|ps| {
                    ps.iter()
                        .filter_map(|p| p.get("Name").and_then(Value::as_str))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        ))
    }

    async fn boot_override_of(&self) -> Result<(Doc, BootOverride), BmcError> {
        let sys = self.system().await?;
        let b = sys.json.get("Boot").cloned().unwrap_or(Value::Null);
        let ov = BootOverride {
            target: text(&b, "BootSourceOverrideTarget"),
            enabled: text(&b, "BootSourceOverrideEnabled"),
            mode: text(&b, "BootSourceOverrideMode"),
        };
        Ok((sys, ov))
    }

    async fn nics(&self, sys: &Value, d: &Discovered) -> Result<Vec<InspectedNic>, BmcError> {
        let Some(coll) = link(sys, "EthernetInterfaces") else {
            return Ok(Vec::new());
        };
        let host_ifaces = self.host_interface_nics(&coll, d).await;
        let mut out = Vec::new();
        for m in members(&self.t, &coll).await? {
            let nic = self.t.get(&m).await?;
            let Some(mac) = text(&nic.json, "MACAddress").and_then(|s| s.parse::<MacAddr>().ok())
            else {
                tracing::debug!(nic = %self.t.path_of(&m), "NIC without a usable MAC address; skipped");
                continue;
            };
            if mac.0 == [0; 6] {
                continue;
            }
            out.push(InspectedNic {
                id: text(&nic.json, "Id").unwrap_or_else(|| m.clone()),
                mac,
                permanent_mac: text(&nic.json, "PermanentMACAddress")
                    .and_then(|s| s.parse::<MacAddr>().ok())
                    .filter(|m| m.0 != [0; 6]),
                enabled: nic.json.get("InterfaceEnabled").and_then(Value::as_bool),
                link_status: text(&nic.json, "LinkStatus"),
                interface_type: text(&nic.json, "EthernetInterfaceType"),
                bmc_host_interface: host_ifaces.iter().any(|h| same_link(h, &m)),
            });
        }
        Ok(out)
    }

    /// System NICs that are the Redfish host interface (the host's side of the BMC link), from
    /// the Manager's HostInterfaces. A HostEthernetInterfaces link to the whole system NIC
    /// collection (iDRAC does this) names no particular NIC and is ignored.
    async fn host_interface_nics(&self, system_nics: &str, d: &Discovered) -> Vec<String> {
        let mut out = Vec::new();
        let Some(manager) = &d.manager else {
            return out;
        };
        let Ok(mgr) = self.t.get(manager).await else {
            return out;
        };
        let Some(hi) = link(&mgr.json, "HostInterfaces") else {
            return out;
        };
        let Ok(list) = members(&self.t, &hi).await else {
            return out;
        };
        for h in list {
            let Ok(doc) = self.t.get(&h).await else {
                continue;
            };
            let Some(hei) = link(&doc.json, "HostEthernetInterfaces") else {
                continue;
            };
            if same_link(&hei, system_nics) {
                continue;
            }
            if let Ok(ms) = members(&self.t, &hei).await {
                out.extend(ms);
            }
        }
        out
    }

    async fn storage_drives(&self, sys: &Value) -> Result<Vec<InspectedDrive>, BmcError> {
        let Some(coll) = link(sys, "Storage") else {
            return Ok(Vec::new());
        };
        let list = match members(&self.t, &coll).await {
            Ok(l) => l,
            Err(BmcError::Http { status: 404, .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out: Vec<InspectedDrive> = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for s in list {
            let storage = self.t.get(&s).await?;
            // A controller that speaks one device protocol names it for drives that do not.
            let mut protos: Vec<String> = Vec::new();
            if let Some(ctrls) = storage
                .json
                .get("StorageControllers")
                .and_then(Value::as_array)
            {
                for c in ctrls {
                    for p in texts_at(c, "/SupportedDeviceProtocols") {
                        if !protos.contains(&p) {
                            protos.push(p);
                        }
                    }
                }
            }
            let controller_proto = if protos.len() == 1 {
                protos.pop()
            } else {
                None
            };
            let mut drives = links_at(&storage.json, "/Drives");
            if let Some(next) = storage
                .json
                .get("Drives@odata.nextLink")
                .and_then(Value::as_str)
            {
                drives.extend(members(&self.t, next).await?);
            }
            for dl in drives {
                if seen.iter().any(|x| same_link(x, &dl)) {
                    continue;
                }
                seen.push(dl.clone());
                let dr = self.t.get(&dl).await?;
                if dr.json.pointer("/Status/State").and_then(Value::as_str) == Some("Absent") {
                    continue;
                }
                let media_type = text(&dr.json, "MediaType");
                let protocol = text(&dr.json, "Protocol").or_else(|| controller_proto.clone());
                let serial = text(&dr.json, "SerialNumber");
                if serial.is_some() && out.iter().any(|o| o.serial == serial) {
                    continue;
                }
                out.push(InspectedDrive {
                    name: text(&dr.json, "Name").or_else(|| text(&dr.json, "Id")),
                    model: text(&dr.json, "Model"),
                    serial,
                    manufacturer: text(&dr.json, "Manufacturer"),
                    capacity_bytes: dr.json.get("CapacityBytes").and_then(Value::as_u64),
                    disk_type: disk_type_of(media_type.as_deref(), protocol.as_deref()),
                    media_type,
                    protocol,
                });
            }
        }
        Ok(out)
    }

    async fn simple_storage_drives(&self, sys: &Value) -> Result<Vec<InspectedDrive>, BmcError> {
        let Some(coll) = link(sys, "SimpleStorage") else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for s in members(&self.t, &coll).await? {
            let doc = self.t.get(&s).await?;
            let devices = doc
                .json
                .get("Devices")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for dev in devices {
                if dev.pointer("/Status/State").and_then(Value::as_str) == Some("Absent") {
                    continue;
                }
                out.push(InspectedDrive {
                    name: text(&dev, "Name"),
                    model: text(&dev, "Model"),
                    serial: None,
                    manufacturer: text(&dev, "Manufacturer"),
                    capacity_bytes: dev.get("CapacityBytes").and_then(Value::as_u64),
                    media_type: None,
                    protocol: None,
                    disk_type: None,
                });
            }
        }
        Ok(out)
    }
}

fn power_of(sys: &Doc) -> Result<PowerState, BmcError> {
    text(&sys.json, "PowerState")
        .map(|s| PowerState::from_redfish(&s))
        .ok_or_else(|| BmcError::Protocol {
            path: sys.uri.clone(),
            reason: "the system reports no PowerState".into(),
        })
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

#[async_trait]
impl Bmc for RedfishBmc {
    async fn power_state(&self) -> Result<PowerState, BmcError> {
        power_of(&self.system().await?)
    }

    async fn power(&self, action: PowerAction) -> Result<PowerState, BmcError> {
        let started = Instant::now();
        let sys = self.system().await?;
        let state = power_of(&sys)?;
        let allowed = self.reset_types(&sys.json).await?;
        match action {
            PowerAction::On => {
                if state == PowerState::On {
                    return Ok(state);
                }
                let kind = Self::pick(&allowed, &["On", "ForceOn", "PushPowerButton"]).ok_or_else(
                    || {
                        BmcError::NotSupported(format!(
                            "power on (allowed: {})",
                            allowed.join(", ")
                        ))
                    },
                )?;
                self.reset(&sys.json, &allowed, kind).await?;
                self.wait_power(PowerState::On, started).await
            }
            PowerAction::Off => {
                if state == PowerState::Off {
                    return Ok(state);
                }
                let kind = Self::pick(
                    &allowed,
                    &["ForceOff", "GracefulShutdown", "PushPowerButton"],
                )
                .ok_or_else(|| {
                    BmcError::NotSupported(format!("power off (allowed: {})", allowed.join(", ")))
                })?;
                self.reset(&sys.json, &allowed, kind).await?;
                self.wait_power(PowerState::Off, started).await
            }
            PowerAction::Cycle => {
                if state == PowerState::Off {
                    // Cycling a machine that is off means turning it on.
                    return Box::pin(self.power(PowerAction::On)).await;
                }
                if allowed.iter().any(|a| a == "PowerCycle") {
                    self.reset(&sys.json, &allowed, "PowerCycle").await?;
                    return self.wait_power(PowerState::On, started).await;
                }
                tracing::info!("PowerCycle not allowed; cycling as off, wait for Off, on");
                let off = Self::pick(&allowed, &["ForceOff"]).ok_or_else(|| {
                    BmcError::NotSupported(format!("power cycle (allowed: {})", allowed.join(", ")))
                })?;
                self.reset(&sys.json, &allowed, off).await?;
                self.wait_power(PowerState::Off, started).await?;
                let on = Self::pick(&allowed, &["On", "ForceOn"]).ok_or_else(|| {
                    BmcError::NotSupported(format!("power on (allowed: {})", allowed.join(", ")))
                })?;
                let sys = self.system().await?;
                self.reset(&sys.json, &allowed, on).await?;
                self.wait_power(PowerState::On, started).await
            }
            PowerAction::GracefulRestart => {
                if state != PowerState::On {
                    return Err(BmcError::NotSupported(format!(
                        "graceful restart of a system that is {state}"
                    )));
                }
                self.reset(&sys.json, &allowed, "GracefulRestart").await?;
                self.wait_power(PowerState::On, started).await
            }
        }
    }

    async fn boot_once(
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
        let allowed = texts_at(
            &sys.json,
            "/Boot/BootSourceOverrideTarget@Redfish.AllowableValues",
        );
        let rf_target = redfish_target(target, &allowed, d.quirks)?;
        let mode_settable = current.mode.is_some();
        if mode.is_some() && !mode_settable {
            return Err(BmcError::NotSupported(
                "the BMC exposes no BootSourceOverrideMode, so the boot mode cannot be set".into(),
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

    async fn media_insert(&self, image_url: &str) -> Result<VirtualMediaStatus, BmcError> {
        let d = self.discover().await?;
        let url = reqwest::Url::parse(image_url)
            .map_err(|e| BmcError::Config(format!("image URL `{image_url}`: {e}")))?;
        let (mut slot, location) = self.cd_slot().await?;
        if Self::media_status(&slot, location).inserted {
            tracing::info!(slot = %self.t.path_of(&slot.uri), "ejecting the current image first");
            self.eject_slot(&slot, location).await?;
            slot = self.t.get(&slot.uri).await?;
        }
        let action = slot
            .json
            .pointer("/Actions")
            .and_then(|a| a.get("#VirtualMedia.InsertMedia"))
            .cloned();
        match action {
            Some(action) => {
                let target = action
                    .get("target")
                    .and_then(Value::as_str)
                    .ok_or_else(|| BmcError::Protocol {
                        path: slot.uri.clone(),
                        reason: "InsertMedia action without a target".into(),
                    })?;
                let params = self.insert_params(&action).await?;
                let allowed = |p: &str| match &params {
                    Some(list) => list.iter().any(|x| x == p),
                    None => !d.quirks.insert_image_only,
                };
                let mut body = serde_json::Map::new();
                body.insert("Image".into(), json!(image_url));
                if allowed("Inserted") {
                    body.insert("Inserted".into(), json!(true));
                }
                if allowed("WriteProtected") {
                    body.insert("WriteProtected".into(), json!(true));
                }
                if params.is_some() && allowed("TransferProtocolType") {
                    body.insert(
                        "TransferProtocolType".into(),
                        json!(url.scheme().to_ascii_uppercase()),
                    );
                }
                self.t.post(target, &Value::Object(body)).await?;
            }
            None => {
                self.t
                    .patch(
                        &slot.uri,
                        &json!({"Image": image_url, "Inserted": true}),
                        slot.etag.clone(),
                    )
                    .await?;
            }
        }
        let status = self
            .settle_media(&slot.uri, location, |s| {
                s.inserted && s.image.as_deref() == Some(image_url)
            })
            .await?;
        if !(status.inserted && status.image.as_deref() == Some(image_url)) {
            return Err(BmcError::MediaNotApplied {
                slot: slot.uri.clone(),
                reason: format!(
                    "insert accepted, but the slot shows inserted={} image={}",
                    status.inserted,
                    status.image.as_deref().unwrap_or("(none)")
                ),
            });
        }
        Ok(status)
    }

    async fn media_eject(&self) -> Result<VirtualMediaStatus, BmcError> {
        let (slot, location) = self.cd_slot().await?;
        let status = Self::media_status(&slot, location);
        if !status.inserted {
            return Ok(status);
        }
        self.eject_slot(&slot, location).await
    }

    async fn media_status(&self) -> Result<VirtualMediaStatus, BmcError> {
        let (slot, location) = self.cd_slot().await?;
        Ok(Self::media_status(&slot, location))
    }

    async fn inspect(&self) -> Result<InspectedHardware, BmcError> {
        let d = self.discover().await?;
        let sys = self.system().await?;
        let j = &sys.json;
        let nics = self.nics(j, d).await?;
        let mut drives = self.storage_drives(j).await?;
        let mut source = DriveSource::Storage;
        if drives.is_empty() {
            drives = self.simple_storage_drives(j).await?;
            source = DriveSource::SimpleStorage;
        }
        if drives.is_empty() {
            source = DriveSource::None;
        }
        Ok(InspectedHardware {
            smbios_uuid: text(j, "UUID").and_then(|u| Uuid::parse_str(&u).ok()),
            serial: text(j, "SerialNumber"),
            manufacturer: text(j, "Manufacturer"),
            model: text(j, "Model"),
            bios_version: text(j, "BiosVersion"),
            nics,
            drives,
            drive_source: source,
        })
    }

    async fn capabilities(&self) -> Result<Capabilities, BmcError> {
        let d = self.discover().await?;
        let sys = self.system().await?;
        let reset_types = self.reset_types(&sys.json).await?;
        let boot_targets = texts_at(
            &sys.json,
            "/Boot/BootSourceOverrideTarget@Redfish.AllowableValues",
        );
        let virtual_media = match self.cd_slot().await {
            Ok((_, loc)) => Some(loc),
            Err(BmcError::NotSupported(_)) => None,
            Err(e) => return Err(e),
        };
        let etag = sys.etag.clone();
        Ok(Capabilities {
            vendor: d.vendor.clone(),
            model: d.model.clone(),
            quirks: (d.quirks.name != "generic").then(|| d.quirks.name.to_string()),
            redfish_version: text(&d.root, "RedfishVersion"),
            sessions: d
                .root
                .pointer("/Links/Sessions/@odata.id")
                .and_then(Value::as_str)
                .is_some()
                || self.t.sessions_linked(),
            auth: match self.t.auth_mode() {
                AuthMode::Session => "session".into(),
                AuthMode::Basic => "basic".into(),
                AuthMode::None => "none".into(),
            },
            reset_types,
            boot_targets,
            boot_mode_settable: sys.json.pointer("/Boot/BootSourceOverrideMode").is_some(),
            virtual_media,
            etag: EtagSupport {
                offered: etag.is_some(),
                weak: etag.as_deref().is_some_and(|e| e.starts_with("W/")),
                if_match_required: self.t.if_match_required(),
            },
            tls: self.t.tls().mode(),
        })
    }

    async fn close(&self) -> Result<(), BmcError> {
        self.t.close().await
    }
}
