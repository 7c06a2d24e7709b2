//! Stable install-disk selection: the rule that must never pick the wrong disk.
//!
//! A profile's [`DiskRules`] (type, size bounds in Talos' units, model/serial/bus-path globs, an
//! optional tie-breaking preference) are evaluated against a machine's known disks. Exactly one
//! disk must match; zero or several matches, or a match on a disk marked as a data disk, is an
//! error listing the disks. The chosen disk is pinned by serial or WWID ([`DiskPin`]), never by a
//! kernel name such as `/dev/sda`: kernel names change between boots, and Talos picks the first
//! match in kernel-name order. Without disk facts the rules are translated into Talos' own
//! selector ([`InstallSelector`]): `machine.install.diskSelector` up to Talos 1.13, a CEL
//! expression for the `UnattendedInstallConfig` document from 1.14, with a warning that
//! uniqueness could not be checked.
//!
//! Size conditions parse as Talos parses `diskSelector.size` (an operator, then a number and a
//! go-humanize unit: `GB` = 10^9, `GiB` = 2^30, ...); globs match as Talos' `glob()` does (`*`
//! only, case-sensitive). Pure logic: imports `crate::domain` and `crate::talos` only.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_yaml_ng::{Mapping, Value};

use super::TalosVersion;
use crate::domain::{Disk, DiskType};

/// Why no install disk could be chosen or described.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiskError {
    /// A size condition does not parse.
    #[error("disk rule `size: {text}`: {reason}")]
    BadSize {
        /// The condition as written.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No disk matches.
    #[error("no disk matches the install-disk rules; disks: {}", list(.disks))]
    NoMatch {
        /// Every known disk, with the rule it fails.
        disks: Vec<DiskReport>,
    },
    /// Several disks match and nothing breaks the tie.
    #[error("{} disks match the install-disk rules, exactly one must{}; candidates: {}", .candidates.len(), tie_note(.tie), list(.candidates))]
    Ambiguous {
        /// The matching disks.
        candidates: Vec<DiskReport>,
        /// The preference that was tried, if any.
        tie: Option<Preference>,
    },
    /// The rules match a disk marked as a data disk.
    #[error("the install-disk rules match data disk(s) {}; tighten the rules; candidates: {}", list(.data), list(.candidates))]
    DataDiskMatched {
        /// The matching data disks.
        data: Vec<DiskReport>,
        /// All matching disks.
        candidates: Vec<DiskReport>,
    },
    /// The chosen disk cannot be pinned by a stable identifier.
    #[error("disk {disk} matches, but cannot be pinned: {reason}")]
    Unpinnable {
        /// The chosen disk.
        disk: DiskReport,
        /// Why neither serial nor WWID will do.
        reason: String,
    },
    /// The rules cannot be expressed as a Talos selector.
    #[error("install-disk rules cannot be given to Talos {version} without disk facts: {reason}")]
    Untranslatable {
        /// Target Talos version.
        version: TalosVersion,
        /// Why.
        reason: String,
    },
}

impl DiskError {
    /// The rule of `installDisk` at fault, as the inventory spells it (`size`), when the error is
    /// about one rule rather than the machine's disks.
    pub fn rule(&self) -> Option<&'static str> {
        match self {
            DiskError::BadSize { .. } => Some("size"),
            DiskError::Untranslatable { reason, .. } if reason.contains("diskSelector.size") => {
                Some("size")
            }
            _ => None,
        }
    }
}

fn list(disks: &[DiskReport]) -> String {
    if disks.is_empty() {
        return "(none known)".into();
    }
    disks
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn tie_note(tie: &Option<Preference>) -> String {
    match tie {
        Some(p) => format!(" (preference `{}` did not break the tie)", p.as_str()),
        None => String::new(),
    }
}

/// One disk of a machine, as an error shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskReport {
    /// Position in the machine's disk list.
    pub index: usize,
    /// Serial, WWID, model, size and type, as known.
    pub summary: String,
    /// For a disk that does not match: the first rule it fails.
    pub reason: Option<String>,
}

impl fmt::Display for DiskReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "disks[{}] {}", self.index, self.summary)?;
        if let Some(r) = &self.reason {
            write!(f, " ({r})")?;
        }
        Ok(())
    }
}

fn report(index: usize, d: &Disk, reason: Option<String>) -> DiskReport {
    let mut parts = Vec::new();
    if let Some(s) = &d.serial {
        parts.push(format!("serial={s}"));
    }
    if let Some(w) = &d.wwid {
        parts.push(format!("wwid={w}"));
    }
    if let Some(m) = &d.model {
        parts.push(format!("model={m:?}"));
    }
    if let Some(s) = d.size_bytes {
        parts.push(format!("size={s}"));
    }
    if let Some(t) = d.disk_type {
        parts.push(format!("type={t}"));
    }
    if let Some(b) = &d.bus_path {
        parts.push(format!("busPath={b}"));
    }
    if d.data_disk {
        parts.push("data".into());
    }
    if parts.is_empty() {
        parts.push("(no facts)".into());
    }
    DiskReport {
        index,
        summary: parts.join(" "),
        reason,
    }
}

/// Which matching disk wins when several match, if the profile says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preference {
    /// The smallest matching disk.
    Smallest,
    /// The largest matching disk.
    Largest,
}

impl Preference {
    /// The spelling in profiles.
    pub fn as_str(&self) -> &'static str {
        match self {
            Preference::Smallest => "smallest",
            Preference::Largest => "largest",
        }
    }
}

/// Comparison of a size condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeOp {
    /// `==` (also no operator).
    Eq,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
}

impl SizeOp {
    fn symbol(&self) -> &'static str {
        match self {
            SizeOp::Eq => "==",
            SizeOp::Gt => ">",
            SizeOp::Ge => ">=",
            SizeOp::Lt => "<",
            SizeOp::Le => "<=",
        }
    }
}

/// A size condition, `>= 400GB`, as Talos' `diskSelector.size` takes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SizeBound {
    /// The comparison.
    pub op: SizeOp,
    /// The size in bytes.
    pub bytes: u64,
    text: String,
}

impl SizeBound {
    /// Whether a disk of `size` bytes satisfies the condition.
    pub fn matches(&self, size: u64) -> bool {
        match self.op {
            SizeOp::Eq => size == self.bytes,
            SizeOp::Gt => size > self.bytes,
            SizeOp::Ge => size >= self.bytes,
            SizeOp::Lt => size < self.bytes,
            SizeOp::Le => size <= self.bytes,
        }
    }

    /// The condition as written (trimmed), which Talos parses the same way.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for SizeBound {
    type Err = DiskError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim().to_string();
        let bad = |reason: String| DiskError::BadSize {
            text: text.clone(),
            reason,
        };
        let (op, rest) = [
            (">=", SizeOp::Ge),
            ("<=", SizeOp::Le),
            ("==", SizeOp::Eq),
            (">", SizeOp::Gt),
            ("<", SizeOp::Lt),
        ]
        .iter()
        .find_map(|(p, op)| text.strip_prefix(p).map(|r| (*op, r)))
        .unwrap_or((SizeOp::Eq, text.as_str()));
        let bytes = parse_size(rest.trim()).map_err(bad)?;
        Ok(SizeBound { op, bytes, text })
    }
}

impl TryFrom<String> for SizeBound {
    type Error = DiskError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<SizeBound> for String {
    fn from(b: SizeBound) -> String {
        b.text
    }
}

impl fmt::Display for SizeBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Parse a size the way Talos does (go-humanize `ParseBytes`): a decimal number, optional
/// spaces, then a case-insensitive unit: none or `b` (bytes), `k`/`kb` (10^3), `ki`/`kib`
/// (2^10), and likewise `m`, `g`, `t`, `p`, `e`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let digits = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` does not start with a number"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "ki" | "kib" => 1 << 10,
        "m" | "mb" => 1000_u64.pow(2),
        "mi" | "mib" => 1 << 20,
        "g" | "gb" => 1000_u64.pow(3),
        "gi" | "gib" => 1 << 30,
        "t" | "tb" => 1000_u64.pow(4),
        "ti" | "tib" => 1 << 40,
        "p" | "pb" => 1000_u64.pow(5),
        "pi" | "pib" => 1 << 50,
        "e" | "eb" => 1000_u64.pow(6),
        "ei" | "eib" => 1 << 60,
        other => {
            return Err(format!(
            "unknown unit `{other}`: use B, kB, MB, GB, TB, PB, EB or KiB, MiB, GiB, TiB, PiB, EiB"
        ))
        }
    };
    let v = n * mult as f64;
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err(format!("`{s}` is too large"));
    }
    // Truncation toward zero, as Go's uint64(float64) conversion does.
    Ok(v as u64)
}

/// Match `subject` against a glob where only `*` is special (any run of characters), as Talos'
/// `glob()` (github.com/ryanuber/go-glob) matches: case-sensitive, no `?` or `[...]`.
pub fn glob_match(pattern: &str, subject: &str) -> bool {
    if !pattern.contains('*') {
        return pattern == subject;
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = match parts.split_first() {
        Some(x) => x,
        None => return true,
    };
    let Some(mut tail) = subject.strip_prefix(first) else {
        return false;
    };
    let (last, middle) = match rest.split_last() {
        Some(x) => x,
        None => return true,
    };
    for part in middle {
        match tail.find(part) {
            Some(i) => tail = &tail[i + part.len()..],
            None => return false,
        }
    }
    tail.ends_with(last)
}

/// Install-disk rules of a profile. Every rule given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiskRules {
    /// Disk type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub disk_type: Option<DiskType>,
    /// Size conditions such as `>= 400GB` and `<= 2TB`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub size: Vec<SizeBound>,
    /// Model glob, e.g. `SAMSUNG MZ*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Serial glob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Bus-path glob, e.g. `/pci0000:00/0000:00:1f.2/*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_path: Option<String>,
    /// Tie-breaker among several matches; without it several matches are an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<Preference>,
}

impl DiskRules {
    /// Whether no rule is given at all.
    pub fn is_empty(&self) -> bool {
        self.disk_type.is_none()
            && self.size.is_empty()
            && self.model.is_none()
            && self.serial.is_none()
            && self.bus_path.is_none()
    }

    /// Check one disk; `Err` names the first rule it fails.
    pub fn check(&self, d: &Disk) -> Result<(), String> {
        if let Some(t) = self.disk_type {
            match d.disk_type {
                Some(dt) if dt == t => {}
                Some(dt) => return Err(format!("type {dt}, not {t}")),
                None => return Err(format!("type unknown, rule wants {t}")),
            }
        }
        for b in &self.size {
            match d.size_bytes {
                Some(s) if b.matches(s) => {}
                Some(s) => return Err(format!("size {s} fails `{b}`")),
                None => return Err(format!("size unknown, rule wants `{b}`")),
            }
        }
        let globs = [
            ("model", &self.model, &d.model),
            ("serial", &self.serial, &d.serial),
            ("busPath", &self.bus_path, &d.bus_path),
        ];
        for (name, pattern, value) in globs {
            if let Some(p) = pattern {
                let v = value.as_deref().unwrap_or("");
                if !glob_match(p, v) {
                    return Err(format!("{name} {v:?} does not match `{p}`"));
                }
            }
        }
        Ok(())
    }
}

/// How the chosen disk is named in the rendered config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskPin {
    /// By the serial number the drive reports.
    Serial(String),
    /// By the world-wide identifier.
    Wwid(String),
}

impl DiskPin {
    /// `machine.install.diskSelector` for Talos up to 1.13.
    pub fn disk_selector(&self) -> Mapping {
        let mut m = Mapping::new();
        match self {
            DiskPin::Serial(s) => m.insert("serial".into(), Value::String(s.clone())),
            DiskPin::Wwid(w) => m.insert("wwid".into(), Value::String(w.clone())),
        };
        m
    }

    /// CEL disk expression for Talos 1.14 and later.
    pub fn cel(&self) -> String {
        let (field, v) = match self {
            DiskPin::Serial(s) => ("serial", s),
            DiskPin::Wwid(w) => ("wwid", w),
        };
        let mut terms = vec![format!("disk.{field} == {}", cel_string(v))];
        terms.extend(BASE_CEL_TERMS.iter().map(|t| (*t).to_string()));
        terms.join(" && ")
    }
}

impl fmt::Display for DiskPin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskPin::Serial(s) => write!(f, "serial {s}"),
            DiskPin::Wwid(w) => write!(f, "WWID {w}"),
        }
    }
}

/// Terms added to every translated selector: a real transport (not a device-mapper device), not
/// USB (BMC virtual media such as AMI's "Virtual HDisk Device", sticks), writable, not a CD-ROM.
const BASE_CEL_TERMS: &[&str] = &[
    "disk.transport != \"\"",
    "disk.transport != \"usb\"",
    "!disk.readonly",
    "!disk.cdrom",
];

/// The disk chosen from a machine's known disks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskChoice {
    /// Position in the machine's disk list.
    pub index: usize,
    /// The disk.
    pub disk: Disk,
    /// How it is pinned.
    pub pin: DiskPin,
    /// Whether the profile's preference had to break a tie.
    pub tie_broken: bool,
}

/// Model names BMCs give the virtual media they expose to the host (lower case): AMI MegaRAC
/// shows a "Virtual Cdrom Device" of 2048 bytes and a 1 GB "Virtual HDisk Device"; others show
/// virtual CD/DVD, floppy and USB keys. (A RAID controller's "Virtual Disk" is a real volume and
/// is not in this list.)
const VIRTUAL_MEDIA_MODELS: &[&str] = &[
    "virtual cdrom",
    "virtual cd",
    "virtual dvd",
    "virtual hdisk",
    "virtual floppy",
    "virtual media",
    "virtual_media",
    "virtual usb",
    "virtual keyboard",
    "virtual disk0",
];

/// The smallest device that can hold Talos' partitions (EFI, BIOS, BOOT, META, STATE and a
/// usable EPHEMERAL); anything smaller is a stick, an optical drive or virtual media.
pub const MIN_INSTALL_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// Why a device is not a disk Talos may be installed on, if it is not: BMC virtual media,
/// optical (CD/DVD-ROM, read-only), removable USB, or too small to hold Talos. Such devices are
/// never chosen, whatever the rules or `prefer:` say.
pub fn not_a_disk(d: &Disk) -> Option<String> {
    let model = d.model.as_deref().unwrap_or("").to_ascii_lowercase();
    if let Some(m) = VIRTUAL_MEDIA_MODELS.iter().find(|m| model.contains(**m)) {
        return Some(format!(
            "not a disk: BMC virtual media (model contains {m:?})"
        ));
    }
    if [
        "cd-rom", "cdrom", "cddvd", "dvd-rom", "dvdrom", "dvd-ram", "dvdrw", "optical",
    ]
    .iter()
    .any(|m| model.contains(m))
    {
        return Some("not a disk: an optical (read-only) drive".into());
    }
    if let Some(b) = d.bus_path.as_deref() {
        if b.contains("/usb") {
            return Some(format!("not a disk: a removable USB device (busPath {b})"));
        }
    }
    match d.size_bytes {
        Some(size) if size < MIN_INSTALL_BYTES => Some(format!(
            "not a disk: {size} bytes cannot hold Talos (at least {MIN_INSTALL_BYTES})"
        )),
        _ => None,
    }
}

/// Choose the install disk among a machine's known disks: exactly one match (after the
/// preference, when given, breaks a tie on size), never a data disk, never a device that is not
/// a disk ([`not_a_disk`]), pinned by serial or WWID.
pub fn select_install_disk(rules: &DiskRules, disks: &[Disk]) -> Result<DiskChoice, DiskError> {
    let mut matched = Vec::new();
    let mut rejected = Vec::new();
    for (i, d) in disks.iter().enumerate() {
        if let Some(why) = not_a_disk(d) {
            rejected.push(report(i, d, Some(why)));
            continue;
        }
        match rules.check(d) {
            Ok(()) => matched.push(i),
            Err(why) => rejected.push(report(i, d, Some(why))),
        }
    }
    let candidates = || -> Vec<DiskReport> {
        matched
            .iter()
            .map(|&i| report(i, &disks[i], None))
            .collect()
    };
    let data: Vec<DiskReport> = matched
        .iter()
        .filter(|&&i| disks[i].data_disk)
        .map(|&i| report(i, &disks[i], None))
        .collect();
    if !data.is_empty() {
        return Err(DiskError::DataDiskMatched {
            data,
            candidates: candidates(),
        });
    }
    let (index, tie_broken) = match matched.as_slice() {
        [] => return Err(DiskError::NoMatch { disks: rejected }),
        [only] => (*only, false),
        _ => match rules.prefer.and_then(|p| break_tie(p, &matched, disks)) {
            Some(i) => (i, true),
            None => {
                return Err(DiskError::Ambiguous {
                    candidates: candidates(),
                    tie: rules.prefer,
                })
            }
        },
    };
    let pin = pin_disk(index, disks, rules)?;
    Ok(DiskChoice {
        index,
        disk: disks[index].clone(),
        pin,
        tie_broken,
    })
}

/// The strictly smallest (largest) disk among the matches; `None` when a size is unknown or the
/// extreme size is shared.
fn break_tie(p: Preference, matched: &[usize], disks: &[Disk]) -> Option<usize> {
    let mut sized: Vec<(u64, usize)> = Vec::with_capacity(matched.len());
    for &i in matched {
        sized.push((disks[i].size_bytes?, i));
    }
    sized.sort_unstable();
    if p == Preference::Largest {
        sized.reverse();
    }
    match sized.as_slice() {
        [(a, i), (b, _), ..] if a != b => Some(*i),
        [(_, i)] => Some(*i),
        _ => None,
    }
}

/// Pin by serial when it is known, glob-free and unique on the machine, else by WWID likewise.
/// Serial comes first: BMCs and the kernel report the same serial string, while WWID prefixes
/// (`naa.`, `eui.`, `0x`) differ between sources.
fn pin_disk(index: usize, disks: &[Disk], rules: &DiskRules) -> Result<DiskPin, DiskError> {
    let d = &disks[index];
    let usable = |v: &Option<String>, field: fn(&Disk) -> &Option<String>| -> Option<String> {
        let v = v.as_deref()?.trim();
        if v.is_empty() || v.contains('*') {
            return None;
        }
        let shared = disks
            .iter()
            .enumerate()
            .any(|(j, o)| j != index && field(o).as_deref().map(str::trim) == Some(v));
        (!shared).then(|| v.to_string())
    };
    if let Some(s) = usable(&d.serial, |o| &o.serial) {
        return Ok(DiskPin::Serial(s));
    }
    if let Some(w) = usable(&d.wwid, |o| &o.wwid) {
        return Ok(DiskPin::Wwid(w));
    }
    Err(DiskError::Unpinnable {
        disk: report(index, d, None),
        reason: unpinnable_reason(index, disks, rules),
    })
}

/// Why a disk cannot be pinned, and which rule is still safe. When no real disk of the machine
/// reports a serial or WWID, the disks are indistinguishable to Talos by identity: pinning is
/// impossible, and only a rule that keeps matching exactly this disk whatever the kernel names
/// it is safe: its bus path (stable across boots), else a size bound no other disk meets.
fn unpinnable_reason(index: usize, disks: &[Disk], rules: &DiskRules) -> String {
    let d = &disks[index];
    let has_id = |o: &Disk| {
        o.serial.as_deref().is_some_and(|s| !s.trim().is_empty())
            || o.wwid.as_deref().is_some_and(|s| !s.trim().is_empty())
    };
    let real: Vec<&Disk> = disks.iter().filter(|o| not_a_disk(o).is_none()).collect();
    let base = if real.iter().all(|o| !has_id(o)) {
        "no disk of this machine reports a serial or WWID, so the disks are indistinguishable by identity and pinning is impossible".to_string()
    } else {
        "its serial and WWID are unknown, contain `*`, or are shared with another disk of the machine".to_string()
    };
    // Other devices Talos itself would see, virtual media included.
    let others = |f: &dyn Fn(&Disk) -> bool| {
        disks
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != index)
            .any(|(_, o)| f(o))
    };
    let safe = match (&d.bus_path, d.size_bytes) {
        (Some(b), _) if !others(&|o: &Disk| o.bus_path.as_deref() == Some(b.as_str())) => {
            format!("a rule that is still safe: `busPath: {b}` (stable across boots; only this disk is on it)")
        }
        (_, Some(size)) if !others(&|o: &Disk| o.size_bytes.is_none_or(|s| s >= size)) => {
            format!("a rule that is still safe: `size: \">= {size}\"`, as only this device is that large (not `prefer: smallest`: the BMC's virtual media are smaller still)")
        }
        _ if rules.bus_path.is_some() => "the rule's busPath selects it; record its bus path in the inventory so Plinth can check it is unique".into(),
        _ => "no rule is safe without a serial, WWID or bus path: record the disk's bus path (`talosctl get disks`) in the inventory and select it by `busPath`".into(),
    };
    format!("{base}; {safe}")
}

/// The install-disk selector as the target Talos version takes it.
#[derive(Clone, Debug, PartialEq)]
pub enum InstallSelector {
    /// `machine.install.diskSelector` (Talos up to 1.13).
    DiskSelector(Mapping),
    /// `UnattendedInstallConfig.provisioning.diskSelector.match` (Talos 1.14 and later).
    Cel(String),
}

/// The install disk decided for a machine.
#[derive(Clone, Debug, PartialEq)]
pub struct InstallDiskPlan {
    /// The selector to render.
    pub selector: InstallSelector,
    /// The chosen disk, when disk facts were known.
    pub chosen: Option<DiskChoice>,
    /// What the operator should know (uniqueness unchecked, rules Talos cannot express).
    pub warnings: Vec<String>,
}

/// Decide the install disk: against the known disks when there are any (pinned, exactly one),
/// else by translating the rules into Talos' selector with a warning.
pub fn plan_install_disk(
    rules: &DiskRules,
    disks: &[Disk],
    version: TalosVersion,
) -> Result<InstallDiskPlan, DiskError> {
    if disks.is_empty() {
        let (selector, mut warnings) = translate_rules(rules, version)?;
        warnings.insert(
            0,
            "no disk facts are known for this machine: uniqueness of the install disk could not be checked; Talos will take the first matching disk in kernel-name order".into(),
        );
        return Ok(InstallDiskPlan {
            selector,
            chosen: None,
            warnings,
        });
    }
    let choice = select_install_disk(rules, disks)?;
    let selector = if version.uses_unattended_install() {
        InstallSelector::Cel(choice.pin.cel())
    } else {
        InstallSelector::DiskSelector(choice.pin.disk_selector())
    };
    let mut warnings = Vec::new();
    if choice.tie_broken {
        if let Some(p) = rules.prefer {
            warnings.push(format!(
                "several disks match; preference `{}` chose disks[{}] ({})",
                p.as_str(),
                choice.index,
                choice.pin
            ));
        }
    }
    Ok(InstallDiskPlan {
        selector,
        chosen: Some(choice),
        warnings,
    })
}

/// Translate rules into Talos' own selector for `version`, with warnings for what Talos cannot
/// express. Refuses empty rules (Talos would take any disk) and, up to 1.13, more than one size
/// condition (the `diskSelector.size` field holds one).
pub fn translate_rules(
    rules: &DiskRules,
    version: TalosVersion,
) -> Result<(InstallSelector, Vec<String>), DiskError> {
    if rules.is_empty() {
        return Err(DiskError::Untranslatable {
            version,
            reason: "no install-disk rules are given, so Talos would take any disk; add rules or record the machine's disks".into(),
        });
    }
    let mut warnings = Vec::new();
    if let Some(p) = rules.prefer {
        warnings.push(format!(
            "preference `{}` cannot be expressed in a Talos disk selector and is ignored",
            p.as_str()
        ));
    }
    if version.uses_unattended_install() {
        return Ok((InstallSelector::Cel(rules_cel(rules)), warnings));
    }
    let mut m = Mapping::new();
    match rules.size.as_slice() {
        [] => {}
        [b] => {
            m.insert("size".into(), Value::String(b.as_str().to_string()));
        }
        several => {
            return Err(DiskError::Untranslatable {
                version,
                reason: format!(
                    "`machine.install.diskSelector.size` holds one condition, the rules give {} ({}); keep one bound or record the machine's disks",
                    several.len(),
                    several.iter().map(|b| b.as_str()).collect::<Vec<_>>().join(", ")
                ),
            })
        }
    }
    if let Some(t) = rules.disk_type {
        if t == DiskType::Ssd {
            warnings.push(
                "Talos' diskSelector `type: ssd` also matches NVMe disks (any non-rotational disk)"
                    .into(),
            );
        }
        m.insert("type".into(), Value::String(t.as_str().to_string()));
    }
    for (k, v) in [
        ("model", &rules.model),
        ("serial", &rules.serial),
        ("busPath", &rules.bus_path),
    ] {
        if let Some(v) = v {
            m.insert(k.into(), Value::String(v.clone()));
        }
    }
    Ok((InstallSelector::DiskSelector(m), warnings))
}

/// The CEL expression equivalent to the rules (Talos 1.14 `UnattendedInstallConfig`), with the
/// terms Talos adds when it translates a `diskSelector` itself.
pub fn rules_cel(rules: &DiskRules) -> String {
    let mut terms = Vec::new();
    match rules.disk_type {
        Some(DiskType::Nvme) => terms.push("disk.transport == \"nvme\"".to_string()),
        Some(DiskType::Ssd) => {
            terms.push("!disk.rotational".to_string());
            terms.push("disk.transport != \"nvme\"".to_string());
        }
        Some(DiskType::Hdd) => terms.push("disk.rotational".to_string()),
        None => {}
    }
    for b in &rules.size {
        terms.push(format!("disk.size {} {}u", b.op.symbol(), b.bytes));
    }
    for (field, v) in [
        ("model", &rules.model),
        ("serial", &rules.serial),
        ("bus_path", &rules.bus_path),
    ] {
        if let Some(p) = v {
            terms.push(format!("glob({}, disk.{field})", cel_string(p)));
        }
    }
    terms.extend(BASE_CEL_TERMS.iter().map(|t| (*t).to_string()));
    terms.join(" && ")
}

/// A CEL string literal.
fn cel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    fn disk(serial: &str, size_gb: u64, t: DiskType) -> Disk {
        Disk {
            serial: (!serial.is_empty()).then(|| serial.to_string()),
            wwid: Some(format!("naa.{serial}")),
            model: Some(format!("MODEL-{serial}")),
            size_bytes: Some(size_gb * GB),
            disk_type: Some(t),
            bus_path: Some(format!("/pci0000:00/{serial}")),
            data_disk: false,
        }
    }

    fn rules(yaml: &str) -> DiskRules {
        serde_yaml_ng::from_str(yaml).expect("rules")
    }

    /// The devices an AMI MegaRAC (DGX) BMC exposes to the host next to the real disks: a
    /// "Virtual Cdrom Device" of 2048 bytes and a 1 GB "Virtual HDisk Device", with no serial,
    /// WWID or type.
    fn megarac_virtual_media() -> Vec<Disk> {
        vec![
            Disk {
                model: Some("Virtual Cdrom Device".into()),
                size_bytes: Some(2048),
                ..Disk::default()
            },
            Disk {
                model: Some("Virtual HDisk Device".into()),
                size_bytes: Some(GB),
                ..Disk::default()
            },
        ]
    }

    #[test]
    fn virtual_media_is_never_chosen_whatever_prefer_says() {
        let mut disks = megarac_virtual_media();
        disks.push(disk("NVME-A", 960, DiskType::Nvme));
        disks.push(disk("NVME-B", 3840, DiskType::Nvme));
        // `prefer: smallest` over everything would pick the 2048-byte CD-ROM.
        let c = select_install_disk(&rules("prefer: smallest"), &disks).expect("choice");
        assert_eq!(c.pin, DiskPin::Serial("NVME-A".into()));
        let c = select_install_disk(&rules("prefer: largest"), &disks).expect("choice");
        assert_eq!(c.pin, DiskPin::Serial("NVME-B".into()));
        // A rule that matches only virtual media matches nothing, naming why.
        let e = select_install_disk(&rules("model: 'Virtual*'"), &disks).expect_err("none");
        let text = e.to_string();
        assert!(text.contains("BMC virtual media"), "{text}");
        // Optical, USB and tiny devices are not disks either.
        for (model, bus, size) in [
            ("TSSTcorp CDDVDW", None, Some(700_000_000u64)),
            ("HL-DT-ST DVD-ROM DU90N", None, None),
            (
                "SanDisk Cruzer",
                Some("/pci0000:00/0000:00:14.0/usb1/1-1"),
                Some(64 * GB),
            ),
            ("Tiny", None, Some(GB)),
        ] {
            let d = Disk {
                model: Some(model.into()),
                bus_path: bus.map(str::to_string),
                size_bytes: size,
                ..Disk::default()
            };
            assert!(not_a_disk(&d).is_some(), "{model}");
        }
    }

    #[test]
    fn indistinguishable_disks_say_pinning_is_impossible_and_what_is_safe() {
        let mut disks = megarac_virtual_media();
        let bare = |size_gb: u64, bus: Option<&str>| Disk {
            model: Some("SAMSUNG MZ7L3960".into()),
            size_bytes: Some(size_gb * GB),
            disk_type: Some(DiskType::Ssd),
            bus_path: bus.map(str::to_string),
            ..Disk::default()
        };
        disks.push(bare(960, Some("/pci0000:00/0000:00:17.0/ata1")));
        disks.push(bare(960, Some("/pci0000:00/0000:00:17.0/ata2")));
        let e = select_install_disk(
            &rules("prefer: smallest\nbusPath: '/pci0000:00/0000:00:17.0/ata1'"),
            &disks,
        )
        .expect_err("unpinnable");
        let text = e.to_string();
        assert!(text.contains("pinning is impossible"), "{text}");
        assert!(
            text.contains("busPath: /pci0000:00/0000:00:17.0/ata1"),
            "{text}"
        );
        // Without bus paths, a larger disk is still safely selected by a size bound.
        let mut disks = megarac_virtual_media();
        disks.push(bare(480, None));
        disks.push(bare(1920, None));
        let e = select_install_disk(&rules("prefer: largest"), &disks).expect_err("unpinnable");
        let text = e.to_string();
        assert!(text.contains("pinning is impossible"), "{text}");
        assert!(
            text.contains(&format!("size: \">= {}\"", 1920 * GB)),
            "{text}"
        );
        // The smaller one has no safe rule: the virtual media are smaller still.
        let e = select_install_disk(&rules("prefer: smallest"), &disks).expect_err("unpinnable");
        assert!(e.to_string().contains("no rule is safe"), "{e}");
    }

    #[test]
    fn sizes_parse_as_talos() {
        let cases: &[(&str, u64)] = &[
            ("400GB", 400 * GB),
            ("400 GB", 400 * GB),
            ("400gb", 400 * GB),
            ("400G", 400 * GB),
            ("1TB", 1_000 * GB),
            ("1.5TB", 1_500 * GB),
            ("2TiB", 2 << 40),
            ("512MiB", 512 << 20),
            ("4gi", 4 << 30),
            ("1000", 1000),
            ("10kB", 10_000),
        ];
        for (s, want) in cases {
            assert_eq!(parse_size(s), Ok(*want), "{s}");
        }
        for bad in ["", "GB", "12 parsecs", "1e3GB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        let b: SizeBound = ">= 400GB".parse().expect("bound");
        assert_eq!((b.op, b.bytes), (SizeOp::Ge, 400 * GB));
        let b: SizeBound = "<=2TB".parse().expect("bound");
        assert_eq!((b.op, b.bytes), (SizeOp::Le, 2_000 * GB));
        let b: SizeBound = "256GB".parse().expect("bound");
        assert_eq!(b.op, SizeOp::Eq);
        let e = "=> 1GB".parse::<SizeBound>().expect_err("bad op");
        assert!(e.to_string().contains("`=> 1GB`"), "{e}");
    }

    #[test]
    fn globs_match_as_talos() {
        let cases: &[(&str, &str, bool)] = &[
            ("", "", true),
            ("", "a", false),
            ("*", "", true),
            ("*", "anything", true),
            ("WDC*", "WDC WD40", true),
            ("WDC*", "xWDC", false),
            ("*40", "WDC WD40", true),
            ("*WD*", "WDC WD40", true),
            ("S*N*1", "SN-NVME-01", true),
            ("S*N*1", "SN-NVME-10", false),
            ("/pci0000:00/*", "/pci0000:00/0000:00:1f.2/ata1", true),
            ("exact", "Exact", false),
            ("a?c", "abc", false),
        ];
        for (p, s, want) in cases {
            assert_eq!(glob_match(p, s), *want, "glob({p:?}, {s:?})");
        }
    }

    #[test]
    fn selection_table() {
        use DiskType::*;
        let machine = vec![
            disk("SSD-A", 480, Ssd),
            disk("NVME-B", 1_000, Nvme),
            disk("NVME-C", 2_000, Nvme),
            disk("HDD-D", 8_000, Hdd),
        ];
        // (rules, expected pin or error prefix)
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("type: ssd", Ok("SSD-A")),
            ("type: hdd", Ok("HDD-D")),
            ("size: ['>= 400GB', '<= 600GB']", Ok("SSD-A")),
            ("{type: nvme, size: ['<= 1.5TB']}", Ok("NVME-B")),
            ("model: 'MODEL-NVME-C'", Ok("NVME-C")),
            ("serial: 'NVME-*'", Err("2 disks match")),
            ("type: nvme", Err("2 disks match")),
            ("{type: nvme, prefer: smallest}", Ok("NVME-B")),
            ("{type: nvme, prefer: largest}", Ok("NVME-C")),
            ("busPath: '/pci0000:00/HDD*'", Ok("HDD-D")),
            ("size: ['> 10TB']", Err("no disk matches")),
            ("{type: ssd, size: ['>= 1TB']}", Err("no disk matches")),
        ];
        for (r, want) in cases {
            let got = select_install_disk(&rules(r), &machine);
            match (want, got) {
                (Ok(serial), Ok(c)) => {
                    assert_eq!(c.pin, DiskPin::Serial(serial.to_string()), "{r}")
                }
                (Err(prefix), Err(e)) => {
                    assert!(e.to_string().starts_with(prefix), "{r}: {e}")
                }
                (w, g) => panic!("{r}: want {w:?}, got {g:?}"),
            }
        }
    }

    #[test]
    fn device_name_order_does_not_change_the_choice() {
        // The kernel may enumerate disks in any order from boot to boot (sda <-> sdb); the
        // choice is made on facts, so every order gives the same pinned disk.
        let a = disk("SYS-1", 480, DiskType::Ssd);
        let b = disk("DATA-2", 3_840, DiskType::Ssd);
        let c = disk("DATA-3", 3_840, DiskType::Ssd);
        let r = rules("{type: ssd, size: ['<= 1TB']}");
        let orders = [
            vec![a.clone(), b.clone(), c.clone()],
            vec![b.clone(), a.clone(), c.clone()],
            vec![c.clone(), b.clone(), a.clone()],
        ];
        for disks in orders {
            let choice = select_install_disk(&r, &disks).expect("choice");
            assert_eq!(choice.pin, DiskPin::Serial("SYS-1".into()));
            assert_eq!(disks[choice.index], a);
        }
    }

    #[test]
    fn ties_need_a_preference_and_a_strict_winner() {
        let disks = vec![
            disk("A", 960, DiskType::Ssd),
            disk("B", 960, DiskType::Ssd),
            disk("C", 1_920, DiskType::Ssd),
        ];
        let e = select_install_disk(&rules("type: ssd"), &disks).expect_err("tie");
        assert!(matches!(e, DiskError::Ambiguous { tie: None, .. }), "{e}");
        // Smallest is shared by A and B: still ambiguous, and the error says the preference
        // was tried.
        let e = select_install_disk(&rules("{type: ssd, prefer: smallest}"), &disks)
            .expect_err("shared smallest");
        assert!(e.to_string().contains("did not break the tie"), "{e}");
        assert!(e.to_string().contains("disks[0]") && e.to_string().contains("disks[1]"));
        let c = select_install_disk(&rules("{type: ssd, prefer: largest}"), &disks)
            .expect("largest is unique");
        assert_eq!((c.index, c.tie_broken), (2, true));
        // A preference never hides an unknown size.
        let mut unknown = disks.clone();
        unknown[2].size_bytes = None;
        assert!(select_install_disk(&rules("{serial: '*', prefer: largest}"), &unknown).is_err());
    }

    #[test]
    fn data_disks_are_never_chosen() {
        let mut data = disk("DATA", 480, DiskType::Ssd);
        data.data_disk = true;
        let disks = vec![disk("SYS", 240, DiskType::Ssd), data];
        let e = select_install_disk(&rules("type: ssd"), &disks).expect_err("data");
        assert!(
            matches!(&e, DiskError::DataDiskMatched { data, candidates } if data.len() == 1 && candidates.len() == 2),
            "{e}"
        );
        // Even as the only match, and even with a preference that would pick the other disk.
        let e = select_install_disk(&rules("{size: ['>= 400GB']}"), &disks).expect_err("only");
        assert!(e.to_string().contains("data disk(s) disks[1]"), "{e}");
        let e = select_install_disk(&rules("{type: ssd, prefer: smallest}"), &disks)
            .expect_err("preference does not excuse");
        assert!(matches!(e, DiskError::DataDiskMatched { .. }));
        // Rules that exclude it are fine.
        let c = select_install_disk(&rules("size: ['< 400GB']"), &disks).expect("sys");
        assert_eq!(c.pin, DiskPin::Serial("SYS".into()));
    }

    #[test]
    fn pinning_falls_back_to_wwid_and_refuses_shared_ids() {
        let mut a = disk("SAME", 480, DiskType::Ssd);
        let mut b = disk("SAME", 960, DiskType::Ssd);
        a.wwid = Some("naa.5000c500a1".into());
        b.wwid = Some("naa.5000c500b2".into());
        let c = select_install_disk(&rules("size: ['< 500GB']"), &[a.clone(), b.clone()])
            .expect("wwid");
        assert_eq!(c.pin, DiskPin::Wwid("naa.5000c500a1".into()));
        b.wwid = a.wwid.clone();
        let e = select_install_disk(&rules("size: ['< 500GB']"), &[a, b]).expect_err("shared");
        assert!(matches!(e, DiskError::Unpinnable { .. }), "{e}");
        let mut lone = disk("", 480, DiskType::Ssd);
        lone.wwid = None;
        assert!(select_install_disk(&rules("type: ssd"), &[lone]).is_err());
    }

    #[test]
    fn unknown_facts_do_not_match() {
        let bare = Disk {
            serial: Some("X".into()),
            ..Default::default()
        };
        let e = select_install_disk(&rules("type: nvme"), &[bare]).expect_err("unknown");
        assert!(e.to_string().contains("type unknown"), "{e}");
        let e = select_install_disk(&rules("type: nvme"), &[]).expect_err("no disks");
        assert!(e.to_string().contains("(none known)"), "{e}");
    }

    #[test]
    fn translation_without_facts() {
        let v113 = TalosVersion::new(1, 13, 0);
        let v114 = TalosVersion::new(1, 14, 0);
        let r = rules("{type: nvme, size: ['>= 400GB'], model: 'Samsung*'}");
        let plan = plan_install_disk(&r, &[], v113).expect("plan");
        assert!(plan.chosen.is_none());
        assert!(plan.warnings[0].contains("uniqueness"));
        assert_eq!(
            plan.selector,
            InstallSelector::DiskSelector(
                serde_yaml_ng::from_str("{size: '>= 400GB', type: nvme, model: 'Samsung*'}")
                    .expect("map")
            )
        );
        let plan = plan_install_disk(&r, &[], v114).expect("plan");
        assert_eq!(
            plan.selector,
            InstallSelector::Cel(
                "disk.transport == \"nvme\" && disk.size >= 400000000000u && glob(\"Samsung*\", disk.model) && disk.transport != \"\" && disk.transport != \"usb\" && !disk.readonly && !disk.cdrom".into()
            )
        );
        // Two bounds do not fit the 1.13 diskSelector, but do fit CEL.
        let two = rules("size: ['>= 400GB', '<= 2TB']");
        let e = plan_install_disk(&two, &[], v113).expect_err("two bounds");
        assert!(e.to_string().contains("holds one condition"), "{e}");
        assert!(plan_install_disk(&two, &[], v114).is_ok());
        // ssd is ambiguous in 1.13 and exact in CEL; a preference is reported as ignored.
        let ssd = rules("{type: ssd, prefer: smallest}");
        let plan = plan_install_disk(&ssd, &[], v113).expect("plan");
        assert!(plan
            .warnings
            .iter()
            .any(|w| w.contains("also matches NVMe")));
        assert!(plan.warnings.iter().any(|w| w.contains("ignored")));
        let (sel, _) = translate_rules(&ssd, v114).expect("cel");
        assert!(
            matches!(sel, InstallSelector::Cel(c) if c.starts_with("!disk.rotational && disk.transport != \"nvme\""))
        );
        // No rules at all: refuse rather than let Talos take any disk.
        assert!(plan_install_disk(&DiskRules::default(), &[], v113).is_err());
    }

    #[test]
    fn pinned_plans_per_version() {
        let disks = vec![disk("S1", 480, DiskType::Ssd)];
        let r = rules("type: ssd");
        let p = plan_install_disk(&r, &disks, TalosVersion::new(1, 12, 0)).expect("plan");
        assert_eq!(
            p.selector,
            InstallSelector::DiskSelector(serde_yaml_ng::from_str("{serial: S1}").expect("map"))
        );
        let p = plan_install_disk(&r, &disks, TalosVersion::new(1, 14, 1)).expect("plan");
        assert_eq!(
            p.selector,
            InstallSelector::Cel(
                "disk.serial == \"S1\" && disk.transport != \"\" && disk.transport != \"usb\" && !disk.readonly && !disk.cdrom"
                    .into()
            )
        );
        assert_eq!(cel_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }
}
