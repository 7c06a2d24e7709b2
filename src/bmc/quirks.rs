//! The one table of vendor differences, as data. Each row is keyed by vendor (and optionally model)
//! and says, next to each field, which symptom it works around. Code reads these fields; it never
//! tests a vendor name itself.
//!
//! Behaviour every BMC gets regardless (so it is not in the table): links are followed, never built;
//! trailing slashes are tolerated; ETag ladders on 412/428; task monitors are polled; success is
//! the status code; the boot override and virtual media are read back.

use crate::service::ports::bmc::MediaLocation;

/// When to send `BootSourceOverrideMode` with a boot override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeInPatch {
    /// Only when a mode was asked for and differs from the current one.
    WhenChanging,
    /// Always (the requested mode, else the current one).
    Always,
}

/// How one family of BMCs differs from the Redfish specification or from the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quirks {
    /// Row name, e.g. `dell-idrac`; shown in the capability record.
    pub name: &'static str,
    /// Matched case-insensitively against the root `Vendor`, the system or manager `Manufacturer`
    /// and the root `Oem` keys. Empty: the generic row.
    pub vendor: &'static str,
    /// Matched case-insensitively as a substring of the system `Model`; `None` for every model.
    pub model: Option<&'static str>,
    /// PATCH must carry `If-Match`, so read the ETag first even when the resource does not show one.
    pub if_match_required: bool,
    /// When to send `BootSourceOverrideMode`.
    pub mode_in_patch: ModeInPatch,
    /// `BootSourceOverrideTarget` for booting the virtual CD, tried before `Cd` when allowed.
    pub cd_boot_target: Option<&'static str>,
    /// Where to look for the virtual CD first when both the System and the Manager link one.
    pub media_location: MediaLocation,
    /// InsertMedia takes only `Image` (other parameters are refused).
    pub insert_image_only: bool,
    /// `BootSourceOverrideEnabled` reads back `Continuous` after `Once` was written.
    pub once_reads_back_continuous: bool,
}

const GENERIC: Quirks = Quirks {
    name: "generic",
    vendor: "",
    model: None,
    if_match_required: false,
    mode_in_patch: ModeInPatch::WhenChanging,
    cd_boot_target: None,
    media_location: MediaLocation::System,
    insert_image_only: false,
    once_reads_back_continuous: false,
};

/// Vendor quirks, first match wins; the last row is the generic BMC.
pub const QUIRKS: &[Quirks] = &[
    Quirks {
        name: "dell-idrac",
        vendor: "Dell",
        // iDRAC turns a BootSourceOverrideMode change into a BIOS job staged for the next boot, and
        // sending it unchanged alongside the target can fail the PATCH: send it only to change it.
        mode_in_patch: ModeInPatch::WhenChanging,
        // iDRAC 6+ links VirtualMedia under the System as well as the Manager; Dell deprecates the
        // Manager slots, so use the System's.
        media_location: MediaLocation::System,
        ..GENERIC
    },
    Quirks {
        name: "hpe-ilo",
        vendor: "HPE",
        // iLO hands out weak ETags (W/"...") on every resource; the generic 412 ladder retries
        // with the strong form. Successful PATCHes answer 200 with an `error` object holding
        // `Base.x.Success` ExtendedInfo: decided by status code, not by that body.
        // iLO publishes no ActionInfo for InsertMedia and its firmware generations disagree on
        // the optional parameters; `Image` alone is what every one of them takes.
        insert_image_only: true,
        media_location: MediaLocation::Manager,
        ..GENERIC
    },
    Quirks {
        name: "supermicro",
        vendor: "Supermicro",
        // X11/X12 BMCs fall back to Legacy when a boot-override PATCH omits the mode, so the
        // mode always goes along (the current one when none was asked for).
        mode_in_patch: ModeInPatch::Always,
        // The virtual CD enumerates as a USB CD: `Cd` boots a physical drive, `UsbCd` the
        // virtual media.
        cd_boot_target: Some("UsbCd"),
        // Virtual media lives under the Manager; the System's VirtualMedia link points there.
        media_location: MediaLocation::Manager,
        ..GENERIC
    },
    Quirks {
        name: "lenovo-xcc",
        vendor: "Lenovo",
        // XCC answers 428 Precondition Required to a PATCH without If-Match.
        if_match_required: true,
        // XCC links its remote-mount slots (EXT1..) under the Manager only.
        media_location: MediaLocation::Manager,
        ..GENERIC
    },
    Quirks {
        name: "ami-megarac",
        vendor: "AMI",
        // MegaRAC-based BMCs (ASRock Rack, Gigabyte, many ODMs) answer 428 to a PATCH without
        // If-Match, and some give session and task Locations as absolute URLs naming another
        // host; links are resolved on the configured origin for every BMC anyway.
        if_match_required: true,
        // Their boot override drops back to Legacy unless the mode comes with it.
        mode_in_patch: ModeInPatch::Always,
        media_location: MediaLocation::Manager,
        ..GENERIC
    },
    Quirks {
        name: "sushy-emulator",
        vendor: "Sushy Emulator",
        // The emulator's libvirt/fake drivers keep every boot device persistently: writing
        // `Once` reads back `Continuous`. Accepted (and shown) for this peer only.
        once_reads_back_continuous: true,
        ..GENERIC
    },
    GENERIC,
];

/// The quirks that apply to a BMC, from the names it reports about itself.
pub fn quirks_for(names: &[&str], model: Option<&str>) -> &'static Quirks {
    let model = model.map(str::to_ascii_lowercase);
    for q in QUIRKS {
        if q.vendor.is_empty() {
            return q;
        }
        let vendor = q.vendor.to_ascii_lowercase();
        let vendor_hit = names.iter().any(|n| {
            let n = n.trim().to_ascii_lowercase();
            // "Dell Inc." / "HPE" / "Hewlett Packard Enterprise" style names.
            n == vendor
                || n.starts_with(&format!("{vendor} "))
                || n.starts_with(&format!("{vendor}."))
                || n.starts_with(&format!("{vendor},"))
                || (vendor == "hpe" && n.starts_with("hewlett packard enterprise"))
        });
        let model_hit = match (q.model, &model) {
            (None, _) => true,
            (Some(m), Some(have)) => have.contains(&m.to_ascii_lowercase()),
            (Some(_), None) => false,
        };
        if vendor_hit && model_hit {
            return q;
        }
    }
    &GENERIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_match_vendor_names() {
        assert_eq!(quirks_for(&["Dell"], None).name, "dell-idrac");
        assert_eq!(quirks_for(&["", "Dell Inc."], None).name, "dell-idrac");
        assert_eq!(quirks_for(&["HPE"], None).name, "hpe-ilo");
        assert_eq!(
            quirks_for(&["Hewlett Packard Enterprise"], None).name,
            "hpe-ilo"
        );
        assert_eq!(quirks_for(&["Supermicro"], None).name, "supermicro");
        assert_eq!(quirks_for(&["Lenovo"], None).name, "lenovo-xcc");
        assert_eq!(quirks_for(&["AMI"], None).name, "ami-megarac");
        assert_eq!(quirks_for(&["Contoso"], None).name, "generic");
        assert_eq!(quirks_for(&["Amidala"], None).name, "generic");
        assert_eq!(quirks_for(&[], None).name, "generic");
    }

    #[test]
    fn generic_row_is_last_and_unique() {
        let generic: Vec<_> = QUIRKS.iter().filter(|q| q.vendor.is_empty()).collect();
        assert_eq!(generic.len(), 1);
        assert!(QUIRKS.last().is_some_and(|q| q.vendor.is_empty()));
        let mut names: Vec<_> = QUIRKS.iter().map(|q| q.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), QUIRKS.len());
    }
}
