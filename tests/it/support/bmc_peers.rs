//! Real Redfish peers for the BMC tests: `sushy-static` serving the recorded vendor trees and
//! `sushy-emulator --fake`, each a child process on a free 127.0.0.1 port, killed by PID on drop.
//!
//! The peers come from the venv that `tests/peers/redfish-venv.sh` builds, found through
//! `PLINTH_REDFISH_VENV` (default `<crate>/target/redfish-venv`). A missing venv fails the test
//! with the command to run; it never skips.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The venv holding sushy-tools.
pub fn venv() -> PathBuf {
    let dir = std::env::var_os("PLINTH_REDFISH_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/redfish-venv"));
    for tool in ["sushy-static", "sushy-emulator", "python"] {
        let p = dir.join("bin").join(tool);
        assert!(
            p.exists(),
            "Redfish peer `{}` is missing. Create the venv first:\n    \
             PLINTH_REDFISH_VENV={} tests/peers/redfish-venv.sh",
            p.display(),
            dir.display()
        );
    }
    dir
}

/// The shared reference data (`support::shared`), checked to hold the Redfish mockups.
pub fn shared() -> PathBuf {
    let dir = super::shared();
    assert!(
        dir.join("redfish-mockups").is_dir(),
        "shared reference data not found at {} (set PLINTH_SHARED)",
        dir.display()
    );
    dir
}

/// A port that was free a moment ago (for peers that take a port number, not a socket).
pub use super::free_port;

/// A child process killed (by its PID) when dropped.
pub struct Peer {
    child: Child,
    pub addr: SocketAddr,
    pub scheme: &'static str,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Peer {
    /// `scheme://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    fn start(mut cmd: Command, scheme: &'static str, port: u16, dir: tempfile::TempDir) -> Peer {
        let log = dir.path().join("peer.log");
        let out = std::fs::File::create(&log).expect("peer log");
        let err = out.try_clone().expect("peer log");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .env("TMPDIR", dir.path());
        let child = cmd.spawn().expect("spawn Redfish peer");
        let mut peer = Peer {
            child,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            scheme,
            log,
            _dir: dir,
        };
        peer.wait_ready();
        peer
    }

    /// Wait (bounded) until the peer answers TCP; fail with its log if it died.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "Redfish peer exited with {status} before answering:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Redfish peer did not listen on {} within 30 s:\n{}",
                self.addr,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The peer's output so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sushy-static` serving `shared/redfish-mockups/<vendor>/redfish/v1`.
pub fn sushy_static(vendor: &str) -> Peer {
    let venv = venv();
    let tree = shared()
        .join("redfish-mockups")
        .join(vendor)
        .join("redfish/v1");
    assert!(tree.is_dir(), "no mockup tree at {}", tree.display());
    let port = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new(venv.join("bin/sushy-static"));
    cmd.arg("-i")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .arg("-m")
        .arg(&tree);
    Peer::start(cmd, "http", port, dir)
}

/// TLS material for a peer: a fresh self-signed certificate and its SHA-256 fingerprint.
pub struct SelfSigned {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub fingerprint: String,
}

/// Make a self-signed certificate for 127.0.0.1 with `openssl`.
pub fn self_signed(dir: &Path) -> SelfSigned {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let st = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=bmc.test",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(st.success(), "openssl req failed");
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(&cert)
        .output()
        .expect("run openssl x509");
    let text = String::from_utf8_lossy(&out.stdout);
    let fingerprint = text
        .trim()
        .split_once('=')
        .map(|(_, fp)| fp.to_string())
        .expect("openssl fingerprint output");
    SelfSigned {
        cert,
        key,
        fingerprint,
    }
}

/// How to start `sushy-emulator --fake`.
pub struct EmulatorSetup {
    /// Basic-auth user and password (an htpasswd file with a bcrypt entry).
    pub auth: Option<(String, String)>,
    /// Serve HTTPS with this certificate.
    pub tls: bool,
}

/// A running emulator and, with TLS, its certificate fingerprint.
pub struct Emulator {
    pub peer: Peer,
    pub fingerprint: Option<String>,
}

/// `sushy-emulator --fake` with its own state directory, an htpasswd file, and optionally TLS.
pub fn sushy_emulator(setup: EmulatorSetup) -> Emulator {
    let venv = venv();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    let mut config = format!(
        "SUSHY_EMULATOR_STATE_DIR = {state:?}\n\
         SUSHY_EMULATOR_FAKE_SYSTEMS = [{{\n\
         \x20   'uuid': '27946b59-9e44-4fa7-8e91-f3527a1ef094',\n\
         \x20   'name': 'fake',\n\
         \x20   'power_state': 'Off',\n\
         \x20   'external_notifier': False,\n\
         \x20   'nics': [{{'mac': '00:5c:52:31:3a:9c', 'ip': '172.22.0.100'}}],\n\
         }}]\n",
        state = state.display().to_string()
    );
    if let Some((user, password)) = &setup.auth {
        let out = Command::new(venv.join("bin/python"))
            .args([
                "-c",
                "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())",
                password,
            ])
            .output()
            .expect("bcrypt via the venv python");
        assert!(out.status.success(), "bcrypt failed: {out:?}");
        let hash = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let htpasswd = dir.path().join("htpasswd");
        std::fs::write(&htpasswd, format!("{user}:{hash}\n")).expect("htpasswd");
        config.push_str(&format!(
            "SUSHY_EMULATOR_AUTH_FILE = {:?}\n",
            htpasswd.display().to_string()
        ));
    }
    let mut fingerprint = None;
    if setup.tls {
        let ss = self_signed(dir.path());
        config.push_str(&format!(
            "SUSHY_EMULATOR_SSL_CERT = {:?}\nSUSHY_EMULATOR_SSL_KEY = {:?}\n",
            ss.cert.display().to_string(),
            ss.key.display().to_string()
        ));
        fingerprint = Some(ss.fingerprint);
    }
    let conf = dir.path().join("emulator.conf");
    std::fs::write(&conf, config).expect("emulator config");
    let port = free_port();
    let mut cmd = Command::new(venv.join("bin/sushy-emulator"));
    cmd.arg("--config")
        .arg(&conf)
        .arg("--fake")
        .arg("-i")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string());
    let scheme = if setup.tls { "https" } else { "http" };
    Emulator {
        peer: Peer::start(cmd, scheme, port, dir),
        fingerprint,
    }
}

/// One request a [`RecordedBmc`] received.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// The `Authorization` header, as sent.
    pub authorization: Option<String>,
    /// The `X-Auth-Token` header, as sent.
    pub auth_token: Option<String>,
    /// The body, as text.
    pub body: String,
}

impl Received {
    /// The password of a `Basic` authorization header, decoded.
    pub fn basic_password(&self) -> Option<String> {
        use base64::Engine;
        let b64 = self.authorization.as_deref()?.strip_prefix("Basic ")?;
        let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        let text = String::from_utf8(raw).ok()?;
        text.split_once(':').map(|(_, p)| p.to_string())
    }
}

struct RecordedState {
    tree: std::collections::BTreeMap<String, serde_json::Value>,
    received: Vec<Received>,
}

/// A recorded BMC tree served from memory by an HTTP server in the test (axum on 127.0.0.1:0).
/// GET answers the recorded JSON; unlike `sushy-static`, a PATCH is applied to the resource as a
/// JSON merge patch (RFC 7386), so a read-back shows what was written, as on a real BMC. POST and
/// DELETE answer 204 (a session POST gets no token: the client settles for basic auth). Every
/// request is recorded with its credentials, for the tests that check where a password went.
pub struct RecordedBmc {
    pub addr: SocketAddr,
    state: std::sync::Arc<std::sync::Mutex<RecordedState>>,
    task: tokio::task::JoinHandle<()>,
}

/// The recorded tree of `shared/redfish-mockups/<vendor>`: resource path (`/redfish/v1/...`, no
/// trailing slash) to its JSON.
pub fn mockup_tree(vendor: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    let root = shared().join("redfish-mockups").join(vendor);
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.join("redfish/v1")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read mockup dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "index.json") {
                let rel = path
                    .parent()
                    .expect("parent")
                    .strip_prefix(&root)
                    .expect("under the root");
                let key = format!("/{}", rel.display());
                let text = std::fs::read_to_string(&path).expect("read index.json");
                let json = serde_json::from_str(&text).expect("mockup JSON");
                out.insert(key, json);
            }
        }
    }
    assert!(
        out.contains_key("/redfish/v1"),
        "no service root in {vendor}"
    );
    out
}

fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match patch {
        serde_json::Value::Object(p) => {
            if !target.is_object() {
                *target = serde_json::Value::Object(serde_json::Map::new());
            }
            if let serde_json::Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

async fn recorded_handler(
    axum::extract::State(state): axum::extract::State<
        std::sync::Arc<std::sync::Mutex<RecordedState>>,
    >,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let path = uri.path().trim_end_matches('/').to_string();
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    st.received.push(Received {
        method: method.to_string(),
        path: path.clone(),
        authorization: header("authorization"),
        auth_token: header("x-auth-token"),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    match method {
        axum::http::Method::GET => match st.tree.get(&path) {
            Some(doc) => (
                StatusCode::OK,
                [("content-type", "application/json")],
                doc.to_string(),
            )
                .into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        },
        axum::http::Method::PATCH => {
            let Ok(patch) = serde_json::from_slice::<serde_json::Value>(&body) else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            match st.tree.get_mut(&path) {
                Some(doc) => {
                    merge_patch(doc, &patch);
                    StatusCode::NO_CONTENT.into_response()
                }
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
        _ => StatusCode::NO_CONTENT.into_response(),
    }
}

impl RecordedBmc {
    /// Serve `tree` (see [`mockup_tree`]) on 127.0.0.1:0.
    pub async fn serve(tree: std::collections::BTreeMap<String, serde_json::Value>) -> RecordedBmc {
        let state = std::sync::Arc::new(std::sync::Mutex::new(RecordedState {
            tree,
            received: Vec::new(),
        }));
        let app = axum::Router::new()
            .fallback(recorded_handler)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind recorded BMC");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        RecordedBmc { addr, state, task }
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .received
            .clone()
    }

    /// A resource as it is now (after the PATCHes it received).
    pub fn resource(&self, path: &str) -> serde_json::Value {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tree
            .get(path)
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    }
}

impl Drop for RecordedBmc {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serve a small "ISO" on 127.0.0.1:0 and count the downloads.
pub async fn image_server() -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    let image: &'static [u8] = Box::leak(vec![0x42u8; 64 * 1024].into_boxed_slice());
    let app = axum::Router::new().route(
        "/{name}",
        axum::routing::get(move || {
            let h = h.clone();
            async move {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
