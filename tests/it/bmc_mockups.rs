//! Discovery, inspection and capability probing against recorded BMC trees (Dell iDRAC 9, HPE iLO,
//! Supermicro, DMTF sample) served by `sushy-static`. Every expected value below was read from the
//! mockup JSON in `../shared/redfish-mockups`.
//!
//! Variants of those trees, derived here (the shared files are never edited) and served by the
//! in-test `RecordedBmc` (which keeps what a PATCH writes), show that a property the BMC lists as
//! `null` is an absent one, in the capability probe and in every operation alike.

use crate::support::bmc_peers as peers;

use std::time::Duration;

use plinth::bmc::{
    Bmc, BmcEndpoint, BmcError, BmcOptions, BootMode, BootTarget, DriveSource, MediaLocation,
    Password, PowerAction, PowerState, RedfishBmc, TlsPolicy,
};
use plinth::domain::{DiskType, MacAddr};
use serde_json::json;

fn client(peer: &peers::Peer) -> RedfishBmc {
    client_at(peer.url())
}

fn client_at(url: String) -> RedfishBmc {
    RedfishBmc::new(
        BmcEndpoint {
            url,
            username: "root".into(),
            password: Password::new("calvin"),
            tls: TlsPolicy::PlainHttp,
        },
        BmcOptions {
            request_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(100),
            power_timeout: Duration::from_secs(5),
            retry_backoff: Duration::from_millis(50),
            ..BmcOptions::default()
        },
    )
    .expect("client")
}

fn macs(list: &[&str]) -> Vec<MacAddr> {
    list.iter().map(|m| m.parse().expect("mac")).collect()
}

#[tokio::test]
async fn dell_idrac() {
    let peer = peers::sushy_static("dell");
    let bmc = client(&peer);
    assert_eq!(
        bmc.system_uri().await.expect("discover"),
        "/redfish/v1/Systems/System.Embedded.1"
    );

    let hw = bmc.inspect().await.expect("inspect");
    assert_eq!(
        hw.smbios_uuid.map(|u| u.to_string()).as_deref(),
        Some("4c4c4544-0035-3410-8050-c6c04f314733")
    );
    assert_eq!(hw.serial.as_deref(), Some("CNIVC0014M0388"));
    assert_eq!(hw.manufacturer.as_deref(), Some("Dell Inc."));
    assert_eq!(hw.model.as_deref(), Some("PowerEdge R750"));
    assert_eq!(hw.bios_version.as_deref(), Some("1.8.2"));
    // iDRAC's HostEthernetInterfaces links the whole NIC collection: no NIC is flagged for it.
    assert!(hw.nics.iter().all(|n| !n.bmc_host_interface));
    let mut got = hw.host_macs();
    got.sort();
    let mut want = macs(&[
        "70:B5:E8:F0:52:DC",
        "70:B5:E8:F0:52:DD",
        "E4:3D:1A:13:27:F0",
        "E4:3D:1A:13:27:F1",
        "B8:3F:D2:90:97:C4",
    ]);
    want.sort();
    assert_eq!(got, want);
    let slot5 = hw
        .nics
        .iter()
        .find(|n| n.id == "NIC.Slot.5-1")
        .expect("NIC.Slot.5-1");
    assert_eq!(slot5.enabled, Some(false));

    assert_eq!(hw.drive_source, DriveSource::Storage);
    let mut serials: Vec<_> = hw.drives.iter().filter_map(|d| d.serial.clone()).collect();
    serials.sort();
    assert_eq!(serials, ["61M0A08ZTCD8", "61P0A06CTCD8", "61X0A002TCD8"]);
    for d in &hw.drives {
        assert_eq!(d.model.as_deref(), Some("Dell Ent NVMe CM6 RI 1.92TB"));
        assert_eq!(d.capacity_bytes, Some(1_920_383_410_176));
        assert_eq!(d.media_type.as_deref(), Some("SSD"));
        assert_eq!(d.protocol.as_deref(), Some("PCIe"));
        assert_eq!(d.disk_type, Some(DiskType::Nvme));
        assert_eq!(d.manufacturer.as_deref(), Some("KIOXIA Corporation"));
    }

    let caps = bmc.capabilities().await.expect("capabilities");
    assert_eq!(caps.vendor.as_deref(), Some("Dell"));
    assert_eq!(caps.quirks.as_deref(), Some("dell-idrac"));
    assert_eq!(caps.redfish_version.as_deref(), Some("1.13.1"));
    assert!(caps.sessions, "root links SessionService/Sessions");
    // sushy-static answers the session POST with 204 and no token: basic auth it is.
    assert_eq!(caps.auth, "basic");
    assert!(caps.reset_types.iter().any(|r| r == "PowerCycle"));
    assert_eq!(caps.reset_types.len(), 8);
    for t in ["Pxe", "Cd", "UefiHttp"] {
        assert!(caps.boot_targets.iter().any(|b| b == t), "{t}");
    }
    assert!(caps.boot_mode_settable);
    assert_eq!(caps.virtual_media, Some(MediaLocation::System));
    assert!(!caps.etag.offered);

    let media = bmc.media_status().await.expect("media");
    assert_eq!(
        media.slot,
        "/redfish/v1/Systems/System.Embedded.1/VirtualMedia/1"
    );
    assert!(!media.inserted);
    assert_eq!(media.media_types, ["CD", "DVD", "USBStick"]);

    // Already on: nothing to do, no reset sent.
    assert_eq!(
        bmc.power(PowerAction::On).await.expect("on"),
        PowerState::On
    );
    bmc.close().await.expect("close");
}

#[tokio::test]
async fn hpe_ilo() {
    let peer = peers::sushy_static("hpe");
    let bmc = client(&peer);
    let hw = bmc.inspect().await.expect("inspect");
    assert_eq!(
        hw.smbios_uuid
            .map(|u| u.to_string().to_uppercase())
            .as_deref(),
        Some("34383350-3131-584D-5133-303230393953")
    );
    assert_eq!(hw.serial.as_deref(), Some("MXQ302099S"));
    assert_eq!(hw.manufacturer.as_deref(), Some("HPE"));
    assert_eq!(hw.model.as_deref(), Some("ProLiant DL385 Gen10 Plus v2"));
    assert_eq!(hw.bios_version.as_deref(), Some("A42 v2.60 (08/11/2022)"));
    let mut got = hw.host_macs();
    got.sort();
    let mut want = macs(&[
        "50:7c:6f:11:f2:a6",
        "50:7c:6f:11:f2:a7",
        "50:7c:6f:11:f2:a8",
        "50:7c:6f:11:f2:a9",
        "88:e9:a4:87:42:c8",
        "88:e9:a4:80:9d:a2",
        "b8:3f:d2:d7:f7:4a",
    ]);
    want.sort();
    assert_eq!(got, want);

    assert_eq!(hw.drive_source, DriveSource::Storage);
    assert_eq!(hw.drives.len(), 18, "{:#?}", hw.drives);
    let nvme: Vec<_> = hw
        .drives
        .iter()
        .filter(|d| d.protocol.as_deref() == Some("NVMe"))
        .collect();
    assert_eq!(nvme.len(), 16);
    assert!(nvme
        .iter()
        .all(|d| d.model.as_deref() == Some("MZXLR6T4HALA-000H3")
            && d.capacity_bytes == Some(6_401_252_745_216)
            && d.disk_type == Some(DiskType::Nvme)));
    let sata: Vec<_> = hw
        .drives
        .iter()
        .filter(|d| d.protocol.as_deref() == Some("SATA"))
        .collect();
    let mut sata_serials: Vec<_> = sata.iter().filter_map(|d| d.serial.clone()).collect();
    sata_serials.sort();
    assert_eq!(sata_serials, ["S6MPNE0T802701", "S6MPNE0T802706"]);
    assert!(sata
        .iter()
        .all(|d| d.model.as_deref() == Some("VK000480GZXRF")
            && d.capacity_bytes == Some(480_103_981_056)
            && d.disk_type == Some(DiskType::Ssd)));
    assert!(hw
        .drives
        .iter()
        .any(|d| d.serial.as_deref() == Some("S6C1NA0TA01511")));

    let caps = bmc.capabilities().await.expect("capabilities");
    assert_eq!(caps.vendor.as_deref(), Some("HPE"));
    assert_eq!(caps.quirks.as_deref(), Some("hpe-ilo"));
    assert_eq!(caps.redfish_version.as_deref(), Some("1.6.0"));
    assert!(!caps.reset_types.iter().any(|r| r == "PowerCycle"));
    assert_eq!(
        caps.reset_types,
        [
            "On",
            "ForceOff",
            "GracefulShutdown",
            "ForceRestart",
            "Nmi",
            "PushPowerButton",
            "GracefulRestart"
        ]
    );
    assert!(caps.boot_targets.iter().any(|b| b == "UefiHttp"));
    assert_eq!(caps.virtual_media, Some(MediaLocation::Manager));
    assert!(caps.etag.offered && caps.etag.weak, "{:?}", caps.etag);

    let media = bmc.media_status().await.expect("media");
    assert_eq!(media.slot, "/redfish/v1/Managers/1/VirtualMedia/2");
    assert_eq!(media.media_types, ["CD", "DVD"]);
}

#[tokio::test]
async fn supermicro() {
    let peer = peers::sushy_static("supermicro");
    let bmc = client(&peer);
    let hw = bmc.inspect().await.expect("inspect");
    assert_eq!(
        hw.smbios_uuid
            .map(|u| u.to_string().to_uppercase())
            .as_deref(),
        Some("00000000-0000-0000-0000-7CC25550A8FF")
    );
    assert_eq!(hw.serial.as_deref(), Some("S889914X3710910"));
    assert_eq!(hw.manufacturer.as_deref(), Some("Supermicro"));
    assert_eq!(hw.model.as_deref(), Some("SYS-821GE-TNHR"));
    assert_eq!(hw.bios_version.as_deref(), Some("1.4"));
    // The host side of the BMC link is flagged through Managers/1/HostInterfaces.
    let host_if: Vec<_> = hw.nics.iter().filter(|n| n.bmc_host_interface).collect();
    assert_eq!(host_if.len(), 1);
    assert_eq!(host_if[0].id, "ToManager");
    assert_eq!(host_if[0].mac, "BE:3A:F2:B6:05:9F".parse().expect("mac"));
    let got = hw.host_macs();
    assert_eq!(got.len(), 11);
    for m in [
        "94:6d:ae:91:fb:22",
        "7c:c2:55:79:3f:8f",
        "7c:c2:55:79:3f:8e",
    ] {
        assert!(got.contains(&m.parse().expect("mac")), "{m}");
    }

    // Drives live under Chassis/.../StorageBackplane and are linked from Storage/NVMeSSD; the
    // drives name no protocol, the controller's single device protocol (NVMe) fills in.
    assert_eq!(hw.drive_source, DriveSource::Storage);
    assert_eq!(hw.drives.len(), 8);
    assert!(hw
        .drives
        .iter()
        .all(|d| d.model.as_deref() == Some("MZQL27T6HBLA-00A07")
            && d.manufacturer.as_deref() == Some("Samsung")
            && d.capacity_bytes == Some(7_681_501_126_656)
            && d.protocol.as_deref() == Some("NVMe")
            && d.media_type.is_none()
            && d.disk_type == Some(DiskType::Nvme)));
    assert_eq!(hw.drives[0].serial.as_deref(), Some("S6CKNN0W502286"));

    let caps = bmc.capabilities().await.expect("capabilities");
    assert_eq!(caps.vendor.as_deref(), Some("Supermicro"));
    assert_eq!(caps.quirks.as_deref(), Some("supermicro"));
    assert_eq!(caps.redfish_version.as_deref(), Some("1.11.0"));
    // Read from Systems/1/ResetActionInfo, not the action itself.
    assert_eq!(
        caps.reset_types,
        [
            "On",
            "ForceOff",
            "GracefulShutdown",
            "GracefulRestart",
            "ForceRestart",
            "Nmi",
            "ForceOn",
            "PowerCycle"
        ]
    );
    assert!(caps.boot_targets.iter().any(|b| b == "UsbCd"));
    assert_eq!(caps.virtual_media, Some(MediaLocation::Manager));
    assert!(caps.etag.offered && !caps.etag.weak);

    let media = bmc.media_status().await.expect("media");
    assert_eq!(
        media.slot,
        "/redfish/v1/Managers/1/VirtualMedia/VirtualMedia1"
    );

    // A static tree keeps its recorded override, so the read-back exposes what the BMC holds:
    // the quirk's UsbCd target was asked for, the recorded Pxe/Disabled is what it kept.
    match bmc.boot_once(BootTarget::Cd, None).await {
        Err(BmcError::BootNotApplied { wanted, actual }) => {
            assert_eq!(wanted.target.as_deref(), Some("UsbCd"));
            assert_eq!(actual.target.as_deref(), Some("Pxe"));
            assert_eq!(actual.enabled.as_deref(), Some("Disabled"));
        }
        other => panic!("expected BootNotApplied, got {other:?}"),
    }
}

#[tokio::test]
async fn dmtf_sample() {
    let peer = peers::sushy_static("dmtf");
    let bmc = client(&peer);
    let hw = bmc.inspect().await.expect("inspect");
    assert_eq!(
        hw.smbios_uuid.map(|u| u.to_string()).as_deref(),
        Some("38947555-7742-3448-3784-823347823834")
    );
    assert_eq!(hw.serial.as_deref(), Some("437XR1138R2"));
    assert_eq!(hw.manufacturer.as_deref(), Some("Contoso"));
    assert_eq!(hw.model.as_deref(), Some("3500"));
    assert_eq!(hw.bios_version.as_deref(), Some("P79 v1.45 (12/06/2017)"));
    // VLAN1 repeats NIC 0411's MAC; ToManager is the host interface; 8890 has a changed MAC.
    assert_eq!(
        hw.host_macs(),
        macs(&["12:44:6A:3B:04:11", "AA:BB:CC:DD:EE:00"])
    );
    let nic = hw
        .nics
        .iter()
        .find(|n| n.id == "12446A3B8890")
        .expect("nic 8890");
    assert_eq!(
        nic.permanent_mac,
        Some("12:44:6A:3B:88:90".parse().expect("mac"))
    );
    assert!(hw
        .nics
        .iter()
        .any(|n| n.id == "ToManager" && n.bmc_host_interface));
    assert_eq!(
        hw.nics
            .iter()
            .find(|n| n.id == "VLAN1")
            .and_then(|n| n.interface_type.as_deref()),
        Some("Virtual")
    );

    // No Storage link at all: SimpleStorage, present devices only.
    assert_eq!(hw.drive_source, DriveSource::SimpleStorage);
    let drives: Vec<_> = hw
        .drives
        .iter()
        .map(|d| (d.model.as_deref(), d.capacity_bytes))
        .collect();
    assert_eq!(
        drives,
        [
            (Some("3000GT8"), Some(8_000_000_000_000)),
            (Some("3000GT7"), Some(4_000_000_000_000))
        ]
    );

    let caps = bmc.capabilities().await.expect("capabilities");
    assert_eq!(caps.vendor.as_deref(), Some("Contoso"));
    assert_eq!(caps.quirks, None);
    assert_eq!(caps.redfish_version.as_deref(), Some("1.15.0"));
    assert!(caps.reset_types.iter().any(|r| r == "PushPowerButton"));
    assert!(!caps.reset_types.iter().any(|r| r == "PowerCycle"));
    assert_eq!(caps.virtual_media, Some(MediaLocation::System));
    assert!(!caps.etag.offered);

    let media = bmc.media_status().await.expect("media");
    assert_eq!(
        media.slot,
        "/redfish/v1/Systems/437XR1138R2/VirtualMedia/CD1"
    );
    assert!(media.inserted);
    assert_eq!(
        media.image.as_deref(),
        Some("redfish.dmtf.org/freeImages/freeOS.1.1.iso")
    );
}

/// The Supermicro system of the recorded tree.
const SMC_SYSTEM: &str = "/redfish/v1/Systems/1";

/// PATCHes the recorded BMC received for `path`, as JSON.
fn patches(bmc: &peers::RecordedBmc, path: &str) -> Vec<serde_json::Value> {
    bmc.received()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == path)
        .map(|r| serde_json::from_str(&r.body).expect("PATCH body is JSON"))
        .collect()
}

/// An AMI MegaRAC (DGX) lists `BootSourceOverrideMode` as `null`: the Supermicro HGX tree with
/// that one change. The probe says the mode is not settable, and boot-once agrees: without a mode
/// it works (and sends no mode, though the quirk row always sends the current one), with a mode it
/// is refused before anything is written.
#[tokio::test]
async fn null_boot_mode_is_not_settable_and_boot_once_agrees() {
    let mut tree = peers::mockup_tree("supermicro");
    let sys = tree.get_mut(SMC_SYSTEM).expect("system");
    assert_eq!(sys["Boot"]["BootSourceOverrideMode"], "UEFI", "as recorded");
    sys["Boot"]["BootSourceOverrideMode"] = serde_json::Value::Null;
    let fake = peers::RecordedBmc::serve(tree).await;
    let bmc = client_at(fake.url());

    let caps = bmc.capabilities().await.expect("capabilities");
    assert_eq!(caps.quirks.as_deref(), Some("supermicro"));
    assert!(!caps.boot_mode_settable, "null is absent: {caps:?}");
    assert!(caps.boot_targets.iter().any(|t| t == "Pxe"));

    match bmc.boot_once(BootTarget::Pxe, Some(BootMode::Uefi)).await {
        Err(BmcError::NotSupported(m)) => {
            assert!(m.contains("BootSourceOverrideMode"), "{m}");
            assert!(m.contains("boot_mode_settable: false"), "{m}");
        }
        other => panic!("expected NotSupported, got {other:?}"),
    }
    assert!(
        patches(&fake, SMC_SYSTEM).is_empty(),
        "refused before any write"
    );

    let held = bmc
        .boot_once(BootTarget::Pxe, None)
        .await
        .expect("boot once");
    assert_eq!(held.target.as_deref(), Some("Pxe"));
    assert_eq!(held.enabled.as_deref(), Some("Once"));
    assert_eq!(held.mode, None);
    let sent = patches(&fake, SMC_SYSTEM);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        sent[0],
        json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}),
        "no mode is sent, not even a null one"
    );
    assert!(fake.resource(SMC_SYSTEM)["Boot"]["BootSourceOverrideMode"].is_null());
}

/// The other properties BMCs list as `null`: identity, power state, allowable values, an action,
/// and the whole `Boot` object. Each reads as absent, through the same reader.
#[tokio::test]
async fn other_null_properties_are_absent() {
    let mut tree = peers::mockup_tree("supermicro");
    let sys = tree.get_mut(SMC_SYSTEM).expect("system");
    for key in ["UUID", "SerialNumber", "PowerState"] {
        assert!(sys[key].is_string(), "{key} as recorded");
        sys[key] = serde_json::Value::Null;
    }
    sys["Boot"]["BootSourceOverrideTarget@Redfish.AllowableValues"] = serde_json::Value::Null;
    sys["Actions"]["#ComputerSystem.Reset"] = serde_json::Value::Null;
    let fake = peers::RecordedBmc::serve(tree.clone()).await;
    let bmc = client_at(fake.url());

    let hw = bmc.inspect().await.expect("inspect");
    assert_eq!(hw.smbios_uuid, None);
    assert_eq!(hw.serial, None);
    assert_eq!(
        hw.model.as_deref(),
        Some("SYS-821GE-TNHR"),
        "the rest is read"
    );
    match bmc.power_state().await {
        Err(BmcError::Protocol { reason, .. }) => {
            assert!(reason.contains("no PowerState"), "{reason}")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    let caps = bmc.capabilities().await.expect("capabilities");
    assert!(caps.boot_targets.is_empty(), "{:?}", caps.boot_targets);
    assert!(caps.reset_types.is_empty(), "{:?}", caps.reset_types);
    assert!(caps.boot_mode_settable, "the mode itself is still shown");
    match bmc.power(PowerAction::Off).await {
        Err(BmcError::Protocol { .. }) => {}
        other => panic!("no power state, no power operation: {other:?}"),
    }

    // `Boot` itself null: no override to read, no targets listed, no mode; boot-once still works
    // with the standard target name, and the mode cannot be asked for.
    let sys = tree.get_mut(SMC_SYSTEM).expect("system");
    sys["Boot"] = serde_json::Value::Null;
    sys["PowerState"] = json!("On");
    let fake = peers::RecordedBmc::serve(tree).await;
    let bmc = client_at(fake.url());
    let caps = bmc.capabilities().await.expect("capabilities");
    assert!(!caps.boot_mode_settable);
    assert!(caps.boot_targets.is_empty());
    assert!(matches!(
        bmc.boot_once(BootTarget::Pxe, Some(BootMode::Uefi)).await,
        Err(BmcError::NotSupported(_))
    ));
    let held = bmc
        .boot_once(BootTarget::Pxe, None)
        .await
        .expect("boot once");
    assert_eq!(held.target.as_deref(), Some("Pxe"));
    assert_eq!(held.enabled.as_deref(), Some("Once"));
    match bmc.power(PowerAction::Off).await {
        Err(BmcError::NotSupported(m)) => assert!(m.contains("ComputerSystem.Reset"), "{m}"),
        other => panic!("a null action is no action: {other:?}"),
    }
}
