//! The machine record: identity (SMBIOS UUID, serial, asset tag), placement (site, rack, unit), role in
//! a Talos cluster, lifecycle state, and the hardware it carries (NICs, disks, BMC).
//!
//! `MachineSpec` is what an operator writes (API, CLI, CSV/JSON import); `Machine` is what the
//! inventory holds and shows. Validation and normalisation of a spec happen here, once.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{MacAddr, ValidationErrors};

/// Identifier of a machine in the inventory (a UUIDv7, so ids sort by creation time).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(transparent)]
#[schema(value_type = String, format = Uuid)]
pub struct MachineId(pub Uuid);

impl MachineId {
    /// A new, time-ordered id.
    pub fn new() -> Self {
        MachineId(Uuid::now_v7())
    }
}

impl Default for MachineId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for MachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for MachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for MachineId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(MachineId)
    }
}

macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
        pub enum $name { $($(#[$vm])* #[serde(rename = $s)] $v),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            /// The wire and database spelling.
            pub fn as_str(&self) -> &'static str {
                match self { $($name::$v => $s),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($s => Ok($name::$v),)+
                    other => Err(format!(
                        "`{other}` is not one of: {}",
                        [$($s),+].join(", ")
                    )),
                }
            }
        }
    };
}

text_enum!(
    /// Role of a machine in its Talos cluster.
    Role {
        /// Runs etcd and the Kubernetes control plane.
        ControlPlane = "control-plane",
        /// Runs workloads.
        Worker = "worker",
    }
);

text_enum!(
    /// Where a machine is in its life with Plinth.
    LifecycleState {
        /// Booted against Plinth, not yet accepted by anyone.
        Discovered = "discovered",
        /// Accepted into the inventory by a tech or the API.
        Registered = "registered",
        /// Its hardware is being inspected.
        Inspecting = "inspecting",
        /// Known hardware, ready to provision.
        Ready = "ready",
        /// Talos is being installed.
        Provisioning = "provisioning",
        /// Talos is installed and answering.
        Installed = "installed",
        /// A step failed; `state_reason` says which.
        Failed = "failed",
        /// Plinth keeps its hands off.
        Maintenance = "maintenance",
    }
);

text_enum!(
    /// Kind of disk, as the install-disk rules see it.
    DiskType {
        /// NVMe flash.
        Nvme = "nvme",
        /// SATA/SAS flash.
        Ssd = "ssd",
        /// Spinning disk.
        Hdd = "hdd",
    }
);

text_enum!(
    /// How Plinth verifies a BMC's TLS certificate.
    TlsMode {
        /// Against the system's root certificates.
        Verify = "verify",
        /// Against a pinned SHA-256 certificate fingerprint (BMCs ship self-signed certificates).
        Pinned = "pinned",
        /// Not at all; only when set explicitly for this BMC.
        Insecure = "insecure",
        /// No TLS: an `http://` BMC, whose password crosses the network in clear. Needed for (and
        /// only allowed with) an `http://` URL that has a password.
        InsecureHttp = "insecure-http",
    }
);

/// A network interface of a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// MAC address, unique across the whole inventory.
    pub mac: MacAddr,
    /// Reserved IPv4 address, unique across the inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = Ipv4)]
    pub ipv4: Option<Ipv4Addr>,
    /// The interface the machine network-boots from (at most one per machine).
    #[serde(default)]
    pub boot: bool,
    /// Optional label, e.g. `eno1` or `port 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A disk of a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    /// Serial number reported by the drive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// World-wide identifier (WWN/EUI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwid: Option<String>,
    /// Model string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Capacity in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// nvme, ssd or hdd.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub disk_type: Option<DiskType>,
    /// Stable bus path, e.g. `/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_path: Option<String>,
    /// A data disk: never chosen as the install disk.
    #[serde(default)]
    pub data_disk: bool,
}

/// A BMC as the operator writes it. The password is write-only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BmcSpec {
    /// Redfish service URL, e.g. `https://10.0.0.5` (the service root is found from it).
    pub url: String,
    /// Redfish user name.
    pub username: String,
    /// Password; write-only. Omitted on update: keep the stored one, unless the URL moves to
    /// another origin (scheme, host or port): then it is discarded. Empty: remove it.
    #[serde(default, skip_serializing)]
    pub password: Option<String>,
    /// TLS verification mode; `insecure-http` for an `http://` URL that has a password.
    #[serde(default = "default_tls")]
    pub tls: TlsMode,
    /// SHA-256 fingerprint of the BMC certificate, required when `tls` is `pinned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

fn default_tls() -> TlsMode {
    TlsMode::Verify
}

impl BmcSpec {
    /// Whether `tls` fits the URL's scheme, given whether a password goes to the BMC: a password
    /// for an `http://` URL needs `insecure-http` (said explicitly, since it crosses the network in
    /// clear), and `insecure-http` is for `http://` URLs only. The error is about `bmc.tls`.
    pub fn check_transport(&self, with_password: bool) -> Result<(), String> {
        let Ok(origin) = bmc_origin(&self.url) else {
            return Ok(()); // `bmc.url` itself is refused.
        };
        let plain = origin.starts_with("http://");
        match (plain, self.tls) {
            (true, TlsMode::InsecureHttp) => Ok(()),
            (true, _) if !with_password => Ok(()),
            (true, _) => Err(format!(
                "must be `insecure-http` for an http:// BMC URL with a password ({origin}): the \
                 password would cross the network in clear. Use https:// if the BMC offers it, or \
                 set bmc.tls = insecure-http to accept that"
            )),
            (false, TlsMode::InsecureHttp) => Err(format!(
                "`insecure-http` is only for http:// BMC URLs; {origin} takes verify, pinned or \
                 insecure"
            )),
            (false, _) => Ok(()),
        }
    }
}

/// The origin (RFC 6454 §4) of a BMC URL, `scheme://host:port`: the host as the URL parser
/// normalises it (lower case, IPv6 in brackets) and the port always spelled out. A stored BMC
/// password belongs to one origin: it is sealed for it, and dropped when the URL leaves it.
pub fn bmc_origin(url: &str) -> Result<String, String> {
    let u = url::Url::parse(url.trim()).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(format!("`{url}` must start with https:// or http://"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!(
            "`{url}` has no valid host (credentials belong in bmc.username/bmc.password)"
        ));
    }
    let host = u
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("`{url}` has no valid host"))?;
    let port = u
        .port_or_known_default()
        .ok_or_else(|| format!("`{url}` has no port"))?;
    Ok(format!("{}://{host}:{port}", u.scheme()))
}

impl fmt::Debug for BmcSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BmcSpec")
            .field("url", &self.url)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// A BMC as the inventory shows it: never the password, only whether one is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Bmc {
    /// Redfish service URL.
    pub url: String,
    /// Redfish user name.
    pub username: String,
    /// TLS verification mode.
    pub tls: TlsMode,
    /// Pinned certificate fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Whether a password is stored (encrypted).
    pub has_password: bool,
}

/// Everything an operator may write about a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MachineSpec {
    /// Host name (RFC 1123), unique, stored lower-case.
    #[serde(default)]
    pub hostname: Option<String>,
    /// SMBIOS system UUID, unique.
    #[serde(default)]
    #[schema(value_type = Option<String>, format = Uuid)]
    pub smbios_uuid: Option<Uuid>,
    /// System serial number, unique.
    #[serde(default)]
    pub serial: Option<String>,
    /// Asset tag, unique.
    #[serde(default)]
    pub asset_tag: Option<String>,
    /// Manufacturer, e.g. `Dell Inc.`.
    #[serde(default)]
    pub manufacturer: Option<String>,
    /// Model, e.g. `PowerEdge R650`.
    #[serde(default)]
    pub model: Option<String>,
    /// Site (data centre).
    #[serde(default)]
    pub site: Option<String>,
    /// Rack.
    #[serde(default)]
    pub rack: Option<String>,
    /// Rack unit (1..=60), the lowest unit the machine occupies.
    #[serde(default)]
    pub rack_unit: Option<u16>,
    /// Role in the cluster.
    #[serde(default)]
    pub role: Option<Role>,
    /// Cluster name.
    #[serde(default)]
    pub cluster: Option<String>,
    /// Hardware/provisioning profile name.
    #[serde(default)]
    pub profile: Option<String>,
    /// Network interfaces.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Disks.
    #[serde(default)]
    pub disks: Vec<Disk>,
    /// Baseboard management controller.
    #[serde(default)]
    pub bmc: Option<BmcSpec>,
}

/// A machine as the inventory holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Machine {
    /// Inventory id.
    pub id: MachineId,
    /// Host name.
    pub hostname: Option<String>,
    /// SMBIOS system UUID.
    #[schema(value_type = Option<String>, format = Uuid)]
    pub smbios_uuid: Option<Uuid>,
    /// Serial number.
    pub serial: Option<String>,
    /// Asset tag.
    pub asset_tag: Option<String>,
    /// Manufacturer.
    pub manufacturer: Option<String>,
    /// Model.
    pub model: Option<String>,
    /// Site.
    pub site: Option<String>,
    /// Rack.
    pub rack: Option<String>,
    /// Rack unit.
    pub rack_unit: Option<u16>,
    /// Role.
    pub role: Option<Role>,
    /// Cluster.
    pub cluster: Option<String>,
    /// Profile.
    pub profile: Option<String>,
    /// Lifecycle state.
    pub state: LifecycleState,
    /// Why the machine is in its state (set for `failed`).
    pub state_reason: Option<String>,
    /// Who set the current state (an event actor: `token:NAME`, or `plinth` for its own
    /// workflows); absent for states set before Plinth recorded it.
    pub state_by: Option<String>,
    /// A person set the current state (marked it failed, cancelled its reinstall): the cluster's
    /// automatic reinstall leaves the machine alone until its state changes again.
    pub manual_hold: bool,
    /// Network interfaces.
    pub interfaces: Vec<Interface>,
    /// Disks.
    pub disks: Vec<Disk>,
    /// BMC, without its password.
    pub bmc: Option<Bmc>,
    /// When the record was created.
    pub created_at: DateTime<Utc>,
    /// When the record last changed.
    pub updated_at: DateTime<Utc>,
    /// Optimistic-concurrency version; send it back as `If-Match` to edit.
    pub version: i64,
}

impl Machine {
    /// The operator-writable part of this machine (BMC password left out: kept unless replaced).
    pub fn spec(&self) -> MachineSpec {
        MachineSpec {
            hostname: self.hostname.clone(),
            smbios_uuid: self.smbios_uuid,
            serial: self.serial.clone(),
            asset_tag: self.asset_tag.clone(),
            manufacturer: self.manufacturer.clone(),
            model: self.model.clone(),
            site: self.site.clone(),
            rack: self.rack.clone(),
            rack_unit: self.rack_unit,
            role: self.role,
            cluster: self.cluster.clone(),
            profile: self.profile.clone(),
            interfaces: self.interfaces.clone(),
            disks: self.disks.clone(),
            bmc: self.bmc.as_ref().map(|b| BmcSpec {
                url: b.url.clone(),
                username: b.username.clone(),
                password: None,
                tls: b.tls,
                fingerprint: b.fingerprint.clone(),
            }),
        }
    }

    /// A short human name, as events and logs name machines: the host name, else the serial,
    /// else the boot (or first) MAC address, else the SMBIOS UUID, else the id.
    pub fn display_name(&self) -> String {
        let mac = self
            .interfaces
            .iter()
            .find(|i| i.boot)
            .or_else(|| self.interfaces.first())
            .map(|i| i.mac.to_string());
        self.hostname
            .clone()
            .or_else(|| self.serial.clone())
            .or(mac)
            .or_else(|| self.smbios_uuid.map(|u| u.to_string()))
            .unwrap_or_else(|| self.id.to_string())
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

/// The values of a machine that must be unique across the inventory, each with its field path.
pub fn unique_keys(spec: &MachineSpec) -> Vec<(String, UniqueKey)> {
    let mut out = Vec::new();
    if let Some(h) = &spec.hostname {
        out.push(("hostname".to_string(), UniqueKey::Hostname(h.clone())));
    }
    if let Some(u) = spec.smbios_uuid {
        out.push(("smbios_uuid".to_string(), UniqueKey::SmbiosUuid(u)));
    }
    if let Some(s) = &spec.serial {
        out.push(("serial".to_string(), UniqueKey::Serial(s.clone())));
    }
    if let Some(a) = &spec.asset_tag {
        out.push(("asset_tag".to_string(), UniqueKey::AssetTag(a.clone())));
    }
    for (i, nic) in spec.interfaces.iter().enumerate() {
        out.push((format!("interfaces[{i}].mac"), UniqueKey::Mac(nic.mac)));
        if let Some(ip) = nic.ipv4 {
            out.push((format!("interfaces[{i}].ipv4"), UniqueKey::Ipv4(ip)));
        }
    }
    out
}

/// A value that at most one machine may have.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UniqueKey {
    /// Host name.
    Hostname(String),
    /// SMBIOS UUID.
    SmbiosUuid(Uuid),
    /// Serial number.
    Serial(String),
    /// Asset tag.
    AssetTag(String),
    /// NIC MAC address.
    Mac(MacAddr),
    /// Reserved IPv4 address.
    Ipv4(Ipv4Addr),
}

impl fmt::Display for UniqueKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UniqueKey::Hostname(v) => write!(f, "hostname {v}"),
            UniqueKey::SmbiosUuid(v) => write!(f, "SMBIOS UUID {v}"),
            UniqueKey::Serial(v) => write!(f, "serial {v}"),
            UniqueKey::AssetTag(v) => write!(f, "asset tag {v}"),
            UniqueKey::Mac(v) => write!(f, "MAC {v}"),
            UniqueKey::Ipv4(v) => write!(f, "IPv4 {v}"),
        }
    }
}

/// Longest free-text field we accept.
const MAX_TEXT: usize = 255;

fn clean_text(errs: &mut ValidationErrors, field: &str, v: &mut Option<String>) {
    if let Some(s) = v.take() {
        let t = s.trim();
        if t.is_empty() {
            return;
        }
        if t.chars().count() > MAX_TEXT {
            errs.push(field, format!("longer than {MAX_TEXT} characters"));
        } else if t.chars().any(char::is_control) {
            errs.push(field, "contains control characters");
        }
        *v = Some(t.to_string());
    }
}

/// RFC 1123 host name (labels of letters, digits and hyphens, dots between), lower-cased.
pub fn check_hostname(h: &str) -> Result<String, String> {
    let h = h.trim().trim_end_matches('.').to_ascii_lowercase();
    if h.is_empty() || h.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    for label in h.split('.') {
        let ok_chars = label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if label.is_empty()
            || label.len() > 63
            || !ok_chars
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return Err(format!(
                "`{h}` is not an RFC 1123 host name: labels of 1-63 letters, digits and inner hyphens, separated by dots"
            ));
        }
    }
    Ok(h)
}

impl MachineSpec {
    /// What the machine table's free-text search matches, lower-cased, one field a line: host
    /// name, serial, asset tag, manufacturer, model, site, rack, cluster, then every NIC's MAC and
    /// IPv4 in order. Stored beside the machine (`machines.search_text`) so a search reads one
    /// column; keep in step with migration 0021's backfill.
    pub fn search_text(&self) -> String {
        let mut lines: Vec<String> = [
            &self.hostname,
            &self.serial,
            &self.asset_tag,
            &self.manufacturer,
            &self.model,
            &self.site,
            &self.rack,
            &self.cluster,
        ]
        .iter()
        .map(|v| v.as_deref().unwrap_or("").to_lowercase())
        .collect();
        for i in &self.interfaces {
            lines.push(i.mac.to_string());
            lines.push(i.ipv4.map(|ip| ip.to_string()).unwrap_or_default());
        }
        lines.join("\n")
    }

    /// Check and normalise a spec: trims text, lower-cases host names, checks every field and the
    /// rules between them (one boot NIC, no MAC or IP twice, pinned TLS has a fingerprint).
    pub fn validate(mut self) -> Result<MachineSpec, ValidationErrors> {
        let mut errs = ValidationErrors::default();
        if let Some(h) = self.hostname.take() {
            if !h.trim().is_empty() {
                match check_hostname(&h) {
                    Ok(h) => self.hostname = Some(h),
                    Err(e) => errs.push("hostname", e),
                }
            }
        }
        clean_text(&mut errs, "serial", &mut self.serial);
        clean_text(&mut errs, "asset_tag", &mut self.asset_tag);
        clean_text(&mut errs, "manufacturer", &mut self.manufacturer);
        clean_text(&mut errs, "model", &mut self.model);
        clean_text(&mut errs, "site", &mut self.site);
        clean_text(&mut errs, "rack", &mut self.rack);
        clean_text(&mut errs, "cluster", &mut self.cluster);
        clean_text(&mut errs, "profile", &mut self.profile);
        if let Some(u) = self.rack_unit {
            if !(1..=60).contains(&u) {
                errs.push("rack_unit", format!("{u} is outside 1..=60"));
            }
        }
        let mut macs = HashSet::new();
        let mut ips = HashSet::new();
        let mut boots = 0;
        for (i, nic) in self.interfaces.iter_mut().enumerate() {
            if !macs.insert(nic.mac) {
                errs.push(
                    format!("interfaces[{i}].mac"),
                    format!("{} is listed twice", nic.mac),
                );
            }
            if nic.mac.0[0] & 1 == 1 || nic.mac.0 == [0; 6] {
                errs.push(
                    format!("interfaces[{i}].mac"),
                    format!("{} is a multicast or all-zero address, not a NIC", nic.mac),
                );
            }
            if let Some(ip) = nic.ipv4 {
                if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback()
                {
                    errs.push(
                        format!("interfaces[{i}].ipv4"),
                        format!("{ip} cannot be reserved for a host"),
                    );
                }
                if !ips.insert(ip) {
                    errs.push(
                        format!("interfaces[{i}].ipv4"),
                        format!("{ip} is listed twice"),
                    );
                }
            }
            if nic.boot {
                boots += 1;
                if boots > 1 {
                    errs.push(
                        format!("interfaces[{i}].boot"),
                        "only one interface can be the boot interface",
                    );
                }
            }
            clean_text(&mut errs, &format!("interfaces[{i}].name"), &mut nic.name);
        }
        if boots == 0 && self.interfaces.len() == 1 {
            // A single NIC is the boot NIC: nothing else could be.
            if let Some(n) = self.interfaces.first_mut() {
                n.boot = true;
            }
        }
        for (i, d) in self.disks.iter_mut().enumerate() {
            clean_text(&mut errs, &format!("disks[{i}].serial"), &mut d.serial);
            clean_text(&mut errs, &format!("disks[{i}].wwid"), &mut d.wwid);
            clean_text(&mut errs, &format!("disks[{i}].model"), &mut d.model);
            clean_text(&mut errs, &format!("disks[{i}].bus_path"), &mut d.bus_path);
            if d.size_bytes == Some(0) {
                errs.push(format!("disks[{i}].size_bytes"), "must be greater than 0");
            }
            if d.size_bytes.is_some_and(|s| s > i64::MAX as u64) {
                errs.push(format!("disks[{i}].size_bytes"), "too large");
            }
        }
        if let Some(b) = &mut self.bmc {
            b.url = b.url.trim().to_string();
            if let Err(e) = bmc_origin(&b.url) {
                errs.push("bmc.url", e);
            }
            b.username = b.username.trim().to_string();
            if b.username.is_empty() {
                errs.push("bmc.username", "must not be empty");
            }
            if b.password.as_ref().is_some_and(|p| p.len() > 1024) {
                errs.push("bmc.password", "longer than 1024 bytes");
            }
            match (b.tls, &mut b.fingerprint) {
                (TlsMode::Pinned, None) => errs.push(
                    "bmc.fingerprint",
                    "required when bmc.tls is `pinned`: the SHA-256 of the BMC certificate, 64 hex digits",
                ),
                (TlsMode::Pinned, Some(fp)) => match normalise_fingerprint(fp) {
                    Ok(n) => *fp = n,
                    Err(e) => errs.push("bmc.fingerprint", e),
                },
                (_, Some(_)) => errs.push("bmc.fingerprint", "only allowed when bmc.tls is `pinned`"),
                (_, None) => {}
            }
            let with_password = b.password.as_deref().is_some_and(|p| !p.is_empty());
            if let Err(e) = b.check_transport(with_password) {
                errs.push("bmc.tls", e);
            }
        }
        if self.hostname.is_none()
            && self.interfaces.is_empty()
            && self.serial.is_none()
            && self.asset_tag.is_none()
            && self.smbios_uuid.is_none()
            && self.bmc.is_none()
        {
            // Nothing could ever name or match it: not a booting NIC, not a person, not a BMC
            // to inspect.
            errs.push(
                "hostname",
                "a machine needs at least one identifier: hostname, interfaces[].mac, serial, \
                 asset_tag, smbios_uuid or a bmc to inspect",
            );
        }
        errs.into_result().map(|()| self)
    }
}

/// Lower-case hex without separators, 64 digits.
pub fn normalise_fingerprint(fp: &str) -> Result<String, String> {
    let s = fp.trim();
    let s = s
        .strip_prefix("sha256:")
        .or_else(|| s.strip_prefix("SHA256:"))
        .unwrap_or(s);
    let hex: String = s
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("must be a SHA-256 fingerprint: 64 hex digits, colons allowed".into());
    }
    Ok(hex)
}

/// Changed top-level fields between two specs, as `{field: {"before": .., "after": ..}}`.
/// A BMC password never appears: a changed password shows as `"bmc.password": "changed"`.
pub fn spec_diff(before: Option<&MachineSpec>, after: Option<&MachineSpec>) -> serde_json::Value {
    let to_map = |s: Option<&MachineSpec>| -> BTreeMap<String, serde_json::Value> {
        match s.map(serde_json::to_value) {
            Some(Ok(serde_json::Value::Object(m))) => m.into_iter().collect(),
            _ => BTreeMap::new(),
        }
    };
    let (b, a) = (to_map(before), to_map(after));
    let mut out = serde_json::Map::new();
    let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    for k in keys {
        let (bv, av) = (b.get(k), a.get(k));
        let null = serde_json::Value::Null;
        let (bv, av) = (bv.unwrap_or(&null), av.unwrap_or(&null));
        let empty = |v: &serde_json::Value| v.is_null() || v.as_array().is_some_and(Vec::is_empty);
        if bv != av && !(empty(bv) && empty(av)) {
            out.insert(k.clone(), serde_json::json!({"before": bv, "after": av}));
        }
    }
    let pw_changed = after
        .and_then(|a| a.bmc.as_ref())
        .is_some_and(|b| b.password.is_some());
    if pw_changed {
        out.insert("bmc.password".into(), serde_json::json!("changed"));
    }
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(mac: &str) -> Interface {
        Interface {
            mac: mac.parse().expect("mac"),
            ipv4: None,
            boot: false,
            name: None,
        }
    }

    #[test]
    fn hostname_rules() {
        assert_eq!(
            check_hostname("Node-01.Example.com.").as_deref(),
            Ok("node-01.example.com")
        );
        for bad in ["", "-a", "a-", "a..b", "a_b", &"x".repeat(64)] {
            assert!(check_hostname(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn validate_normalises_and_names_fields() {
        let spec = MachineSpec {
            hostname: Some(" N1 ".into()),
            serial: Some("  ".into()),
            interfaces: vec![nic("52:54:00:00:00:01")],
            ..Default::default()
        };
        let v = spec.validate().expect("valid");
        assert_eq!(v.hostname.as_deref(), Some("n1"));
        assert_eq!(v.serial, None);
        assert!(v.interfaces[0].boot, "single NIC becomes the boot NIC");

        let bad = MachineSpec {
            hostname: Some("bad_name".into()),
            rack_unit: Some(0),
            interfaces: vec![
                nic("52:54:00:00:00:01"),
                nic("52:54:00:00:00:01"),
                nic("01:00:5e:00:00:01"),
            ],
            bmc: Some(BmcSpec {
                url: "ftp://x".into(),
                username: "".into(),
                password: None,
                tls: TlsMode::Pinned,
                fingerprint: None,
            }),
            ..Default::default()
        };
        let errs = bad.validate().expect_err("invalid");
        let fields: Vec<&str> = errs.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "hostname",
                "rack_unit",
                "interfaces[1].mac",
                "interfaces[2].mac",
                "bmc.url",
                "bmc.username",
                "bmc.fingerprint"
            ]
        );
    }

    #[test]
    fn bmc_origins() {
        let o = |u: &str| bmc_origin(u);
        assert_eq!(o("https://10.0.0.5").as_deref(), Ok("https://10.0.0.5:443"));
        assert_eq!(
            o(" https://10.0.0.5:443/redfish/v1 ").as_deref(),
            Ok("https://10.0.0.5:443")
        );
        assert_eq!(
            o("HTTP://BMC.Example:8000/x?y#z").as_deref(),
            Ok("http://bmc.example:8000")
        );
        assert_eq!(o("http://[fe80::1]").as_deref(), Ok("http://[fe80::1]:80"));
        assert_ne!(o("https://10.0.0.5"), o("http://10.0.0.5"));
        assert_ne!(o("https://10.0.0.5"), o("https://10.0.0.5:8443"));
        for bad in [
            "ftp://x",
            "10.0.0.5",
            "https://",
            "https://u:p@host",
            "http://a b",
        ] {
            assert!(o(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_password_over_plain_http_needs_insecure_http() {
        let b = |url: &str, tls: TlsMode| BmcSpec {
            url: url.into(),
            username: "root".into(),
            password: None,
            tls,
            fingerprint: None,
        };
        assert!(b("http://10.0.0.5", TlsMode::Verify)
            .check_transport(false)
            .is_ok());
        let e = b("http://10.0.0.5", TlsMode::Verify)
            .check_transport(true)
            .expect_err("refused");
        assert!(e.contains("insecure-http"), "{e}");
        assert!(b("http://10.0.0.5", TlsMode::Insecure)
            .check_transport(true)
            .is_err());
        assert!(b("http://10.0.0.5", TlsMode::InsecureHttp)
            .check_transport(true)
            .is_ok());
        assert!(b("https://10.0.0.5", TlsMode::InsecureHttp)
            .check_transport(false)
            .is_err());
        assert!(b("https://10.0.0.5", TlsMode::Verify)
            .check_transport(true)
            .is_ok());

        let spec = MachineSpec {
            bmc: Some(BmcSpec {
                password: Some("pw".into()),
                ..b("http://10.0.0.5", TlsMode::Verify)
            }),
            ..Default::default()
        };
        let errs = spec.validate().expect_err("refused");
        assert_eq!(errs.0.len(), 1);
        assert_eq!(errs.0[0].field, "bmc.tls");
    }

    #[test]
    fn a_machine_without_any_identifier_is_refused() {
        let errs = MachineSpec {
            rack: Some("r1".into()),
            ..Default::default()
        }
        .validate()
        .expect_err("refused");
        assert_eq!(errs.0.len(), 1);
        assert!(errs.0[0].message.contains("interfaces[].mac"), "{errs:?}");
        for one in [
            MachineSpec {
                serial: Some("S1".into()),
                ..Default::default()
            },
            MachineSpec {
                hostname: Some("a".into()),
                ..Default::default()
            },
        ] {
            assert!(one.validate().is_ok());
        }
    }

    #[test]
    fn diff_hides_password() {
        let a = MachineSpec {
            hostname: Some("a".into()),
            ..Default::default()
        };
        let mut b = a.clone();
        b.rack = Some("r1".into());
        b.bmc = Some(BmcSpec {
            url: "https://bmc".into(),
            username: "root".into(),
            password: Some("hunter2".into()),
            tls: TlsMode::Insecure,
            fingerprint: None,
        });
        let d = spec_diff(Some(&a), Some(&b));
        let text = d.to_string();
        assert!(!text.contains("hunter2"));
        assert_eq!(d["rack"]["after"], "r1");
        assert_eq!(d["bmc.password"], "changed");
        assert!(d.get("hostname").is_none());
    }

    #[test]
    fn enums_parse() {
        assert_eq!("Control-Plane".parse::<Role>(), Ok(Role::ControlPlane));
        assert!("master"
            .parse::<Role>()
            .unwrap_err()
            .contains("control-plane, worker"));
    }
}
