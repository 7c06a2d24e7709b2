//! The reinstall workflow end to end, with nothing mocked: Plinth (the real binary) in a network
//! namespace as DHCP + TFTP + HTTP server, a qemu VM (TCG, SeaBIOS with iPXE as the NIC ROM, and a
//! "local disk" whose boot sector prints a banner and halts) on the namespace's bridge, and a
//! Redfish BMC of the test driving that VM through QMP (`support::qemu_bmc`). Plinth knows only
//! the BMC's URL and credentials.
//!
//! - Install: `plinth machine reinstall --follow`; Plinth sets a one-time PXE boot and powers the
//!   VM (a control plane) on through the BMC; the VM network-boots the stand-in Talos image
//!   (`support::vm_image`), fetches its config from its leased address and starts the Talos API
//!   service of the tests (`support::talos_node`, this binary) on 50000 with that config, its
//!   certificate signed from the config's OS CA; Plinth verifies it over mutual TLS (`Version`:
//!   the declared Talos version; the certificate's fingerprint recorded), the reinstall ends
//!   `done` and the machine `installed`, Plinth bootstraps the cluster on it exactly once, and
//!   `plinth cluster health` reads its services, etcd member, leader and quorum. Then a power cycle through the BMC boots
//!   the local disk (no network boot at all), and a forced network boot (`plinth bmc boot-once
//!   pxe` + cycle) gets the local-disk plan from Plinth and falls through to the disk.
//! - Failure: the VM boots the installer but never fetches its config (`plinth.standin=no-config`
//!   from the cluster's `kernelArgs`); stage `config` misses its deadline, the machine is failed
//!   naming the stage, the cluster's policy (`auto`, `maxAttempts: 2`, `backoffSeconds: 1`)
//!   reinstalls it automatically twice (through the BMC again), and then leaves it failed.
//!
//! Needs root (namespaces), qemu-system-x86, ipxe-qemu, linux-image-amd64, busybox-static, curl.
//! Every wait is bounded; every process is killed by PID and the namespace deleted on drop.
//! `PLINTH_VM_KEEP=1` keeps the working directory (Plinth's log, the VM console, the BMC record).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plinth::domain::{LifecycleState, MachineId, UniqueKey};
use plinth::service::{Event, EventFilter, LeaseState, Stage, Stores};
use sha2::{Digest, Sha256};

use crate::support::qemu_bmc::QemuBmc;
use crate::support::vm_image::{self, LOCAL_DISK_BANNER};
use crate::support::vm_lab::{
    all_reports, config, import_image, open_store, plinth_ok, poll, qemu_command, read_report,
    serve, start_report_listener, tail, without_tftp, workdir, write_inventory, InventoryExtras,
    Lab, VmSpec, BIN, REPORT_PORT, SERVER, TALOS,
};

const BMC_LISTEN: &str = "10.88.0.1:8443";
const BMC_USER: &str = "root";
const BMC_PASSWORD: &str = "qemu-bmc-Secret-1";
/// Deadline of stage `config` in the failure run. The install run measures how long the VM takes
/// from its install script to its config fetch (15-20 s under TCG on a loaded 2-core machine);
/// this is well above that, so only a VM that never asks misses it.
const CONFIG_DEADLINE_SECS: u64 = 45;

/// One lab: Plinth, the report listener, the BMC and its (powered-off) VM, the machine declared
/// with its BMC, its password set through the API and its state `ready`.
struct Rig {
    /// Dropped first (fields drop in order): its processes die while the pid file of the BMC's
    /// qemu still exists, and the namespace goes with them.
    lab: Lab,
    tag: &'static str,
    host: &'static str,
    mac: &'static str,
    plog: PathBuf,
    serial: PathBuf,
    report: PathBuf,
    token: String,
    bmc: QemuBmc,
    store: Stores,
    id: MachineId,
    /// Dropped last.
    dir: tempfile::TempDir,
}

/// How the rig's VM network-boots.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Netboot {
    /// SeaBIOS with iPXE as the NIC ROM, and a local disk; reinstalls set a one-time PXE boot.
    BiosPxe,
    /// OVMF with no local disk and Plinth's TFTP off; the machine's profile says
    /// `bootTarget: http`, so reinstalls set a one-time `UefiHttp` boot, which the BMC turns
    /// into a start whose only network boot is the firmware's HTTP boot.
    UefiHttp,
}

async fn rig(
    tag: &'static str,
    host: &'static str,
    mac: &'static str,
    uuid: &'static str,
    workflows: &str,
    extras: InventoryExtras<'_>,
) -> Rig {
    rig_with(tag, host, mac, uuid, workflows, extras, Netboot::BiosPxe).await
}

async fn rig_with(
    tag: &'static str,
    host: &'static str,
    mac: &'static str,
    uuid: &'static str,
    workflows: &str,
    extras: InventoryExtras<'_>,
    netboot: Netboot,
) -> Rig {
    let dir = workdir(tag);
    let d = dir.path();
    let mut lab = Lab::new(tag);
    let cfg = config(d, &lab.br, workflows);
    let http = netboot == Netboot::UefiHttp;
    if http {
        without_tftp(&cfg);
    }
    let cfg_s = cfg.display().to_string();

    let report_url = format!("http://10.88.0.1:{REPORT_PORT}/cgi-bin/report");
    let image = if extras.kernel_args.contains(&"plinth.standin=talos") {
        vm_image::build_with_talos_api(d, &report_url)
    } else {
        vm_image::build(d, &report_url)
    };
    import_image(&cfg, &image);
    let disk = vm_image::local_disk(d);

    // The BMC is declared with the machine; its password cannot be (it is set below).
    let bmc_yaml =
        format!("bmc:\n  url: http://{BMC_LISTEN}\n  username: {BMC_USER}\n  tls: insecure-http\n");
    let extras = InventoryExtras {
        machine: &bmc_yaml,
        ..extras
    };
    let inv = write_inventory(d, host, mac, uuid, &extras);
    if http {
        let profile = inv.join("profiles/qemu.yaml");
        let text = std::fs::read_to_string(&profile).expect("profile");
        std::fs::write(&profile, format!("{text}bootTarget: http\n")).expect("profile");
    }
    plinth_ok(&["apply", &inv.display().to_string(), "--config", &cfg_s]);
    let token = plinth_ok(&["token", "create", "--role", "operator", "--config", &cfg_s])
        .trim()
        .to_string();

    let plog = serve(&mut lab, d, &cfg);
    let report = start_report_listener(&mut lab, d);
    let serial = d.join("serial.log");
    let qemu = qemu_command(
        &lab,
        &VmSpec {
            uefi: http,
            arm64: false,
            mac,
            uuid,
            mem_mb: 512,
            serial: &serial,
            disk: (!http).then_some(disk.as_path()),
            dir: d,
        },
    );
    let bmc = QemuBmc::start(&mut lab, d, BMC_LISTEN, qemu, BMC_USER, BMC_PASSWORD);

    // The password through the API (a merge patch from a file: never on a command line).
    let patch = d.join("bmc-password.json");
    std::fs::write(
        &patch,
        serde_json::json!({"bmc": {"password": BMC_PASSWORD}}).to_string(),
    )
    .expect("patch");
    lab.cli(
        &token,
        &[
            "machine",
            "edit",
            host,
            "--file",
            &patch.display().to_string(),
        ],
    );
    lab.cli(&token, &["machine", "state", host, "ready"]);

    let store = open_store(d).await;
    let id = store
        .machines
        .find_machine(&UniqueKey::Mac(mac.parse().expect("mac")))
        .await
        .expect("find")
        .expect("the declared machine")
        .id;
    Rig {
        lab,
        tag,
        host,
        mac,
        plog,
        serial,
        report,
        token,
        bmc,
        store,
        id,
        dir,
    }
}

impl Rig {
    fn d(&self) -> &Path {
        self.dir.path()
    }

    /// The machine's events after `after` (an event id), oldest first.
    async fn events(&self, after: i64) -> Vec<Event> {
        self.store
            .events
            .list_events(&EventFilter {
                machine_id: Some(self.id),
                kind_prefix: None,
                after_id: Some(after),
                limit: 5000,
            })
            .await
            .expect("events")
    }

    async fn last_event_id(&self) -> i64 {
        self.store.events.last_event_id().await.expect("last event")
    }

    async fn machine(&self) -> plinth::domain::Machine {
        self.store
            .machines
            .get_machine(self.id)
            .await
            .expect("get")
            .expect("machine")
    }

    async fn reinstall(&self) -> Option<plinth::service::Reinstall> {
        self.store
            .reinstalls
            .reinstall(self.id)
            .await
            .expect("reinstall")
    }

    /// How often the VM has booted its local disk so far (banners on its console).
    fn disk_boots(&self) -> usize {
        String::from_utf8_lossy(&std::fs::read(&self.serial).unwrap_or_default())
            .matches(LOCAL_DISK_BANNER)
            .count()
    }

    /// Everything worth seeing when an assertion fails.
    fn evidence(&self) -> String {
        format!(
            "plinth log (tail):\n{}\nVM console (tail):\n{}\nBMC record (tail):\n{}\nqemu:\n{}",
            tail(&self.plog, 6000),
            tail(&self.serial, 4000),
            tail(&self.bmc.spec.record, 3000),
            tail(&self.d().join("qemu.log"), 2000),
        )
    }
}

fn kinds(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.kind.as_str()).collect()
}

/// The seconds between the first events of two kinds (for the run's own report only).
fn secs_between(events: &[Event], from: &str, to: &str) -> Option<f64> {
    let a = events.iter().find(|e| e.kind == from)?.at;
    let b = events.iter().find(|e| e.kind == to)?.at;
    Some((b - a).num_milliseconds() as f64 / 1000.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_reinstalls_through_its_bmc_then_boots_its_local_disk() {
    let t0 = Instant::now();
    let mut r = rig(
        "ri",
        "vm-reinstall",
        "52:54:00:88:02:01",
        "7d2e4b1a-3c5f-4e6d-8a9b-0c1d2e3f4a01",
        "[workflows]\ntick_seconds = 1\npower_seconds = 120\nnetboot_seconds = 400\n\
         config_seconds = 400\ntalos_api_seconds = 300\n",
        InventoryExtras {
            kernel_args: &["plinth.standin=talos"],
            role: Some("control-plane"),
            ..Default::default()
        },
    )
    .await;
    let (tag, host) = (r.tag, r.host);
    assert_eq!(r.machine().await.state, LifecycleState::Ready);
    assert!(r.bmc.qemu_starts(0).is_empty(), "the VM starts powered off");

    // The reinstall, followed by the CLI until it ends.
    let follow_log = r.d().join("reinstall-follow.log");
    let follow = r.lab.spawn(
        BIN,
        &[
            "machine".into(),
            "reinstall".into(),
            host.into(),
            "--follow".into(),
            "--server".into(),
            SERVER.into(),
            "--token".into(),
            r.token.clone(),
        ],
        &follow_log,
    );
    let rr = &r;
    let ended = poll(
        Duration::from_secs(600),
        Duration::from_secs(1),
        || async move { rr.reinstall().await.filter(|x| !x.stage.is_active()) },
    )
    .await;
    let evidence = r.evidence();
    let now = r.reinstall().await;
    let ri = ended.unwrap_or_else(|| {
        panic!(
            "the reinstall did not end in {:?} (now: {now:?}); {evidence}",
            t0.elapsed()
        )
    });
    eprintln!(
        "{tag}: reinstall ended {:?} after {:?}",
        ri.stage,
        t0.elapsed()
    );
    assert_eq!(ri.stage, Stage::Done, "{ri:?}; {evidence}");
    assert_eq!(ri.error, None);
    assert!(!ri.automatic);
    let m = r.machine().await;
    assert_eq!(m.state, LifecycleState::Installed, "{m:?}");

    // The CLI followed the stages and exited 0 on `reinstall.done`.
    let ok = r.lab.wait_exit(follow, Duration::from_secs(60));
    let followed = std::fs::read_to_string(&follow_log).unwrap_or_default();
    assert_eq!(ok, Some(true), "reinstall --follow: {followed}");
    for stage in ["netboot", "config", "talos_api", "done"] {
        assert!(
            followed.contains(stage),
            "--follow shows {stage}: {followed}"
        );
    }

    // Through the BMC: one-time PXE, then power on (the VM was off), then a network-first start.
    let recs = r.bmc.records();
    assert_eq!(
        r.bmc.boot_overrides(0),
        vec![("Pxe".to_string(), "Once".to_string())],
        "{recs:?}"
    );
    assert_eq!(r.bmc.resets(0), vec!["On".to_string()], "{recs:?}");
    assert_eq!(r.bmc.qemu_starts(0), vec!["network".to_string()]);
    let pos = |f: &dyn Fn(&serde_json::Value) -> bool| recs.iter().position(f);
    let patched = pos(&|x| x["method"] == "PATCH").expect("PATCH");
    // (A request is recorded once answered, so the start it caused comes first.)
    let reset = pos(&|x| x["method"] == "POST" && x["body"]["ResetType"] == "On").expect("On");
    let started = pos(&|x| x["qemu"] == "start").expect("qemu start");
    assert!(patched < started && started < reset, "{recs:?}");
    assert!(
        recs.iter()
            .filter(|x| x["method"].is_string() && x["path"] != "/redfish/v1")
            .all(|x| x["auth"] == true),
        "every request past the service root carried the credentials: {recs:?}"
    );

    // The stages, in order, and the boot between them.
    let events = r.events(0).await;
    let k = kinds(&events);
    let order: Vec<&str> = k
        .iter()
        .copied()
        .filter(|k| {
            k.starts_with("reinstall.")
                || *k == "config.served"
                || *k == "bmc.boot_once"
                || *k == "bmc.power"
        })
        .collect();
    assert_eq!(
        order,
        [
            "reinstall.started",
            "reinstall.netboot",
            "bmc.boot_once",
            "bmc.power",
            "reinstall.config",
            "config.served",
            "reinstall.talos_api",
            "reinstall.done"
        ],
        "{k:?}"
    );
    for e in events.iter().filter(|e| e.kind.starts_with("bmc.")) {
        // The capability probe after the password was set, then the reinstall's own calls.
        assert_eq!(e.detail["result"], "ok", "{e:?}");
        if e.kind != "bmc.probe" {
            assert_eq!(e.actor, "plinth", "{e:?}");
        }
    }
    assert!(k.contains(&"bmc.probe"), "{k:?}");
    let install = events
        .iter()
        .find(|e| e.kind == "boot.script")
        .unwrap_or_else(|| panic!("a boot script: {k:?}"));
    assert_eq!(install.detail["plan"], "install", "{install:?}");
    assert!(!k.contains(&"config.refused"), "{k:?}");

    // The config went to the VM's leased address, which is where Plinth found the Talos API.
    let served: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == "config.served")
        .collect();
    assert_eq!(served.len(), 1, "{k:?}");
    let from: std::net::Ipv4Addr = served[0].detail["from"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("config.served from: {}", served[0].detail));
    let leases = r
        .store
        .leases
        .leases_of_mac(r.mac.parse().expect("mac"))
        .await
        .expect("leases");
    assert!(
        leases
            .iter()
            .any(|l| l.ip == from && l.state == LeaseState::Bound),
        "config served to {from}, not a bound lease of {}: {leases:?}",
        r.mac
    );
    assert_eq!(ri.node_address.as_deref(), Some(from.to_string().as_str()));
    let report = read_report(&r.report).expect("the VM reported its config");
    assert_eq!(report.fields.get("status").map(String::as_str), Some("ok"));
    assert_eq!(report.fields.get("ip"), Some(&from.to_string()));
    assert_eq!(
        served[0].detail["sha256"],
        hex::encode(Sha256::digest(&report.body)).as_str(),
        "the VM got what Plinth recorded serving"
    );
    assert!(
        std::fs::read_to_string(&r.serial)
            .unwrap_or_default()
            .contains("talos api test node listening on 0.0.0.0:50000"),
        "{}",
        r.evidence()
    );

    // Verified over mutual TLS: the version the cluster declares, the node's certificate.
    let verified: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == "talos.verified")
        .collect();
    assert_eq!(verified.len(), 1, "{k:?}");
    assert_eq!(verified[0].detail["talos_version"], TALOS);
    assert_eq!(verified[0].detail["address"], from.to_string().as_str());
    let fingerprint = verified[0].detail["cert_sha256"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert_eq!(fingerprint.len(), 64, "{:?}", verified[0]);
    let done = events
        .iter()
        .find(|e| e.kind == "reinstall.done")
        .expect("done");
    assert_eq!(done.detail["cert_sha256"], fingerprint.as_str());

    // The first control plane of a never-bootstrapped cluster: bootstrapped once, on it.
    let rr = &r;
    let boot = poll(
        Duration::from_secs(60),
        Duration::from_secs(1),
        || async move {
            rr.store
                .talos
                .cluster_bootstrap("vmlab")
                .await
                .expect("bootstrap record")
                .filter(|b| b.state == plinth::service::ports::talos_state::BootstrapState::Done)
        },
    )
    .await
    .unwrap_or_else(|| panic!("no bootstrap; {}", r.evidence()));
    assert_eq!(boot.node, host, "{boot:?}");
    assert_eq!(boot.node_address, from.to_string());
    assert_eq!(boot.requested_by, "plinth");
    let rr = &r;
    let seen = poll(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async move {
            std::fs::read_to_string(&rr.serial)
                .unwrap_or_default()
                .contains("talos api test node: bootstraps=1 refusals=[]")
                .then_some(())
        },
    )
    .await;
    assert!(
        seen.is_some(),
        "the node saw one bootstrap; {}",
        r.evidence()
    );
    // Health over the VM's network, as the operator asks for it.
    let health = r
        .lab
        .cli(&r.token, &["cluster", "health", "vmlab", "--json"]);
    let h: serde_json::Value = serde_json::from_str(&health).expect("health JSON");
    assert_eq!(h["nodes_up"], 1, "{h}");
    assert_eq!(h["nodes"][0]["talos_version"], TALOS, "{h}");
    assert_eq!(h["etcd"]["members"][0]["hostname"], host, "{h}");
    assert_eq!(h["etcd"]["leader_hostname"], host, "{h}");
    assert_eq!(
        h["etcd"]["quorum_margin"], 0,
        "one member, none may be lost: {h}"
    );
    assert_eq!(h["talos_check"]["passed"], true, "{h}");
    let etcd = h["nodes"][0]["services"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["id"] == "etcd"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (etcd["state"].as_str(), etcd["healthy"].as_bool()),
        (Some("Running"), Some(true)),
        "{h}"
    );

    // The API's timeline tells the same story.
    let timeline = r
        .lab
        .api_get(&r.token, &format!("/machines/{host}/timeline"));
    let tk: Vec<&str> = timeline
        .as_array()
        .expect("timeline")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    for kind in [
        "reinstall.started",
        "reinstall.netboot",
        "boot.script",
        "reinstall.config",
        "config.served",
        "reinstall.talos_api",
        "reinstall.done",
        "machine.state",
    ] {
        assert!(tk.contains(&kind), "timeline has {kind}: {tk:?}");
    }
    eprintln!(
        "{tag}: install script -> config fetched in {:?} s; reinstall started -> done in {:?} s",
        secs_between(&events, "reinstall.config", "config.served"),
        secs_between(&events, "reinstall.started", "reinstall.done"),
    );

    // A power cycle through the BMC, no one-time boot: the VM boots its disk, never the network.
    let rec_mark = r.bmc.records().len();
    let ev_mark = r.last_event_id().await;
    let disk_boots = r.disk_boots();
    let t1 = Instant::now();
    r.lab.cli(&r.token, &["bmc", "power", host, "cycle"]);
    let rr = &r;
    let booted = poll(
        Duration::from_secs(180),
        Duration::from_millis(500),
        || async move { (rr.disk_boots() > disk_boots).then_some(()) },
    )
    .await;
    assert!(booted.is_some(), "no disk boot; {}", r.evidence());
    eprintln!("{tag}: power cycle -> local disk in {:?}", t1.elapsed());
    assert_eq!(r.bmc.resets(rec_mark), vec!["PowerCycle".to_string()]);
    assert_eq!(r.bmc.qemu_starts(rec_mark), vec!["disk".to_string()]);
    let after = r.events(ev_mark).await;
    let net: Vec<&str> = kinds(&after)
        .into_iter()
        .filter(|k| !k.starts_with("bmc."))
        .collect();
    assert!(net.is_empty(), "a disk boot touches no front door: {net:?}");

    // A forced network boot: one-time PXE and a cycle; Plinth answers "boot from local disk",
    // iPXE exits to the BIOS, which boots the disk.
    let rec_mark = r.bmc.records().len();
    let ev_mark = r.last_event_id().await;
    let disk_boots = r.disk_boots();
    let t2 = Instant::now();
    r.lab.cli(&r.token, &["bmc", "boot-once", host, "pxe"]);
    r.lab.cli(&r.token, &["bmc", "power", host, "cycle"]);
    let rr = &r;
    let seen = poll(
        Duration::from_secs(300),
        Duration::from_secs(1),
        || async move {
            let ev = rr.events(ev_mark).await;
            let script = ev.iter().any(|e| e.kind == "boot.script");
            (script && rr.disk_boots() > disk_boots).then_some(ev)
        },
    )
    .await;
    let after = seen.unwrap_or_else(|| panic!("no local-disk boot script; {}", r.evidence()));
    eprintln!(
        "{tag}: forced network boot -> local disk in {:?}",
        t2.elapsed()
    );
    assert_eq!(
        r.bmc.boot_overrides(rec_mark),
        vec![("Pxe".to_string(), "Once".to_string())]
    );
    assert_eq!(r.bmc.qemu_starts(rec_mark), vec!["network".to_string()]);
    let scripts: Vec<&Event> = after.iter().filter(|e| e.kind == "boot.script").collect();
    assert!(
        scripts.iter().all(|e| e.detail["plan"] == "local-disk"),
        "{scripts:?}"
    );
    let ak = kinds(&after);
    assert!(
        !ak.iter().any(|k| k.starts_with("config.")),
        "no config fetch: {ak:?}"
    );
    assert_eq!(r.machine().await.state, LifecycleState::Installed);
    assert_eq!(
        r.reinstall().await.map(|x| x.stage),
        Some(Stage::Done),
        "the finished reinstall stays done"
    );
    eprintln!("{tag}: whole run {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_that_never_fetches_its_config_fails_and_is_retried_automatically() {
    let t0 = Instant::now();
    let r = rig(
        "rf",
        "vm-noconfig",
        "52:54:00:88:02:02",
        "7d2e4b1a-3c5f-4e6d-8a9b-0c1d2e3f4a02",
        &format!(
            "[workflows]\ntick_seconds = 1\npower_seconds = 120\nnetboot_seconds = 300\n\
             config_seconds = {CONFIG_DEADLINE_SECS}\ntalos_api_seconds = 120\n"
        ),
        InventoryExtras {
            kernel_args: &["plinth.standin=no-config"],
            cluster: "reinstall:\n  auto: true\n  maxAttempts: 2\n  backoffSeconds: 1\n",
            ..Default::default()
        },
    )
    .await;
    let (tag, host) = (r.tag, r.host);
    r.lab.cli(&r.token, &["machine", "reinstall", host]);

    // One manual attempt and two automatic ones, each missing the config deadline.
    let rr = &r;
    let last = poll(
        Duration::from_secs(1200),
        Duration::from_secs(1),
        || async move {
            rr.reinstall()
                .await
                .filter(|x| x.automatic && x.attempt >= 2 && x.stage == Stage::Failed)
        },
    )
    .await;
    let evidence = r.evidence();
    let now = r.reinstall().await;
    let last = last.unwrap_or_else(|| {
        panic!(
            "no second automatic attempt failed in {:?} (now: {now:?}); {evidence}",
            t0.elapsed()
        )
    });
    eprintln!("{tag}: the last attempt failed after {:?}", t0.elapsed());
    let failed_at = r.last_event_id().await;

    // Left failed for a human: no further attempt starts (a few ticks and the back-off later).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let later = r.events(failed_at).await;
    assert!(
        !kinds(&later).contains(&"reinstall.started"),
        "maxAttempts is 2: {:?}",
        kinds(&later)
    );
    let ri = r.reinstall().await.expect("reinstall");
    assert_eq!(ri, last, "the last attempt is still the last");
    let m = r.machine().await;
    assert_eq!(m.state, LifecycleState::Failed);
    let reason = m.state_reason.clone().unwrap_or_default();
    let missed = format!("stage config missed its deadline of {CONFIG_DEADLINE_SECS} s");
    assert!(reason.contains(&missed), "{reason}");

    let events = r.events(0).await;
    let k = kinds(&events);
    let started: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == "reinstall.started")
        .collect();
    let failed: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == "reinstall.failed")
        .collect();
    assert_eq!(started.len(), 3, "one manual, two automatic: {k:?}");
    assert_eq!(failed.len(), 3, "{k:?}");
    assert_ne!(started[0].actor, "plinth");
    assert_eq!(started[0].detail["automatic"], false);
    for (i, s) in started[1..].iter().enumerate() {
        assert_eq!(s.actor, "plinth", "{s:?}");
        assert_eq!(s.detail["automatic"], true, "{s:?}");
        assert_eq!(s.detail["attempt"], i + 1, "{s:?}");
    }
    for (i, f) in failed.iter().enumerate() {
        assert_eq!(f.detail["stage"], "config", "{f:?}");
        assert!(
            f.detail["error"].as_str().unwrap_or("").contains(&missed),
            "{f:?}"
        );
        // Each failure precedes the next attempt, which starts only after it.
        assert!(f.id > started[i].id);
        if let Some(next) = started.get(i + 1) {
            assert!(next.id > f.id);
        }
    }
    // Every attempt got the VM to its installer (netboot passed) and no attempt got a config.
    assert_eq!(
        k.iter().filter(|k| **k == "reinstall.config").count(),
        3,
        "{k:?}"
    );
    assert!(!k.contains(&"config.served"), "{k:?}");
    let machine_failed = events
        .iter()
        .filter(|e| e.kind == "machine.state" && e.detail["to"] == "failed")
        .count();
    assert!(machine_failed >= 3, "failed three times: {k:?}");

    // Through the BMC each time: one-time PXE, then On (the VM was off) or a power cycle.
    let pxe_once = ("Pxe".to_string(), "Once".to_string());
    assert_eq!(
        r.bmc.boot_overrides(0),
        vec![pxe_once.clone(), pxe_once.clone(), pxe_once]
    );
    assert_eq!(r.bmc.resets(0), ["On", "PowerCycle", "PowerCycle"]);
    assert_eq!(r.bmc.qemu_starts(0), ["network", "network", "network"]);
    // The VM got as far as the fetch and skipped it, as injected.
    let reports = all_reports(&r.report);
    assert!(
        reports
            .iter()
            .any(|f| f.get("status").map(String::as_str) == Some("skipped")),
        "{reports:?}"
    );
    assert!(
        reports
            .iter()
            .all(|f| f.get("status").map(String::as_str) == Some("skipped")),
        "{reports:?}"
    );
    eprintln!(
        "{tag}: {} skip reports from the VM; whole run {:?}",
        reports.len(),
        t0.elapsed()
    );
}

/// A reinstall of a machine whose profile says `bootTarget: http`: Plinth sets a one-time
/// `UefiHttp` boot through the BMC and powers the VM on; OVMF takes its HTTP boot option (its PXE
/// off, Plinth's TFTP off), fetches `ipxe.efi` from Plinth by URL, and the install runs to `done`
/// as with PXE: install script, image, config from the leased address, Talos API verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_reinstalls_by_uefi_http_boot_through_its_bmc() {
    let t0 = Instant::now();
    let r = rig_with(
        "rh",
        "vm-reinstall-http",
        "52:54:00:88:02:03",
        "7d2e4b1a-3c5f-4e6d-8a9b-0c1d2e3f4a03",
        "[workflows]\ntick_seconds = 1\npower_seconds = 120\nnetboot_seconds = 400\n\
         config_seconds = 400\ntalos_api_seconds = 300\n",
        InventoryExtras {
            kernel_args: &["plinth.standin=talos"],
            // The stand-in's worker gets its certificate from a control plane: this is one.
            role: Some("control-plane"),
            ..Default::default()
        },
        Netboot::UefiHttp,
    )
    .await;
    let (tag, host) = (r.tag, r.host);
    let started = r.lab.cli(&r.token, &["machine", "reinstall", host]);
    assert!(
        started.contains("one-time http boot"),
        "the CLI says which boot Plinth sets: {started}"
    );
    let rr = &r;
    let ended = poll(
        Duration::from_secs(600),
        Duration::from_secs(1),
        || async move { rr.reinstall().await.filter(|x| !x.stage.is_active()) },
    )
    .await;
    let evidence = r.evidence();
    let now = r.reinstall().await;
    let ri = ended.unwrap_or_else(|| {
        panic!(
            "the reinstall did not end in {:?} (now: {now:?}); {evidence}",
            t0.elapsed()
        )
    });
    eprintln!(
        "{tag}: reinstall ended {:?} after {:?}",
        ri.stage,
        t0.elapsed()
    );
    assert_eq!(ri.stage, Stage::Done, "{ri:?}; {evidence}");
    assert_eq!(r.machine().await.state, LifecycleState::Installed);

    // Through the BMC: a one-time UefiHttp boot, then On; the VM started with HTTP boot as its
    // only network boot.
    let recs = r.bmc.records();
    assert_eq!(
        r.bmc.boot_overrides(0),
        vec![("UefiHttp".to_string(), "Once".to_string())],
        "{recs:?}"
    );
    assert_eq!(r.bmc.resets(0), vec!["On".to_string()], "{recs:?}");
    assert_eq!(r.bmc.qemu_starts(0), vec!["http".to_string()]);

    // The firmware's HTTP boot, through Plinth only: no TFTP, no PXE.
    let log = std::fs::read_to_string(&r.plog).unwrap_or_default();
    let console = std::fs::read_to_string(&r.serial).unwrap_or_default();
    assert!(
        console.contains(">>Start HTTP Boot over IPv4")
            && console.contains("URI: http://10.88.0.1:8080/ipxe/ipxe.efi"),
        "{evidence}"
    );
    assert!(!console.contains(">>Start PXE over IPv4"), "{evidence}");
    assert!(
        log.contains("client=uefi-http-Amd64 boot_file=\"http://10.88.0.1:8080/ipxe/ipxe.efi\""),
        "{evidence}"
    );
    assert!(
        log.contains("TFTP off") && !log.contains("tftp read"),
        "{evidence}"
    );

    // The stages and the boot steps between them, in order.
    let events = r.events(0).await;
    let k = kinds(&events);
    let once = events
        .iter()
        .find(|e| e.kind == "bmc.boot_once")
        .unwrap_or_else(|| panic!("bmc.boot_once: {k:?}"));
    assert_eq!(once.detail["target"], "http", "{once:?}");
    assert_eq!(once.detail["result"], "ok", "{once:?}");
    assert_eq!(
        once.detail["boot_override"]["target"], "UefiHttp",
        "read back from the BMC: {once:?}"
    );
    let pos = |kind: &str| {
        k.iter()
            .position(|x| *x == kind)
            .unwrap_or_else(|| panic!("{kind} in {k:?}"))
    };
    let ipxe = events
        .iter()
        .position(|e| e.kind == "http.ipxe" && e.detail["file"] == "ipxe.efi")
        .unwrap_or_else(|| panic!("http.ipxe of ipxe.efi in {k:?}"));
    assert!(pos("bmc.boot_once") < pos("bmc.power"), "{k:?}");
    assert!(pos("bmc.power") < ipxe, "{k:?}");
    assert!(ipxe < pos("boot.script"), "{k:?}");
    assert!(pos("boot.script") < pos("config.served"), "{k:?}");
    assert!(pos("config.served") < pos("talos.verified"), "{k:?}");
    assert!(pos("talos.verified") <= pos("reinstall.done"), "{k:?}");
    assert!(!k.iter().any(|x| x.starts_with("tftp.")), "{k:?}");
    eprintln!("{tag}: whole run {:?}", t0.elapsed());
}
