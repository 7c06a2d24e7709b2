//! What a BMC inspection found (the system's identity, its NICs and drives) and the pure rule that
//! merges it into a machine: fill empty fields, add NICs and disks not yet known, and report (never
//! overwrite) values that contradict what a tech registered or that belong to another machine.
//!
//! Pure data and rules: no I/O, no Redfish, no store. Imports only the rest of `domain`.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::{Disk, DiskType, Interface, MacAddr, Machine, MachineRef, UniqueKey};

/// Hardware found out of band, without booting the machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InspectedHardware {
    /// SMBIOS system UUID.
    pub smbios_uuid: Option<Uuid>,
    /// System serial number.
    pub serial: Option<String>,
    /// Manufacturer, e.g. `Dell Inc.`.
    pub manufacturer: Option<String>,
    /// Model, e.g. `PowerEdge R750`.
    pub model: Option<String>,
    /// System BIOS/UEFI firmware version.
    pub bios_version: Option<String>,
    /// Host network interfaces (the BMC's own host interface is flagged, not dropped).
    pub nics: Vec<InspectedNic>,
    /// Drives from `Storage`/`Drives`, or from `SimpleStorage` where that is all the BMC has.
    pub drives: Vec<InspectedDrive>,
    /// Where the drive list came from.
    pub drive_source: DriveSource,
}

impl InspectedHardware {
    /// MAC addresses of the host NICs, without the BMC host interface, each once.
    pub fn host_macs(&self) -> Vec<MacAddr> {
        let mut out: Vec<MacAddr> = Vec::new();
        for n in self.nics.iter().filter(|n| !n.bmc_host_interface) {
            if !out.contains(&n.mac) {
                out.push(n.mac);
            }
        }
        out
    }
}

/// A host network interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InspectedNic {
    /// Redfish `Id`, e.g. `NIC.Integrated.1-1-1`.
    pub id: String,
    /// Current MAC (`MACAddress`): what DHCP sees.
    pub mac: MacAddr,
    /// Burned-in MAC (`PermanentMACAddress`) when the BMC reports one.
    pub permanent_mac: Option<MacAddr>,
    /// `InterfaceEnabled`, when reported.
    pub enabled: Option<bool>,
    /// `LinkStatus`, e.g. `LinkUp`.
    pub link_status: Option<String>,
    /// `EthernetInterfaceType`: `Physical` or `Virtual` (a VLAN, a team), when reported.
    pub interface_type: Option<String>,
    /// The USB/virtual NIC between host and BMC (Redfish host interface): not a boot NIC.
    pub bmc_host_interface: bool,
}

/// A drive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InspectedDrive {
    /// Redfish `Name` or `Id`, e.g. `Disk.Bay.0`.
    pub name: Option<String>,
    /// Model string, trimmed.
    pub model: Option<String>,
    /// Serial number, trimmed.
    pub serial: Option<String>,
    /// Manufacturer, trimmed.
    pub manufacturer: Option<String>,
    /// Capacity in bytes.
    pub capacity_bytes: Option<u64>,
    /// `MediaType` as reported (`SSD`, `HDD`, `SMR`...).
    pub media_type: Option<String>,
    /// `Protocol` as reported (`NVMe`, `SATA`, `SAS`, `PCIe`...), or the controller's device protocol.
    pub protocol: Option<String>,
    /// nvme, ssd or hdd, when it can be told from the above.
    pub disk_type: Option<DiskType>,
}

/// Where the drive list of an inspection came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DriveSource {
    /// `Systems/<id>/Storage/<ctrl>/Drives`.
    Storage,
    /// `Systems/<id>/SimpleStorage` (no serials there).
    SimpleStorage,
    /// The BMC reports no drives.
    #[default]
    None,
}

/// Tell the disk type from what Redfish reports.
pub fn disk_type_of(media_type: Option<&str>, protocol: Option<&str>) -> Option<DiskType> {
    let proto = protocol.map(str::to_ascii_lowercase);
    let media = media_type.map(str::to_ascii_lowercase);
    if proto.as_deref() == Some("nvme") {
        return Some(DiskType::Nvme);
    }
    match media.as_deref() {
        Some("hdd") | Some("smr") => Some(DiskType::Hdd),
        // An SSD on PCIe is NVMe (Dell reports NVMe drives as Protocol "PCIe").
        Some("ssd") if proto.as_deref() == Some("pcie") => Some(DiskType::Nvme),
        Some("ssd") => Some(DiskType::Ssd),
        _ if proto.as_deref() == Some("pcie") => Some(DiskType::Nvme),
        _ => None,
    }
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

/// The unique values an inspection may write: serial, SMBIOS UUID and the host NICs' MACs.
pub fn inspected_keys(hw: &InspectedHardware) -> Vec<UniqueKey> {
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
    use crate::domain::{LifecycleState, MachineId};
    use chrono::Utc;

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
            state_by: None,
            manual_hold: false,
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
    fn disk_types() {
        let t = |m, p| disk_type_of(m, p);
        assert_eq!(t(Some("SSD"), Some("NVMe")), Some(DiskType::Nvme));
        assert_eq!(t(Some("SSD"), Some("PCIe")), Some(DiskType::Nvme));
        assert_eq!(t(Some("SSD"), Some("SATA")), Some(DiskType::Ssd));
        assert_eq!(t(Some("HDD"), Some("SAS")), Some(DiskType::Hdd));
        assert_eq!(t(None, Some("NVMe")), Some(DiskType::Nvme));
        assert_eq!(t(None, None), None);
        assert_eq!(t(Some("Tape"), Some("SAS")), None);
    }
}
