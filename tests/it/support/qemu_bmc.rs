//! A BMC for one qemu VM, speaking enough Redfish for Plinth: the service root, one System
//! (`PowerState`, `Boot` with its override and allowable targets, `ComputerSystem.Reset` with its
//! allowable reset types), its Manager, HTTP basic auth and ETags with `If-Match` on PATCH.
//!
//! Power is qemu itself: `On` starts a qemu process (network first when a one-time PXE or UEFI HTTP
//! boot is pending, which the start consumes; else disk first; for `UefiHttp` with the firmware's
//! PXE off, `vm_lab::http_boot_only_args`, so its HTTP boot option is the network boot it takes), `ForceOff` stops it through QMP (`quit`
//! on its unix socket), `ForceRestart` and `PowerCycle` do both. `PowerState` is whether that
//! process runs, so a guest that powers itself off reads `Off`.
//!
//! The BMC runs in the lab's namespace, where Plinth can reach it and qemu finds its tap: this
//! test binary re-executed there (see [`QemuBmc::start`]), serving until its parent goes away.
//! Every request and every qemu start and stop is recorded as a JSON line for the test.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

use super::vm_lab::{http_boot_only_args, wait_for_line, Lab};

/// Environment variable naming the spec file; it turns the re-executed test binary
/// (`support::reexec`) into the BMC.
pub const BMC_ENV: &str = "PLINTH_QEMU_BMC";

const ROOT: &str = "/redfish/v1";
const SYSTEM: &str = "/redfish/v1/Systems/vm";
const MANAGER: &str = "/redfish/v1/Managers/bmc";
const RESET: &str = "/redfish/v1/Systems/vm/Actions/ComputerSystem.Reset";
const RESET_TYPES: [&str; 4] = ["On", "ForceOff", "ForceRestart", "PowerCycle"];
const BOOT_TARGETS: [&str; 4] = ["None", "Pxe", "UefiHttp", "Hdd"];
const BOOT_ENABLED: [&str; 3] = ["Disabled", "Once", "Continuous"];

/// What the BMC serves and drives.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BmcSpec {
    /// `ip:port` to listen on (in the namespace).
    pub listen: String,
    pub username: String,
    pub password: String,
    /// qemu's program and arguments, without `-boot`, `-qmp` and `-pidfile`.
    pub qemu: Vec<String>,
    /// QMP socket of the running qemu.
    pub qmp: PathBuf,
    /// qemu's pid file (the lab kills what it names on drop).
    pub pidfile: PathBuf,
    /// qemu's stdout and stderr, appended.
    pub qemu_log: PathBuf,
    /// The record: one JSON object a line.
    pub record: PathBuf,
}

/// The test's handle on a running BMC.
pub struct QemuBmc {
    /// Its Redfish URL, as the machine's `bmc.url`.
    pub url: String,
    pub spec: BmcSpec,
}

impl QemuBmc {
    /// Start the BMC in the lab on `listen`, driving `qemu`; waits (bounded) until it listens.
    pub fn start(
        lab: &mut Lab,
        dir: &Path,
        listen: &str,
        qemu: Vec<String>,
        username: &str,
        password: &str,
    ) -> QemuBmc {
        let spec = BmcSpec {
            listen: listen.to_string(),
            username: username.to_string(),
            password: password.to_string(),
            qemu,
            qmp: dir.join("qmp.sock"),
            pidfile: dir.join("qemu.pid"),
            qemu_log: dir.join("qemu.log"),
            record: dir.join("bmc-record.jsonl"),
        };
        let spec_path = dir.join("bmc-spec.json");
        std::fs::write(&spec_path, serde_json::to_vec(&spec).expect("spec")).expect("spec file");
        let exe = std::env::current_exe().expect("test binary");
        let log = dir.join("bmc.log");
        let spec_arg = spec_path.display().to_string();
        lab.spawn_env(
            exe.to_str().expect("utf-8 path"),
            &super::reexec::ARGS.map(String::from),
            &[(BMC_ENV, spec_arg.as_str())],
            &log,
        );
        lab.kill_pidfile_on_drop(&spec.pidfile);
        assert!(
            wait_for_line(&log, "qemu-bmc: listening", Duration::from_secs(30)),
            "the BMC did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        QemuBmc {
            url: format!("http://{listen}"),
            spec,
        }
    }

    /// Everything recorded so far, oldest first.
    pub fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.spec.record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The requests recorded after the first `skip` records: (method, path, body).
    pub fn requests(&self, skip: usize) -> Vec<(String, String, Value)> {
        self.records()
            .into_iter()
            .skip(skip)
            .filter(|r| r.get("method").is_some())
            .map(|r| {
                (
                    r["method"].as_str().unwrap_or_default().to_string(),
                    r["path"].as_str().unwrap_or_default().to_string(),
                    r["body"].clone(),
                )
            })
            .collect()
    }

    /// The reset types POSTed after the first `skip` records, in order.
    pub fn resets(&self, skip: usize) -> Vec<String> {
        self.requests(skip)
            .into_iter()
            .filter(|(m, p, _)| m == "POST" && p == RESET)
            .filter_map(|(_, _, b)| b["ResetType"].as_str().map(str::to_string))
            .collect()
    }

    /// The boot overrides PATCHed after the first `skip` records: (target, enabled).
    pub fn boot_overrides(&self, skip: usize) -> Vec<(String, String)> {
        self.requests(skip)
            .into_iter()
            .filter(|(m, p, _)| m == "PATCH" && p == SYSTEM)
            .map(|(_, _, b)| {
                (
                    b["Boot"]["BootSourceOverrideTarget"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    b["Boot"]["BootSourceOverrideEnabled"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect()
    }

    /// How qemu was started after the first `skip` records: `network` or `disk` first.
    pub fn qemu_starts(&self, skip: usize) -> Vec<String> {
        self.records()
            .into_iter()
            .skip(skip)
            .filter(|r| r["qemu"] == "start")
            .filter_map(|r| r["boot"].as_str().map(str::to_string))
            .collect()
    }
}

/// The BMC side: serve `spec_path`'s BMC until the parent process (the test) goes away.
pub fn main(spec_path: &str) {
    let spec: BmcSpec =
        serde_json::from_slice(&std::fs::read(spec_path).expect("spec")).expect("spec json");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(serve(spec));
}

struct Machine {
    spec: BmcSpec,
    qemu: Option<Child>,
    target: String,
    enabled: String,
    /// ETag of the System: bumped by every change.
    version: u64,
    started: Instant,
    record: std::fs::File,
}

type Shared = Arc<Mutex<Machine>>;

async fn serve(spec: BmcSpec) {
    let record = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.record)
        .expect("record file");
    let listener = tokio::net::TcpListener::bind(&spec.listen)
        .await
        .unwrap_or_else(|e| panic!("qemu-bmc: bind {}: {e}", spec.listen));
    let machine: Shared = Arc::new(Mutex::new(Machine {
        spec: spec.clone(),
        qemu: None,
        target: "None".into(),
        enabled: "Disabled".into(),
        version: 1,
        started: Instant::now(),
        record,
    }));
    // Stop with the test: when the parent is gone, so is qemu, then this process.
    let parent = std::os::unix::process::parent_id();
    let watched = machine.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if std::os::unix::process::parent_id() != parent {
                let mut m = watched.lock().await;
                if let Some(mut c) = m.qemu.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                std::process::exit(0);
            }
        }
    });
    let app = axum::Router::new().fallback(handle).with_state(machine);
    println!("qemu-bmc: listening on http://{}", spec.listen);
    axum::serve(listener, app).await.expect("serve");
}

impl Machine {
    fn record(&mut self, mut v: Value) {
        use std::io::Write;
        v["ms"] = json!(self.started.elapsed().as_millis() as u64);
        let _ = writeln!(self.record, "{v}");
        let _ = self.record.flush();
    }

    fn etag(&self) -> String {
        format!("\"{}\"", self.version)
    }

    fn power_state(&mut self) -> &'static str {
        let Some(c) = &mut self.qemu else {
            return "Off";
        };
        match c.try_wait() {
            Ok(None) => "On",
            other => {
                let status = format!("{other:?}");
                self.qemu = None;
                self.version += 1;
                self.record(json!({"qemu": "exited", "by": "guest", "status": status}));
                "Off"
            }
        }
    }

    async fn power_on(&mut self) -> Result<(), String> {
        if self.power_state() == "On" {
            return Ok(());
        }
        let pending = self.enabled != "Disabled";
        let http = pending && self.target == "UefiHttp";
        let network = pending && (self.target == "Pxe" || http);
        if self.enabled == "Once" {
            // The one-time override is consumed by this boot.
            self.enabled = "Disabled".into();
            self.target = "None".into();
        }
        let _ = std::fs::remove_file(&self.spec.qmp);
        let _ = std::fs::remove_file(&self.spec.pidfile);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.qemu_log)
            .map_err(|e| format!("qemu log: {e}"))?;
        let mut args: Vec<String> = self.spec.qemu[1..].to_vec();
        if http {
            args.extend(http_boot_only_args());
        }
        args.extend([
            "-boot".into(),
            if network { "order=n" } else { "order=c" }.into(),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", self.spec.qmp.display()),
            "-pidfile".into(),
            self.spec.pidfile.display().to_string(),
        ]);
        let child = Command::new(&self.spec.qemu[0])
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start qemu: {e}"))?;
        let pid = child.id();
        self.qemu = Some(child);
        self.version += 1;
        self.record(json!({"qemu": "start", "boot": match (http, network) {
                (true, _) => "http",
                (false, true) => "network",
                (false, false) => "disk",
            }, "pid": pid}));
        // Up means QMP answers: wait (bounded) for its socket.
        let start = Instant::now();
        while !self.spec.qmp.exists() {
            if self.power_state() == "Off" {
                return Err("qemu exited at start (see qemu.log)".into());
            }
            if start.elapsed() > Duration::from_secs(20) {
                return Err("qemu's QMP socket did not appear".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    async fn power_off(&mut self) {
        if self.power_state() == "Off" {
            return;
        }
        let via =
            match tokio::time::timeout(Duration::from_secs(10), qmp_quit(&self.spec.qmp)).await {
                Ok(Ok(())) => "qmp",
                Ok(Err(e)) => {
                    self.record(json!({"qemu": "qmp-error", "error": e}));
                    "kill"
                }
                Err(_) => "kill",
            };
        let start = Instant::now();
        let mut child = self.qemu.take().expect("running");
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                _ if via == "kill" || start.elapsed() > Duration::from_secs(10) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        self.version += 1;
        self.record(json!({"qemu": "stop", "via": via}));
    }

    fn system(&mut self) -> Value {
        let power = self.power_state();
        json!({
            "@odata.id": SYSTEM,
            "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
            "Id": "vm",
            "Name": "qemu VM",
            "Manufacturer": "Plinth Test",
            "Model": "NetBoot VM",
            "SerialNumber": "VM-SERIAL-1",
            "PowerState": power,
            "Boot": {
                "BootSourceOverrideTarget": self.target,
                "BootSourceOverrideEnabled": self.enabled,
                "BootSourceOverrideMode": if self.spec.qemu.iter().any(|a| a.contains("if=pflash")) { "UEFI" } else { "Legacy" },
                "BootSourceOverrideTarget@Redfish.AllowableValues": BOOT_TARGETS,
            },
            "Actions": {
                "#ComputerSystem.Reset": {
                    "target": RESET,
                    "ResetType@Redfish.AllowableValues": RESET_TYPES,
                }
            },
            "Links": {"ManagedBy": [{"@odata.id": MANAGER}]},
        })
    }
}

/// `quit` through QMP: greeting, `qmp_capabilities`, `quit`.
async fn qmp_quit(path: &Path) -> Result<(), String> {
    let s = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| format!("connect {}: {e}", path.display()))?;
    let (r, mut w) = s.into_split();
    let mut lines = BufReader::new(r).lines();
    let greeting = lines.next_line().await.map_err(|e| e.to_string())?;
    if !greeting.is_some_and(|g| g.contains("QMP")) {
        return Err("no QMP greeting".into());
    }
    for cmd in ["qmp_capabilities", "quit"] {
        w.write_all(format!("{{\"execute\": \"{cmd}\"}}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        // Skip asynchronous events up to the command's answer; after `quit` the socket may
        // simply close.
        loop {
            match lines.next_line().await {
                Ok(Some(l)) if l.contains("\"return\"") => break,
                Ok(Some(l)) if l.contains("\"error\"") => return Err(format!("{cmd}: {l}")),
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) if cmd == "quit" => break,
                Ok(None) => return Err(format!("{cmd}: QMP closed")),
                Err(e) => return Err(format!("{cmd}: {e}")),
            }
        }
    }
    Ok(())
}

fn redfish_error(status: StatusCode, id: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {
            "code": "Base.1.8.GeneralError",
            "message": message,
            "@Message.ExtendedInfo": [{"MessageId": format!("Base.1.8.{id}"), "Message": message}],
        }})),
    )
        .into_response()
}

fn authorized(spec: &BmcSpec, headers: &HeaderMap) -> bool {
    let want = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", spec.username, spec.password));
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .is_some_and(|got| got.trim() == want)
}

async fn handle(
    State(machine): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut m = machine.lock().await;
    let path = match uri.path().trim_end_matches('/') {
        "" | "/redfish" => ROOT.to_string(),
        p => p.to_string(),
    };
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return redfish_error(
                    StatusCode::BAD_REQUEST,
                    "MalformedJSON",
                    &format!("the body is not JSON: {e}"),
                )
            }
        }
    };
    let auth = authorized(&m.spec, &headers);
    let if_match = headers
        .get("if-match")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let resp = answer(&mut m, &method, &path, auth, if_match.as_deref(), &body).await;
    m.record(json!({
        "method": method.as_str(),
        "path": path,
        "auth": auth,
        "if_match": if_match,
        "body": body,
        "status": resp.status().as_u16(),
    }));
    resp
}

async fn answer(
    m: &mut Machine,
    method: &Method,
    path: &str,
    auth: bool,
    if_match: Option<&str>,
    body: &Value,
) -> Response {
    // The service root is open (DSP0266 §13.3.1); everything else needs the credentials.
    if path == ROOT && method == Method::GET {
        return axum::Json(json!({
            "@odata.id": "/redfish/v1/",
            "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
            "Id": "RootService",
            "Name": "Plinth test BMC",
            "RedfishVersion": "1.6.0",
            "Vendor": "Plinth Test",
            "Systems": {"@odata.id": "/redfish/v1/Systems"},
            "Managers": {"@odata.id": "/redfish/v1/Managers"},
        }))
        .into_response();
    }
    if !auth {
        let mut r = redfish_error(
            StatusCode::UNAUTHORIZED,
            "InsufficientPrivilege",
            "basic auth required",
        );
        r.headers_mut().insert(
            "www-authenticate",
            HeaderValue::from_static("Basic realm=\"qemu-bmc\""),
        );
        return r;
    }
    match (method.as_str(), path) {
        ("GET", "/redfish/v1/Systems") => axum::Json(json!({
            "@odata.id": "/redfish/v1/Systems",
            "Name": "Computer System Collection",
            "Members": [{"@odata.id": SYSTEM}],
            "Members@odata.count": 1,
        }))
        .into_response(),
        ("GET", "/redfish/v1/Managers") => axum::Json(json!({
            "@odata.id": "/redfish/v1/Managers",
            "Name": "Manager Collection",
            "Members": [{"@odata.id": MANAGER}],
            "Members@odata.count": 1,
        }))
        .into_response(),
        ("GET", MANAGER) => axum::Json(json!({
            "@odata.id": MANAGER,
            "Id": "bmc",
            "Name": "qemu BMC",
            "ManagerType": "BMC",
            "Manufacturer": "Plinth Test",
            "Links": {"ManagerForServers": [{"@odata.id": SYSTEM}]},
        }))
        .into_response(),
        ("GET", SYSTEM) => {
            let doc = m.system();
            let mut r = axum::Json(doc).into_response();
            if let Ok(v) = HeaderValue::from_str(&m.etag()) {
                r.headers_mut().insert("etag", v);
            }
            r
        }
        ("PATCH", SYSTEM) => {
            if let Some(tag) = if_match {
                if tag != "*" && tag != m.etag() {
                    return redfish_error(
                        StatusCode::PRECONDITION_FAILED,
                        "PreconditionFailed",
                        "the ETag does not match",
                    );
                }
            }
            let Some(boot) = body.get("Boot").and_then(Value::as_object) else {
                return redfish_error(
                    StatusCode::BAD_REQUEST,
                    "PropertyMissing",
                    "only Boot can be changed",
                );
            };
            if let Some(k) = body
                .as_object()
                .into_iter()
                .flat_map(|o| o.keys())
                .find(|k| *k != "Boot")
            {
                return redfish_error(
                    StatusCode::BAD_REQUEST,
                    "PropertyNotWritable",
                    &format!("{k} is not writable"),
                );
            }
            let mut target = m.target.clone();
            let mut enabled = m.enabled.clone();
            for (k, v) in boot {
                let v = v.as_str().unwrap_or_default();
                match k.as_str() {
                    "BootSourceOverrideTarget" if BOOT_TARGETS.contains(&v) => {
                        target = v.to_string()
                    }
                    "BootSourceOverrideEnabled" if BOOT_ENABLED.contains(&v) => {
                        enabled = v.to_string()
                    }
                    "BootSourceOverrideMode" if v == "Legacy" => {}
                    _ => {
                        return redfish_error(
                            StatusCode::BAD_REQUEST,
                            "PropertyValueNotInList",
                            &format!("Boot.{k}: `{v}` is not allowed"),
                        )
                    }
                }
            }
            m.target = target;
            m.enabled = enabled;
            m.version += 1;
            StatusCode::NO_CONTENT.into_response()
        }
        ("POST", RESET) => {
            let kind = body.get("ResetType").and_then(Value::as_str).unwrap_or("");
            let result = match kind {
                "On" => m.power_on().await,
                "ForceOff" => {
                    m.power_off().await;
                    Ok(())
                }
                "ForceRestart" | "PowerCycle" => {
                    m.power_off().await;
                    m.power_on().await
                }
                other => {
                    return redfish_error(
                        StatusCode::BAD_REQUEST,
                        "ActionParameterNotSupported",
                        &format!("ResetType `{other}` (allowed: {})", RESET_TYPES.join(", ")),
                    )
                }
            };
            match result {
                Ok(()) => StatusCode::NO_CONTENT.into_response(),
                Err(e) => redfish_error(StatusCode::INTERNAL_SERVER_ERROR, "GeneralError", &e),
            }
        }
        _ => redfish_error(
            StatusCode::NOT_FOUND,
            "ResourceMissingAtURI",
            &format!("{method} {path}"),
        ),
    }
}
