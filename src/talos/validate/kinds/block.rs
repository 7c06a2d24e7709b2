//! `Validate()` of the block documents (`pkg/machinery/config/types/block/*.go`): system,
//! user, raw, swap, existing and external volumes, zswap, filesystem scrub and trim. The
//! shared parts (`ProvisioningSpec`, `EncryptionSpec`, `FilesystemSpec`, trim and scrub) are
//! functions here, each gated the way Talos changed it between releases.

use serde_yaml_ng::Value;

use super::{go_duration, negative_duration, volume_name_chars, Ctx, Doc, KindRule, NOW};
use crate::talos::disk::parse_size;
use crate::talos::validate::cel::CelEnv;
use crate::talos::validate::correct::{canonical, fold_enum};

pub(super) const KINDS: &[KindRule] = &[
    (
        "VolumeConfig",
        11,
        NOW,
        "pkg/machinery/config/types/block/volume_config.go",
        volume,
    ),
    (
        "UserVolumeConfig",
        11,
        NOW,
        "pkg/machinery/config/types/block/user_volume_config.go",
        user_volume,
    ),
    (
        "RawVolumeConfig",
        11,
        NOW,
        "pkg/machinery/config/types/block/raw_volume_config.go",
        raw_volume,
    ),
    (
        "SwapVolumeConfig",
        11,
        NOW,
        "pkg/machinery/config/types/block/swap_volume_config.go",
        swap_volume,
    ),
    (
        "ExistingVolumeConfig",
        11,
        NOW,
        "pkg/machinery/config/types/block/existing_volume_config.go",
        existing_volume,
    ),
    (
        "ExternalVolumeConfig",
        13,
        NOW,
        "pkg/machinery/config/types/block/external_volume_config.go",
        external_volume,
    ),
    (
        "ZswapConfig",
        11,
        NOW,
        "pkg/machinery/config/types/block/zswap_config.go",
        zswap,
    ),
    (
        "FilesystemScrubConfig",
        14,
        NOW,
        "pkg/machinery/config/types/block/fs_scrub.go",
        fs_scrub,
    ),
    (
        "FilesystemTrimConfig",
        14,
        NOW,
        "pkg/machinery/config/types/block/filesystem_trim_config.go",
        fs_trim,
    ),
    (
        "RAIDArrayConfig",
        14,
        NOW,
        "pkg/machinery/config/types/storage/raid_array_config.go",
        raid_array,
    ),
    (
        "LVMVolumeGroupConfig",
        14,
        NOW,
        "pkg/machinery/config/types/storage/lvm_volume_group_config.go",
        lvm_volume_group,
    ),
    (
        "LVMLogicalVolumeConfig",
        14,
        NOW,
        "pkg/machinery/config/types/storage/lvm_logical_volume_config.go",
        lvm_logical_volume,
    ),
];

const PROVISIONING: &str = "pkg/machinery/config/types/block/volume_config.go";
const ENCRYPTION: &str = "pkg/machinery/config/types/block/encryption.go";
const FILESYSTEM: &str = "pkg/machinery/config/types/block/user_volume_config.go";
const TRIM: &str = "pkg/machinery/config/types/block/trim.go";
const SCRUB: &str = "pkg/machinery/config/types/block/scrub.go";

/// A `Size` as Talos decodes it: bytes (go-humanize, maybe negative) or a percentage.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Size {
    Bytes { value: u64, negative: bool },
    Percent { negative: bool },
}

fn size(v: &Value) -> Option<Size> {
    let s = crate::talos::scalar_text(v)?;
    if s.is_empty() {
        return None;
    }
    let (negative, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.as_str()),
    };
    if s.contains('%') {
        return Some(Size::Percent { negative });
    }
    parse_size(body)
        .ok()
        .map(|value| Size::Bytes { value, negative })
}

/// `ProvisioningSpec.Validate(required, sizeSupported)` at `provisioning`.
fn provisioning(d: &mut Doc<'_, '_>, ctx: &Ctx, required: bool, size_supported: bool) {
    let m = ctx.minor();
    if !d.cel(
        ctx,
        "provisioning.diskSelector.match",
        CelEnv::Disk,
        "disk selector",
    ) && required
    {
        d.err_in(
            PROVISIONING,
            "provisioning.diskSelector.match",
            "disk selector is required",
        );
    }
    let min = d.at("provisioning.minSize").and_then(size);
    let max = d.at("provisioning.maxSize").and_then(size);
    let grow = d.at("provisioning.grow").is_some();
    // 1.11 always checks sizes; 1.12 added volumes whose size is the whole disk.
    if m < 12 || size_supported {
        let relative = matches!(max, Some(Size::Percent { .. }));
        let max_negative = match max {
            Some(Size::Bytes { negative, .. } | Size::Percent { negative }) => negative,
            None => false,
        };
        match (min, max) {
            (Some(lo), Some(hi)) if (m < 12 || !relative) && (m < 13 || !max_negative) => {
                let value = |s: Size| match s {
                    Size::Bytes { value, .. } => value,
                    Size::Percent { .. } => 0,
                };
                if value(lo) > value(hi) {
                    d.err_in(
                        PROVISIONING,
                        "provisioning.minSize",
                        "min size is greater than max size",
                    );
                }
            }
            (None, None) if required => d.err_in(
                PROVISIONING,
                "provisioning",
                "min size or max size is required",
            ),
            _ => {}
        }
        if m >= 13
            && matches!(
                min,
                Some(Size::Bytes { negative: true, .. } | Size::Percent { negative: true })
            )
        {
            d.err_in(
                PROVISIONING,
                "provisioning.minSize",
                "min size cannot be negative",
            );
        }
    } else if min.is_some() || max.is_some() || grow {
        d.err_in(
            PROVISIONING,
            "provisioning",
            "min size, max size and grow are not supported",
        );
    }
}

/// Whether the provisioning section asks for anything.
fn provisioning_set(d: &Doc<'_, '_>) -> bool {
    d.set("provisioning")
}

/// `EncryptionSpec.Validate()` at `encryption`.
fn encryption(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    // `block.EncryptionProviderType` and `block.FilesystemType` are read in any capitalisation
    // (pkg/machinery/resources/block/volumetype_enumer.go; see `correct.rs`).
    let provider = canonical(d.text("encryption.provider"), &["none", "luks2"]);
    let keys = d.items("encryption.keys");
    if matches!(provider, "" | "none") && keys.is_empty() {
        return;
    }
    if provider != "luks2" {
        d.err_in(
            ENCRYPTION,
            "encryption.provider",
            format!(
                "unsupported encryption provider: {}",
                if provider.is_empty() {
                    "none"
                } else {
                    provider
                }
            ),
        );
    }
    if keys.is_empty() {
        d.err_in(
            ENCRYPTION,
            "encryption.keys",
            "encryption keys are required",
        );
    }
    let mut slots = std::collections::HashSet::new();
    for (i, k) in keys.iter().enumerate() {
        let slot = k.get("slot").and_then(Value::as_i64).unwrap_or(0);
        if !slots.insert(slot) {
            d.err_in(
                ENCRYPTION,
                &format!("encryption.keys[{i}].slot"),
                format!("duplicate key slot {slot}"),
            );
        }
        if !["static", "nodeID", "kms", "tpm"]
            .iter()
            .any(|t| k.get(*t).is_some_and(|v| !v.is_null()))
        {
            d.err_in(
                ENCRYPTION,
                &format!("encryption.keys[{i}]"),
                format!("at least one encryption key type must be specified for slot {slot}"),
            );
        }
        if ctx.minor() >= 12 {
            let pcrs = k
                .get("tpm")
                .and_then(|t| t.get("options"))
                .and_then(|o| o.get("pcrs"))
                .and_then(Value::as_sequence);
            for (j, pcr) in pcrs.map(Vec::as_slice).unwrap_or(&[]).iter().enumerate() {
                if let Some(n) = pcr.as_i64() {
                    if !(0..=23).contains(&n) {
                        d.err_in(
                            ENCRYPTION,
                            &format!("encryption.keys[{i}].tpm.options.pcrs[{j}]"),
                            format!("TPM PCR {n} is out of range (0-23)"),
                        );
                    }
                }
            }
        }
    }
}

/// `FilesystemSpec.Validate()` at `filesystem`.
fn filesystem(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    let t = canonical(
        d.text("filesystem.type"),
        &[
            "none", "xfs", "vfat", "ext4", "iso9660", "swap", "virtiofs", "btrfs",
        ],
    );
    let ok = match t {
        "" | "none" | "xfs" | "ext4" => true,
        "btrfs" => ctx.minor() >= 14,
        _ => false,
    };
    if !ok {
        return d.err_in(
            FILESYSTEM,
            "filesystem.type",
            format!("unsupported filesystem type: {t}"),
        );
    }
    let xfs = matches!(t, "" | "none" | "xfs");
    if d.at("filesystem.projectQuotaSupport")
        .and_then(Value::as_bool)
        == Some(true)
        && !xfs
    {
        return d.err_in(
            FILESYSTEM,
            "filesystem.projectQuotaSupport",
            "project quota support is only available for xfs filesystem",
        );
    }
    if ctx.minor() >= 14 && d.at("filesystem.xfs").is_some() && !xfs {
        d.err_in(
            FILESYSTEM,
            "filesystem.xfs",
            "xfs options are only available for xfs filesystem",
        );
    }
}

/// Trim and scrub sections of a volume (1.14).
fn trim_scrub(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    if ctx.minor() < 14 {
        return;
    }
    if negative_duration(d, "trim.interval") {
        d.err_in(TRIM, "trim.interval", "trim interval cannot be negative");
    }
    scrub_interval(d, "scrub.interval");
}

/// A scrub interval is 0 (off) or at least 10 seconds.
fn scrub_interval(d: &mut Doc<'_, '_>, path: &str) {
    if let Some(n) = d.at(path).and_then(go_duration) {
        if n != 0 && n < 10_000_000_000 {
            d.err_in(SCRUB, path, "scrub interval: minimum value is 10s");
        }
    }
}

/// The name rules of user, raw, swap and external volumes: 1 to `max` ASCII letters, digits
/// and dashes (the partition label is a 2-byte prefix plus the name, at most 36 bytes).
fn volume_name(d: &mut Doc<'_, '_>, max: Option<usize>) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", "name is required");
    }
    if let Some(max) = max {
        if name.is_empty() || name.len() > max {
            d.err(
                "name",
                format!("name must be between 1 and {max} characters long"),
            );
        }
    }
    if !volume_name_chars(name) {
        d.err(
            "name",
            "name can only contain lowercase and uppercase ASCII letters, digits, and hyphens",
        );
    }
}

const NAME_MAX: usize = 36 - 2;

fn volume(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    let m = ctx.minor();
    let name = d.name();
    let mut allowed = vec!["STATE", "EPHEMERAL", "IMAGECACHE"];
    if m >= 14 {
        allowed.extend(["ETCD", "CRI", "KUBELET", "LOG"]);
    }
    if !allowed.contains(&name) {
        return d.err("name", format!("only {allowed:?} volumes are supported"));
    }
    let mount_set = d.set("mount");
    match name {
        "STATE" => {
            if provisioning_set(d) {
                d.err(
                    "provisioning",
                    "provisioning config is not allowed for the \"STATE\" volume",
                );
            }
            for (i, k) in d.items("encryption.keys").iter().enumerate() {
                if k.get("lockToState").and_then(Value::as_bool) == Some(true) {
                    d.err(
                        &format!("encryption.keys[{i}].lockToState"),
                        "state-locked key is not allowed for the \"STATE\" volume",
                    );
                }
            }
            if m >= 14 && mount_set {
                d.err(
                    "mount",
                    "mount config is not allowed for the \"STATE\" volume",
                );
            }
        }
        "IMAGECACHE" if m >= 14 => {
            if mount_set {
                d.err(
                    "mount",
                    "mount config is not allowed for the \"IMAGECACHE\" volume",
                );
            }
            if d.set("filesystem") {
                d.err(
                    "filesystem",
                    "filesystem config is not allowed for the \"IMAGECACHE\" volume",
                );
            }
        }
        "ETCD" | "CRI" | "KUBELET" | "LOG" => {
            let requested = d.set("provisioning.diskSelector.match")
                || d.at("provisioning.grow").is_some()
                || d.set("provisioning.minSize")
                || d.set("provisioning.maxSize");
            if mount_set && !requested {
                d.err(
                    "mount",
                    format!("mount config for the {name:?} volume is only supported when it is provisioned onto a dedicated partition"),
                );
            }
        }
        _ => {}
    }
    provisioning(d, ctx, false, true);
    encryption(d, ctx);
    trim_scrub(d, ctx);
}

fn user_volume(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    volume_name(d, Some(NAME_MAX));
    if ctx.minor() < 12 {
        provisioning(d, ctx, true, true);
        filesystem(d, ctx);
        encryption(d, ctx);
        return;
    }
    // `block.VolumeType` is an `enumer -text` type: any capitalisation decodes.
    let vtype = match canonical(
        d.text("volumeType"),
        &[
            "partition",
            "disk",
            "tmpfs",
            "directory",
            "symlink",
            "overlay",
            "external",
        ],
    ) {
        "" => "partition",
        t => t,
    };
    match vtype {
        "directory" => {
            for (key, what) in [
                ("provisioning", "provisioning"),
                ("encryption", "encryption"),
                ("filesystem", "filesystem"),
            ] {
                if d.set(key) {
                    d.err(
                        key,
                        format!("{what} spec is invalid for volumeType directory"),
                    );
                }
            }
            if ctx.minor() >= 13 && d.set("mount") {
                d.err("mount", "mount spec is invalid for volumeType directory");
            }
        }
        "disk" | "partition" => {
            provisioning(d, ctx, true, vtype == "partition");
            filesystem(d, ctx);
            encryption(d, ctx);
        }
        other => d.err("volumeType", format!("unsupported volume type {other:?}")),
    }
    trim_scrub(d, ctx);
}

fn raw_volume(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    volume_name(d, Some(NAME_MAX));
    provisioning(d, ctx, true, true);
    encryption(d, ctx);
}

fn swap_volume(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    volume_name(d, Some(NAME_MAX));
    provisioning(d, ctx, true, true);
    encryption(d, ctx);
}

fn existing_volume(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    volume_name(d, None);
    if !d.cel(
        ctx,
        "discovery.volumeSelector.match",
        CelEnv::Volume,
        "volume selector",
    ) {
        d.err(
            "discovery.volumeSelector.match",
            "volume selector is required",
        );
    }
    trim_scrub(d, ctx);
}

fn external_volume(d: &mut Doc<'_, '_>, _: &Ctx) {
    volume_name(d, Some(NAME_MAX));
    // `block.FilesystemType` is an `enumer -text` type: any capitalisation decodes.
    let fs = canonical(
        d.text("filesystemType"),
        &[
            "none", "xfs", "vfat", "ext4", "iso9660", "swap", "virtiofs", "btrfs",
        ],
    );
    if fs == "virtiofs" {
        if d.at("mount.virtiofs").is_none() {
            d.err("mount.virtiofs", "virtiofs mount spec is required");
        } else if d.text("mount.virtiofs.tag").is_empty() {
            d.err("mount.virtiofs.tag", "virtiofs tag is required");
        }
    } else {
        d.err(
            "filesystemType",
            format!(
                "invalid filesystem type: {}",
                if fs.is_empty() { "none" } else { fs }
            ),
        );
    }
}

fn zswap(d: &mut Doc<'_, '_>, _: &Ctx) {
    if let Some(n) = d.at("maxPoolPercent").and_then(Value::as_i64) {
        if !(0..=100).contains(&n) {
            d.err("maxPoolPercent", "maxPoolPercent must be between 0 and 100");
        }
    }
}

fn fs_scrub(d: &mut Doc<'_, '_>, _: &Ctx) {
    if let Some(n) = d.at("interval").and_then(go_duration) {
        if n != 0 && n < 10_000_000_000 {
            d.err("interval", "scrub interval: minimum value is 10s");
        }
    }
}

fn fs_trim(d: &mut Doc<'_, '_>, _: &Ctx) {
    if negative_duration(d, "interval") {
        d.err("interval", "interval cannot be negative");
    }
}

/// The name rules of RAID arrays and LVM objects: 1 to `max` ASCII letters, digits, `-`, `_`.
fn storage_name(d: &mut Doc<'_, '_>, max: usize) {
    let name = d.name();
    if name.is_empty() {
        d.err("name", "name is required");
    }
    if name.is_empty() || name.len() > max {
        d.err(
            "name",
            format!("name must be between 1 and {max} characters long"),
        );
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        d.err(
            "name",
            "name can only contain ASCII letters, digits, hyphens and underscores",
        );
    }
}

/// `provisioning.volumeSelector.match`, required, in the volume environment.
fn volume_selector(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    if !d.cel(
        ctx,
        "provisioning.volumeSelector.match",
        CelEnv::Volume,
        "provisioning.volumeSelector.match",
    ) {
        d.err(
            "provisioning.volumeSelector.match",
            "provisioning.volumeSelector.match is required",
        );
    }
}

fn raid_array(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    storage_name(d, 32);
    volume_selector(d, ctx);
}

fn lvm_volume_group(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    storage_name(d, 63);
    volume_selector(d, ctx);
}

fn lvm_logical_volume(d: &mut Doc<'_, '_>, _: &Ctx) {
    storage_name(d, 63);
    // `type` is a `storage.LVMLogicalVolumeType`, an enumer type
    // (pkg/machinery/resources/storage/lvmlogicalvolumetype_enumer.go, 1.14): the decoder takes
    // its four names in any capitalisation and refuses anything else; absent, it is `linear`.
    // The schema has no enum for it.
    let t = match d.text("type") {
        "" => "linear",
        t => match fold_enum(t, &["linear", "raid1", "raid0", "raid10"]) {
            Some(t) => t,
            None => {
                let msg = format!(
                    "{t:?} does not belong to LVMLogicalVolumeType values (linear, raid1, raid0, raid10)"
                );
                d.err("type", msg);
                return;
            }
        },
    };
    let mirrors = matches!(t, "raid1" | "raid10");
    let stripes = matches!(t, "raid0" | "raid10");
    if let Some(n) = d.at("mirrors").and_then(Value::as_i64) {
        if !mirrors {
            d.err(
                "mirrors",
                format!("mirrors is only valid for raid1/raid10, not {t}"),
            );
        } else if n < 1 {
            d.err("mirrors", "mirrors must be at least 1");
        }
    }
    if let Some(n) = d.at("stripes").and_then(Value::as_i64) {
        if !stripes {
            d.err(
                "stripes",
                format!("stripes is only valid for raid0/raid10, not {t}"),
            );
        } else if n < 2 {
            d.err("stripes", "stripes must be at least 2");
        }
    }
    if d.text("provisioning.volumeGroup").is_empty() {
        d.err(
            "provisioning.volumeGroup",
            "provisioning.volumeGroup is required",
        );
    }
    let min = d.at("provisioning.minSize").and_then(size);
    let max = d.at("provisioning.maxSize").and_then(size);
    match max {
        None => d.err("provisioning.maxSize", "provisioning.maxSize is required"),
        Some(Size::Bytes { negative: true, .. } | Size::Percent { negative: true }) => d.err(
            "provisioning.maxSize",
            "provisioning.maxSize must not be negative",
        ),
        _ => {}
    }
    if let (Some(Size::Bytes { value: lo, .. }), Some(hi)) = (min, max) {
        let hi_value = match hi {
            Size::Bytes { value, .. } => Some(value),
            Size::Percent { .. } => None,
        };
        if hi_value.is_some_and(|h| lo > h) {
            d.err(
                "provisioning.minSize",
                "provisioning.minSize must not exceed provisioning.maxSize",
            );
        }
    }
}
