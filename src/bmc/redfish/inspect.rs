//! Out-of-band inspection: SMBIOS UUID, serial, manufacturer, model and BIOS version of the
//! system; its NICs (the Redfish host interface flagged, not dropped); its drives from
//! `Storage`/`Drives` (a controller's single device protocol filling in for drives that name none),
//! or from `SimpleStorage` where that is all the BMC has. Absent drives are skipped.

use serde_json::Value;
use uuid::Uuid;

use super::discovery::Discovered;
use super::RedfishBmc;
use crate::bmc::odata::{
    flag, link, links_at, list, members, number, same_link, text, text_at, texts_at,
};
use crate::bmc::BmcError;
use crate::domain::MacAddr;
use crate::domain::{disk_type_of, DriveSource, InspectedDrive, InspectedHardware, InspectedNic};

impl RedfishBmc {
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
                enabled: flag(&nic.json, "InterfaceEnabled"),
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
        let storages = match members(&self.t, &coll).await {
            Ok(l) => l,
            Err(BmcError::Http { status: 404, .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out: Vec<InspectedDrive> = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for s in storages {
            let storage = self.t.get(&s).await?;
            // A controller that speaks one device protocol names it for drives that do not.
            let mut protos: Vec<String> = Vec::new();
            for c in list(&storage.json, "StorageControllers") {
                for p in texts_at(c, "/SupportedDeviceProtocols") {
                    if !protos.contains(&p) {
                        protos.push(p);
                    }
                }
            }
            let controller_proto = if protos.len() == 1 {
                protos.pop()
            } else {
                None
            };
            let mut drives = links_at(&storage.json, "/Drives");
            if let Some(next) = text(&storage.json, "Drives@odata.nextLink") {
                drives.extend(members(&self.t, &next).await?);
            }
            for dl in drives {
                if seen.iter().any(|x| same_link(x, &dl)) {
                    continue;
                }
                seen.push(dl.clone());
                let dr = self.t.get(&dl).await?;
                if text_at(&dr.json, "/Status/State").as_deref() == Some("Absent") {
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
                    capacity_bytes: number(&dr.json, "CapacityBytes"),
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
            for dev in list(&doc.json, "Devices") {
                if text_at(dev, "/Status/State").as_deref() == Some("Absent") {
                    continue;
                }
                out.push(InspectedDrive {
                    name: text(dev, "Name"),
                    model: text(dev, "Model"),
                    serial: None,
                    manufacturer: text(dev, "Manufacturer"),
                    capacity_bytes: number(dev, "CapacityBytes"),
                    media_type: None,
                    protocol: None,
                    disk_type: None,
                });
            }
        }
        Ok(out)
    }

    /// Out-of-band hardware inventory.
    pub(super) async fn inspect_now(&self) -> Result<InspectedHardware, BmcError> {
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
}
