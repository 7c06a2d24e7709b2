//! The BMC API and CLI end to end: a real Plinth server (SQLite or PostgreSQL) whose machines'
//! BMCs are real Redfish peers: `sushy-emulator --fake` with basic auth for power, boot override
//! and virtual media, and `sushy-static` serving the recorded Dell and Supermicro trees for
//! inspection and capability probing. Every test also checks that the BMC password appears in no
//! API answer, no event, no CLI output and no log line (the server's logs are captured).

use crate::support;

use crate::support::bmc_peers as peers;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::routing::get;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::{Ask as _, Backend, TestServer};

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

/// Everything the in-process server logs, for the password checks.
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    let buf = LOGS.get_or_init(|| Mutex::new(Vec::new()));
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_writer(|| LogSink)
            .with_ansi(false)
            .try_init();
    });
    buf
}

struct LogSink;

impl Write for LogSink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        logs()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn assert_never_logged(secret: &str) {
    let text =
        String::from_utf8_lossy(&logs().lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    assert!(text.contains("BMC"), "the log capture works");
    assert!(!text.contains(secret), "the BMC password was logged");
}

/// Every answer a test saw, to check for the password at the end.
#[derive(Default)]
struct Seen(Mutex<Vec<String>>);

impl Seen {
    fn push(&self, s: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s.to_string());
    }
    fn assert_never_contains(&self, secret: &str) {
        for text in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            assert!(!text.contains(secret), "password in an answer: {text}");
        }
    }
}

async fn call(
    s: &TestServer,
    seen: &Seen,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut rb = s.req(method, path, token);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.answer().await;
    let status = r.status;
    let text = r.text;
    seen.push(&text);
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, v)
}

async fn ok(s: &TestServer, seen: &Seen, method: Method, path: &str, body: Option<Value>) -> Value {
    let (st, v) = call(s, seen, method.clone(), path, &s.operator, body).await;
    assert!(st.is_success(), "{method} {path}: {st} {v}");
    v
}

/// `plinth ARGS` against the test server as the operator; returns stdout, asserting success.
async fn cli(s: &TestServer, seen: &Seen, args: &[&str]) -> String {
    let out = tokio::process::Command::new(BIN)
        .args(args)
        .env("PLINTH_SERVER", &s.base)
        .env("PLINTH_TOKEN", &s.operator)
        .env_remove("PLINTH_BMC_PASSWORD")
        .output()
        .await
        .expect("run plinth");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    seen.push(&stdout);
    seen.push(&stderr);
    assert!(
        out.status.success(),
        "plinth {args:?} failed: {stderr}\n{stdout}"
    );
    stdout
}

/// Wait (bounded) for the capability record the server probes after registration.
async fn wait_capabilities(s: &TestServer, seen: &Seen, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (st, v) = call(
            s,
            seen,
            Method::GET,
            &format!("/api/v1/machines/{id}/bmc/capabilities"),
            &s.viewer,
            None,
        )
        .await;
        if st == StatusCode::OK {
            return v;
        }
        assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
        assert!(
            Instant::now() < deadline,
            "no capability record within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn events(s: &TestServer, seen: &Seen, machine: &str) -> Vec<Value> {
    let (st, v) = call(
        s,
        seen,
        Method::GET,
        &format!("/api/v1/events?machine={machine}&limit=1000"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    v.as_array().cloned().expect("events")
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Serve a small "ISO" on 127.0.0.1:0 and count the downloads.
async fn image_server() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let image: &'static [u8] = Box::leak(vec![0x42u8; 64 * 1024].into_boxed_slice());
    let app = axum::Router::new().route(
        "/{name}",
        get(move || {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                image
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind image server");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), hits, task)
}

const EMU_USER: &str = "admin";
const EMU_PASSWORD: &str = "emu-Pa55-never-shown";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn emulator_power_boot_media_through_api_and_cli() {
    logs();
    let seen = Seen::default();
    let emu = peers::sushy_emulator(peers::EmulatorSetup {
        auth: Some((EMU_USER.into(), EMU_PASSWORD.into())),
        tls: false,
    });
    let s = TestServer::start(Backend::Sqlite).await;
    let m = ok(
        &s,
        &seen,
        Method::POST,
        "/api/v1/machines",
        Some(json!({"hostname": "emu-1", "bmc": {
            "url": emu.peer.url(), "username": EMU_USER, "password": EMU_PASSWORD,
            "tls": "insecure-http"}})),
    )
    .await;
    let id = m["id"].as_str().expect("id").to_string();

    // Probed in the background after registration.
    let caps = wait_capabilities(&s, &seen, &id).await;
    assert!(caps["last_error"].is_null(), "{caps}");
    assert_eq!(caps["bmc_url"], emu.peer.url());
    let resets: Vec<&str> = caps["capabilities"]["reset_types"]
        .as_array()
        .expect("reset types")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        resets.contains(&"On") && resets.contains(&"ForceOff"),
        "{resets:?}"
    );
    assert!(caps["probed_at"].is_string());

    // Viewers read, operators act.
    let (st, _) = call(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/power"),
        &s.viewer,
        Some(json!({"action": "on"})),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, v) = call(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/power"),
        &s.operator,
        Some(json!({"action": "sideways"})),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");

    // Power on through the API (the fake driver turns on 1..11 s later; the answer waits).
    let r = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/power"),
        Some(json!({"action": "on"})),
    )
    .await;
    assert_eq!(r["power_state"], "on", "{r}");
    assert_eq!(r["action"], "on");
    let (st, r) = call(
        &s,
        &seen,
        Method::GET,
        &format!("/api/v1/machines/{id}/power"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(r["power_state"], "on");

    // Off and status through the CLI, by host name.
    let out = cli(&s, &seen, &["bmc", "power", "emu-1", "off", "--json"]).await;
    let r: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(r["power_state"], "off", "{out}");
    let out = cli(&s, &seen, &["bmc", "power", "emu-1", "status"]).await;
    assert!(out.contains("off"), "{out}");

    // Cycle through the API from on, and through the CLI.
    ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/power"),
        Some(json!({"action": "on"})),
    )
    .await;
    let r = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/power"),
        Some(json!({"action": "cycle"})),
    )
    .await;
    assert_eq!(r["power_state"], "on", "{r}");
    let out = cli(&s, &seen, &["bmc", "power", "emu-1", "cycle"]).await;
    assert!(out.contains("cycle") && out.contains("on"), "{out}");

    // Boot once, read back.
    let r = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/boot-once"),
        Some(json!({"target": "pxe", "mode": "uefi"})),
    )
    .await;
    assert_eq!(r["boot_override"]["target"], "Pxe", "{r}");
    // The emulator keeps overrides Continuous (its quirk row says so).
    assert_eq!(r["boot_override"]["enabled"], "Continuous");
    assert_eq!(r["boot_override"]["mode"], "UEFI");
    // UefiHttp without an HttpBootUri: the emulator quietly stores Pxe; the answer says so.
    let (st, v) = call(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/boot-once"),
        &s.operator,
        Some(json!({"target": "http"})),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "boot_not_applied");
    assert_eq!(v["error"]["bmc"]["wanted"]["target"], "UefiHttp", "{v}");
    assert_eq!(v["error"]["bmc"]["actual"]["target"], "Pxe", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("the BMC holds target Pxe")),
        "{v}"
    );
    let out = cli(
        &s,
        &seen,
        &[
            "bmc",
            "boot-once",
            "emu-1",
            "cd",
            "--mode",
            "uefi",
            "--json",
        ],
    )
    .await;
    let r: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(r["boot_override"]["target"], "Cd", "{out}");

    // Virtual media with an image this test serves.
    let (images, _hits, server) = image_server().await;
    let image = format!("{images}/talos.iso");
    let r = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/media"),
        Some(json!({"image": image})),
    )
    .await;
    assert_eq!(r["media"]["inserted"], true, "{r}");
    assert_eq!(r["media"]["image"], image);
    let out = cli(&s, &seen, &["bmc", "media", "emu-1", "status"]).await;
    assert!(out.contains("talos.iso"), "{out}");
    let out = cli(&s, &seen, &["bmc", "media", "emu-1", "eject", "--json"]).await;
    let r: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(r["media"]["inserted"], false, "{out}");
    let r = ok(
        &s,
        &seen,
        Method::DELETE,
        &format!("/api/v1/machines/{id}/media"),
        None,
    )
    .await;
    assert_eq!(r["media"]["inserted"], false);
    let (st, v) = call(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/media"),
        &s.operator,
        Some(json!({"image": "file:///etc/passwd"})),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    server.abort();

    // Capabilities through the CLI, refreshed.
    let out = cli(&s, &seen, &["bmc", "capabilities", "emu-1", "--refresh"]).await;
    assert!(out.contains("reset types"), "{out}");

    // Every action is an event with its actor and result.
    let ev = events(&s, &seen, &id).await;
    let k = kinds(&ev);
    for want in [
        "bmc.probe",
        "bmc.power",
        "bmc.boot_once",
        "bmc.media.insert",
        "bmc.media.eject",
    ] {
        assert!(k.iter().any(|x| x == want), "{want} missing from {k:?}");
    }
    let power: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "bmc.power").collect();
    assert_eq!(power.len(), 5, "on, off, on, cycle, cycle");
    for e in &power {
        assert_eq!(e["actor"], "token:test-operator");
        assert_eq!(e["detail"]["result"], "ok", "{e}");
    }
    assert_eq!(power[1]["detail"]["action"], "off");
    let refused = ev
        .iter()
        .find(|e| e["kind"] == "bmc.boot_once" && e["detail"]["result"] == "failed")
        .expect("the refused boot override is an event");
    assert_eq!(refused["detail"]["actual"]["target"], "Pxe", "{refused}");

    // A wrong password is the BMC refusing, said as such; the record of it holds no password.
    let (st, v) = call(
        &s,
        &seen,
        Method::PATCH,
        &format!("/api/v1/machines/{id}"),
        &s.operator,
        Some(json!({"version": m["version"], "bmc": {"password": "wrong-Password-9"}})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = call(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/power"),
        &s.operator,
        Some(json!({"action": "on"})),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_GATEWAY, "{v}");
    assert_eq!(v["error"]["code"], "bmc_unauthorized", "{v}");
    let ev = events(&s, &seen, &id).await;
    let last = ev.last().expect("an event");
    assert_eq!(last["kind"], "bmc.power");
    assert_eq!(last["detail"]["result"], "failed");

    seen.assert_never_contains(EMU_PASSWORD);
    seen.assert_never_contains("wrong-Password-9");
    assert_never_logged(EMU_PASSWORD);
    assert_never_logged("wrong-Password-9");
    s.finish().await;
}

const MOCK_PASSWORD: &str = "calvin-Mock-Secret";

async fn register_mockup(
    s: &TestServer,
    seen: &Seen,
    host: &str,
    peer: &peers::Peer,
    extra: Value,
) -> String {
    let mut body = json!({"hostname": host, "bmc": {
        "url": peer.url(), "username": "root", "password": MOCK_PASSWORD,
        "tls": "insecure-http"}});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    let m = ok(s, seen, Method::POST, "/api/v1/machines", Some(body)).await;
    m["id"].as_str().expect("id").to_string()
}

async fn inspect_fills_an_empty_machine(b: Backend) {
    logs();
    let seen = Seen::default();
    let peer = peers::sushy_static("dell");
    let s = TestServer::start(b).await;
    let id = register_mockup(&s, &seen, "dell-1", &peer, json!({})).await;

    let r = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/inspect"),
        None,
    )
    .await;
    assert_eq!(r["conflicts"], json!([]), "{r}");
    assert_eq!(r["version"], 2, "one versioned change");
    let fields: Vec<&str> = r["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    for f in [
        "smbios_uuid",
        "serial",
        "manufacturer",
        "model",
        "interfaces[4]",
        "disks[2]",
    ] {
        assert!(fields.contains(&f), "{f} not in {fields:?}");
    }
    assert_eq!(r["hardware"]["bios_version"], "1.8.2");

    let (_, m) = call(
        &s,
        &seen,
        Method::GET,
        &format!("/api/v1/machines/{id}"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(m["serial"], "CNIVC0014M0388");
    assert_eq!(m["smbios_uuid"], "4c4c4544-0035-3410-8050-c6c04f314733");
    assert_eq!(m["manufacturer"], "Dell Inc.");
    assert_eq!(m["model"], "PowerEdge R750");
    let mut macs: Vec<&str> = m["interfaces"]
        .as_array()
        .expect("nics")
        .iter()
        .filter_map(|n| n["mac"].as_str())
        .collect();
    macs.sort_unstable();
    assert_eq!(
        macs,
        [
            "70:b5:e8:f0:52:dc",
            "70:b5:e8:f0:52:dd",
            "b8:3f:d2:90:97:c4",
            "e4:3d:1a:13:27:f0",
            "e4:3d:1a:13:27:f1"
        ]
    );
    let disks = m["disks"].as_array().expect("disks");
    assert_eq!(disks.len(), 3);
    for d in disks {
        assert_eq!(d["model"], "Dell Ent NVMe CM6 RI 1.92TB");
        assert_eq!(d["size_bytes"], 1_920_383_410_176_u64);
        assert_eq!(d["type"], "nvme");
    }
    assert_eq!(
        m["bmc"]["has_password"], true,
        "the password survives the update"
    );

    // Again: nothing new, nothing changes.
    let r = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/inspect"),
        None,
    )
    .await;
    assert_eq!(r["changes"], json!([]), "{r}");
    assert_eq!(r["version"], 2);

    // The capability record, probed on demand, stored and read back.
    let probed = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/bmc/probe"),
        None,
    )
    .await;
    let c = &probed["capabilities"];
    assert_eq!(c["vendor"], "Dell", "{probed}");
    assert_eq!(c["quirks"], "dell-idrac");
    assert_eq!(c["redfish_version"], "1.13.1");
    assert_eq!(c["sessions"], true);
    assert_eq!(c["virtual_media"], "system");
    assert_eq!(c["reset_types"].as_array().map(Vec::len), Some(8));
    assert_eq!(c["etag"]["offered"], false);
    let (st, stored) = call(
        &s,
        &seen,
        Method::GET,
        &format!("/api/v1/machines/{id}/bmc/capabilities"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(stored["capabilities"], probed["capabilities"]);
    assert_eq!(stored["stale"], false);

    let ev = events(&s, &seen, &id).await;
    let k = kinds(&ev);
    assert_eq!(k.iter().filter(|x| *x == "bmc.inspect").count(), 2, "{k:?}");
    assert_eq!(
        k.iter().filter(|x| *x == "machine.updated").count(),
        1,
        "{k:?}"
    );
    assert!(k.iter().any(|x| x == "bmc.probe"));
    let text = serde_json::to_string(&ev).expect("json");
    assert!(!text.contains(MOCK_PASSWORD));
    seen.assert_never_contains(MOCK_PASSWORD);
    assert_never_logged(MOCK_PASSWORD);
    s.finish().await;
}

async fn inspect_reports_conflicts(b: Backend) {
    logs();
    let seen = Seen::default();
    let peer = peers::sushy_static("supermicro");
    let s = TestServer::start(b).await;
    // Another machine already owns one of the Supermicro's NICs.
    let other = ok(
        &s,
        &seen,
        Method::POST,
        "/api/v1/machines",
        Some(json!({"hostname": "other", "interfaces": [{"mac": "7c:c2:55:79:3f:8f"}]})),
    )
    .await;
    // A tech registered the box with another serial.
    let id = register_mockup(
        &s,
        &seen,
        "smc-1",
        &peer,
        json!({"serial": "TECH-SERIAL-1"}),
    )
    .await;

    let r = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/inspect"),
        None,
    )
    .await;
    let conflicts = r["conflicts"].as_array().expect("conflicts");
    assert_eq!(conflicts.len(), 2, "{r}");
    let serial = conflicts
        .iter()
        .find(|c| c["field"] == "serial")
        .expect("serial conflict");
    assert_eq!(serial["registered"], "TECH-SERIAL-1");
    assert_eq!(serial["found"], "S889914X3710910");
    let nic = conflicts
        .iter()
        .find(|c| c["field"] == "interfaces")
        .expect("NIC conflict");
    assert_eq!(nic["found"], "7c:c2:55:79:3f:8f");
    assert_eq!(nic["owner"]["id"], other["id"]);
    assert_eq!(nic["owner"]["name"], "other");

    let (_, m) = call(
        &s,
        &seen,
        Method::GET,
        &format!("/api/v1/machines/{id}"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(m["serial"], "TECH-SERIAL-1", "not overwritten");
    assert_eq!(m["manufacturer"], "Supermicro", "empty fields are filled");
    assert_eq!(m["model"], "SYS-821GE-TNHR");
    let nics = m["interfaces"].as_array().expect("nics");
    assert_eq!(nics.len(), 10, "11 host NICs less the one of `other`");
    assert!(nics
        .iter()
        .all(|n| n["mac"] != "7c:c2:55:79:3f:8f" && n["mac"] != "be:3a:f2:b6:05:9f"));
    assert_eq!(m["disks"].as_array().map(Vec::len), Some(8));
    let (_, o) = call(
        &s,
        &seen,
        Method::GET,
        "/api/v1/machines/other",
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(o["version"], 1, "the other machine is untouched");

    // The CLI shows the conflicts (nothing left to change).
    let out = cli(&s, &seen, &["machine", "inspect", "smc-1"]).await;
    assert!(out.contains("CONFLICT"), "{out}");
    assert!(
        out.contains("TECH-SERIAL-1") && out.contains("S889914X3710910"),
        "{out}"
    );
    assert!(out.contains("other ("), "{out}");
    assert!(out.contains("0 change(s), 2 conflict(s)"), "{out}");

    let ev = events(&s, &seen, &id).await;
    let inspections: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "bmc.inspect").collect();
    assert_eq!(inspections.len(), 2);
    assert_eq!(
        inspections[0]["detail"]["conflicts"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );

    // The probe at registration found the Supermicro.
    let caps = wait_capabilities(&s, &seen, &id).await;
    assert_eq!(caps["capabilities"]["vendor"], "Supermicro", "{caps}");
    seen.assert_never_contains(MOCK_PASSWORD);
    assert_never_logged(MOCK_PASSWORD);
    s.finish().await;
}

/// An AMI MegaRAC (DGX) that lists `BootSourceOverrideMode` as `null` (the recorded Supermicro HGX
/// tree with that one change, served by a BMC that keeps what a PATCH writes): the capability
/// record says the mode is not settable, and boot-once agrees, through the API and the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn null_boot_mode_capabilities_and_boot_once_agree() {
    logs();
    let seen = Seen::default();
    let mut tree = peers::mockup_tree("supermicro");
    tree.get_mut("/redfish/v1/Systems/1").expect("system")["Boot"]["BootSourceOverrideMode"] =
        Value::Null;
    let fake = peers::RecordedBmc::serve(tree).await;
    let s = TestServer::start(Backend::Sqlite).await;
    let m = ok(
        &s,
        &seen,
        Method::POST,
        "/api/v1/machines",
        Some(json!({"hostname": "dgx-1", "bmc": {
            "url": fake.url(), "username": "root", "password": MOCK_PASSWORD,
            "tls": "insecure-http"}})),
    )
    .await;
    let id = m["id"].as_str().expect("id").to_string();

    let caps = wait_capabilities(&s, &seen, &id).await;
    assert!(caps["last_error"].is_null(), "{caps}");
    assert_eq!(caps["capabilities"]["boot_mode_settable"], false, "{caps}");
    let out = cli(&s, &seen, &["bmc", "capabilities", "dgx-1"]).await;
    let line = out
        .lines()
        .find(|l| l.contains("boot mode settable"))
        .expect("boot mode line");
    assert!(line.contains("false"), "{out}");

    // Without a mode: works, read back, and no mode is sent.
    let r = ok(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/boot-once"),
        Some(json!({"target": "pxe"})),
    )
    .await;
    assert_eq!(r["boot_override"]["target"], "Pxe", "{r}");
    assert_eq!(r["boot_override"]["enabled"], "Once", "{r}");
    assert!(r["boot_override"]["mode"].is_null(), "{r}");

    // With a mode: the refusal the capability record predicted, through the API and the CLI.
    let (st, v) = call(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/boot-once"),
        &s.operator,
        Some(json!({"target": "pxe", "mode": "uefi"})),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(v["error"]["code"], "bmc_not_supported", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("BootSourceOverrideMode") && message.contains("boot_mode_settable: false"),
        "{v}"
    );
    let out = tokio::process::Command::new(BIN)
        .args(["bmc", "boot-once", "dgx-1", "pxe", "--mode", "uefi"])
        .env("PLINTH_SERVER", &s.base)
        .env("PLINTH_TOKEN", &s.operator)
        .output()
        .await
        .expect("run plinth");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    seen.push(&stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("BootSourceOverrideMode"), "{stderr}");

    let patches: Vec<Value> = fake
        .received()
        .iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| serde_json::from_str(&r.body).expect("json"))
        .collect();
    assert_eq!(
        patches,
        [json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}})],
        "one PATCH, without a mode; the refused request wrote nothing"
    );
    seen.assert_never_contains(MOCK_PASSWORD);
    assert_never_logged(MOCK_PASSWORD);
    s.finish().await;
}

async fn unreachable_bmc_is_recorded_not_fatal(b: Backend) {
    logs();
    let seen = Seen::default();
    let s = TestServer::start(b).await;
    let port = peers::free_port();
    let id = ok(
        &s,
        &seen,
        Method::POST,
        "/api/v1/machines",
        Some(json!({"hostname": "gone-1", "bmc": {
            "url": format!("http://127.0.0.1:{port}"), "username": "root", "password": MOCK_PASSWORD,
            "tls": "insecure-http"}})),
    )
    .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    // Registration stood; the failed probe is on record.
    let caps = wait_capabilities(&s, &seen, &id).await;
    assert!(caps["capabilities"].is_null(), "{caps}");
    assert!(
        caps["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot talk to the BMC")),
        "{caps}"
    );

    let (st, v) = call(
        &s,
        &seen,
        Method::GET,
        &format!("/api/v1/machines/{id}/power"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::BAD_GATEWAY, "{v}");
    assert_eq!(v["error"]["code"], "bmc_unreachable");
    let (st, v) = call(
        &s,
        &seen,
        Method::POST,
        &format!("/api/v1/machines/{id}/bmc/probe"),
        &s.operator,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::BAD_GATEWAY, "{v}");

    // The API description names the BMC endpoints.
    let (st, doc) = call(
        &s,
        &seen,
        Method::GET,
        "/api/v1/openapi.json",
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    for path in [
        "power",
        "boot-once",
        "media",
        "inspect",
        "bmc/capabilities",
        "bmc/probe",
    ] {
        assert!(
            doc["paths"]
                .get(format!("/api/v1/machines/{{id}}/{path}"))
                .is_some(),
            "{path}"
        );
    }

    // A machine without a BMC.
    ok(
        &s,
        &seen,
        Method::POST,
        "/api/v1/machines",
        Some(json!({"hostname": "plain-1"})),
    )
    .await;
    let (st, v) = call(
        &s,
        &seen,
        Method::POST,
        "/api/v1/machines/plain-1/inspect",
        &s.operator,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "no_bmc");

    let ev = events(&s, &seen, &id).await;
    let probes: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "bmc.probe").collect();
    assert_eq!(probes.len(), 2, "{ev:?}");
    assert!(probes.iter().all(|e| e["detail"]["result"] == "failed"));
    seen.assert_never_contains(MOCK_PASSWORD);
    assert_never_logged(MOCK_PASSWORD);
    s.finish().await;
}

both_backends!(
    inspect_fills_an_empty_machine,
    inspect_reports_conflicts,
    unreachable_bmc_is_recorded_not_fatal
);
