//! Test support: a Plinth server on port 0 over SQLite (a temp dir) or PostgreSQL (a fresh database
//! per test on the server named by DATABASE_URL), with tokens of every role.
//!
//! ## Requests: one helper
//! Every HTTP request of a test is built with reqwest and read whole with [`Ask::answer`]:
//! ```ignore
//! use support::Ask as _;
//! let m = s
//!     .req(Method::POST, "/api/v1/machines", &s.operator) // client + bearer token
//!     .json(&body)                                        // any builder step: headers, body...
//!     .answer()                                           // send, read status, headers, body
//!     .await
//!     .expect_status(StatusCode::CREATED)                 // the failure names request and body
//!     .json();                                            // the body as JSON (null when empty)
//! ```
//! [`Answer`] has `status`, `headers`, `body` (bytes) and `text` as fields for everything else
//! (`r.header("etag")`, `assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text)`).
//!
//! ## Shared fixtures
//! [`TestServer`] (and [`TestDb`], with [`TestDb::stores`], for tests that start the binary or the
//! stores themselves), [`Backend`] with `both_backends!`, [`config`], [`workflows`] and
//! [`workflows_with`] (the engine wired as `app` wires it, ticked by the test), [`shared`] (the reference data), [`free_port`],
//! [`lease_claim`]. A helper that a second test file needs moves here (or into the submodule of
//! its harness) instead of being copied. The submodules hold the larger harnesses:
//! network namespaces (`netns`, `lan`, `vm_lab`), real peers (`peers`, `bmc_peers`, `qemu_bmc`,
//! `talos_node`, `vm_image`) and the failing store (`broken_store`).
//!
//! ## Re-exec entry points
//! Some harnesses run this test binary again as another process (a UDP agent in a namespace, a
//! BMC, a node's Talos API inside a VM). They enter through the one ignored item
//! `support::reexec::entry` (see [`reexec`]); it is not a test and is never counted as one.
#![allow(dead_code, missing_docs)]

pub mod bmc_peers;
pub mod broken_store;
pub mod etcd_db;
pub mod lan;
pub mod netns;
pub mod peers;
pub mod qemu_bmc;
pub mod reexec;
pub mod talos_node;
pub mod vm_image;
pub mod vm_lab;

use std::path::PathBuf;

use plinth::app::Running;
use plinth::config::{Overrides, RawConfig};
use plinth::service::ApiRole;
use reqwest::{Client, StatusCode};
use serde_json::Value;
use uuid::Uuid;

/// The whole answer to one HTTP request, read at once.
#[derive(Debug)]
pub struct Answer {
    /// `METHOD path?query` of the request, for failure messages.
    pub request: String,
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    /// The body as it came.
    pub body: Vec<u8>,
    /// The body as text (invalid UTF-8 replaced).
    pub text: String,
}

impl Answer {
    /// Assert the status; the failure names the request, both statuses and the body.
    #[track_caller]
    pub fn expect_status(self, status: StatusCode) -> Answer {
        assert_eq!(
            self.status, status,
            "{}: expected {status}, got {}: {}",
            self.request, self.status, self.text
        );
        self
    }

    /// The body as JSON; `null` when it is empty. Panics, naming the request, when it is not JSON.
    #[track_caller]
    pub fn json(&self) -> Value {
        if self.text.is_empty() {
            return Value::Null;
        }
        serde_json::from_str(&self.text).unwrap_or_else(|e| {
            panic!(
                "{}: {} with a body that is not JSON ({e}): {}",
                self.request, self.status, self.text
            )
        })
    }

    /// One header's value as text (empty when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

/// `.answer()` on a request builder: send the request and read the whole answer. Transport
/// failures panic naming the request.
pub trait Ask {
    fn answer(self) -> impl std::future::Future<Output = Answer> + Send;
}

impl Ask for reqwest::RequestBuilder {
    async fn answer(self) -> Answer {
        let (client, request) = self.build_split();
        let request = request.expect("a well-formed request");
        let url = request.url();
        let what = match url.query() {
            Some(q) => format!("{} {}?{q}", request.method(), url.path()),
            None => format!("{} {}", request.method(), url.path()),
        };
        let r = client
            .execute(request)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = r.status();
        let headers = r.headers().clone();
        let body = r
            .bytes()
            .await
            .unwrap_or_else(|e| panic!("{what}: reading the body: {e}"))
            .to_vec();
        Answer {
            request: what,
            status,
            headers,
            text: String::from_utf8_lossy(&body).into_owned(),
            body,
        }
    }
}

/// The shared reference data (`../shared` beside the crate, or `PLINTH_SHARED`): Talos schemas,
/// configs and patches, Redfish mockups. Tests read it; the product never does.
pub fn shared() -> PathBuf {
    std::env::var_os("PLINTH_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"))
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("local addr").port()
}

/// The workflow engine over `srv`'s database, wired as `app` wires it (see [`workflows_with`]),
/// with the default Talos API client and cluster settings.
pub async fn workflows(srv: &TestServer, extra: &str) -> plinth::service::Workflows {
    workflows_with(srv, extra, Default::default(), Default::default()).await
}

/// The workflow engine over `srv`'s database, wired as `app` wires it: inventory, machine
/// configs (validated against the shared Talos schemas), BMCs over Redfish, clusters over
/// `talos` with `cluster` settings (its Talos API port is the config's). `extra` is the config
/// (see [`config`]); with a long `tick_seconds` the test calls `tick` itself.
pub async fn workflows_with(
    srv: &TestServer,
    extra: &str,
    talos: plinth::talos_api::TalosApiClient,
    cluster: plinth::service::clusters::ClusterSettings,
) -> plinth::service::Workflows {
    let cfg = config(&srv.db, extra);
    let store = plinth::app::open_store(&cfg, false).await.expect("store");
    let secrets = plinth::app::secret_box(&cfg).expect("key");
    let inventory = plinth::app::inventory(&store, secrets.clone());
    let configs =
        plinth::app::config_service(&store, secrets, Some(shared().join("talos/schemas")));
    let bmc = plinth::app::bmc_service(
        &inventory,
        &store,
        std::sync::Arc::new(plinth::bmc::RedfishConnector::default()),
    );
    let clusters = plinth::app::clusters(
        &configs,
        &store,
        std::sync::Arc::new(talos),
        plinth::service::clusters::ClusterSettings {
            talos_api_port: cfg.workflows.talos_api_port,
            ..cluster
        },
    );
    plinth::app::workflows(
        &inventory,
        &configs,
        &bmc,
        &store,
        clusters,
        cfg.workflows.clone(),
    )
}

/// The etcd snapshot use cases over `srv`'s database, wired as `app` wires them (the default
/// Talos API client; `extra` is the config, see [`config`], its `[snapshots]` S3 settings used).
pub async fn snapshots_with(
    srv: &TestServer,
    extra: &str,
) -> plinth::service::snapshots::Snapshots {
    snapshots_as(
        &srv.db,
        extra,
        &plinth::service::clusters::default_instance(),
    )
    .await
}

/// `snapshots_with` over `db`, as the Plinth instance named `instance`.
pub async fn snapshots_as(
    db: &TestDb,
    extra: &str,
    instance: &str,
) -> plinth::service::snapshots::Snapshots {
    let cfg = config(db, extra);
    let store = plinth::app::open_store(&cfg, false).await.expect("store");
    let secrets = plinth::app::secret_box(&cfg).expect("key");
    let configs = plinth::app::config_service(
        &store,
        secrets.clone(),
        Some(shared().join("talos/schemas")),
    );
    let clusters = plinth::app::clusters(
        &configs,
        &store,
        std::sync::Arc::new(plinth::talos_api::TalosApiClient::default()),
        plinth::service::clusters::ClusterSettings {
            talos_api_port: cfg.workflows.talos_api_port,
            ..Default::default()
        },
    );
    plinth::app::snapshots(
        &clusters,
        &store,
        cfg.snapshot_s3.clone(),
        secrets,
        plinth::service::snapshots::SnapshotSettings {
            instance: instance.to_string(),
            turn: cfg.snapshot_turn,
            ..Default::default()
        },
    )
}

/// A lease claim for `mac` on `ip` in `subnet`, valid for ten minutes from now.
pub fn lease_claim(
    ip: &str,
    subnet: &str,
    mac: &str,
    state: plinth::service::LeaseState,
) -> plinth::service::LeaseClaim {
    let now = chrono::Utc::now().timestamp_millis();
    plinth::service::LeaseClaim {
        lease: plinth::service::Lease {
            ip: ip.parse().expect("ip"),
            subnet: subnet.into(),
            mac: mac.parse().expect("mac"),
            state,
            expires_ms: now + 600_000,
            hostname: None,
            relay_circuit_id: None,
            relay_remote_id: None,
            giaddr: None,
            updated_ms: now,
        },
    }
}

/// The PostgreSQL admin URL for tests: DATABASE_URL, or the local server of the dev machines.
/// Write a fresh secret key to `path`, mode 0600 (Plinth refuses a key file others may read).
pub fn write_key(path: &std::path::Path) {
    use std::io::Write as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)
        .and_then(|mut f| f.write_all(plinth::service::SecretBox::generate_key_text().as_bytes()))
        .expect("write the secret key");
}

pub fn pg_admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn with_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let cut = base
        .rfind('/')
        .filter(|i| *i > base.find("://").map_or(0, |s| s + 2))
        .unwrap_or(base.len());
    format!("{}/{db}{query}", &base[..cut])
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// `$body` with `$c` a connection to the test database at `$url`, SQLite or PostgreSQL by the
/// URL: the same SQL on both without writing the connection twice. (The benches include this
/// file and use none of it, hence the allows.)
#[allow(unused_macros)]
macro_rules! with_conn {
    ($url:expr, |$c:ident| $body:expr) => {{
        let url: &str = $url;
        if url.starts_with("postgres") {
            let mut $c = <sqlx::PgConnection as sqlx::Connection>::connect(url)
                .await
                .expect("connect to the test database");
            $body
        } else {
            let mut $c = <sqlx::SqliteConnection as sqlx::Connection>::connect(url)
                .await
                .expect("connect to the test database");
            $body
        }
    }};
}
#[allow(unused_imports)]
pub(crate) use with_conn;

/// A fresh, empty database for one test.
pub struct TestDb {
    pub url: String,
    pub dir: tempfile::TempDir,
    pg_name: Option<String>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        let dir = tempfile::tempdir().expect("tempdir");
        match backend {
            Backend::Sqlite => {
                let url = format!("sqlite://{}", dir.path().join("plinth.db").display());
                TestDb {
                    url,
                    dir,
                    pg_name: None,
                }
            }
            Backend::Postgres => {
                let name = format!("plinth_t_{}", Uuid::new_v4().simple());
                let admin = pg_admin_url();
                let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
                    .await
                    .unwrap_or_else(|e| {
                        panic!("PostgreSQL at DATABASE_URL ({admin}) is needed for this test: {e}")
                    });
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .expect("create db");
                TestDb {
                    url: with_db(&admin, &name),
                    dir,
                    pg_name: Some(name),
                }
            }
        }
    }

    /// The stores over this database, migrated (at most 8 connections).
    pub async fn stores(&self) -> plinth::service::Stores {
        plinth::store::open(&plinth::store::StoreOptions {
            url: self.url.clone(),
            max_connections: 8,
            migrate: true,
        })
        .await
        .expect("store")
    }

    /// Drop the PostgreSQL database (SQLite goes with the temp dir).
    pub async fn drop_db(&self) {
        if let Some(name) = &self.pg_name {
            if let Ok(mut conn) =
                <sqlx::PgConnection as sqlx::Connection>::connect(&pg_admin_url()).await
            {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await;
            }
        }
    }
}

pub struct TestServer {
    pub base: String,
    pub admin: String,
    pub operator: String,
    pub viewer: String,
    pub db: TestDb,
    pub client: Client,
    pub data_dir: PathBuf,
    /// `http://IP:PORT` of the image door, when the config turns it on.
    pub images_base: Option<String>,
    /// Where TFTP listens, when the config turns it on.
    pub tftp_addr: Option<std::net::SocketAddr>,
    running: Option<Running>,
}

pub fn config(db: &TestDb, extra_toml: &str) -> plinth::config::Config {
    let toml = format!(
        "data_dir = \"{}\"\n[http]\nlisten = \"127.0.0.1:0\"\n{extra_toml}\n[secrets]\nkey_file = \"{}\"\n",
        db.dir.path().display(),
        db.dir.path().join("test.key").display()
    );
    let key = db.dir.path().join("test.key");
    if !key.exists() {
        write_key(&key);
    }
    RawConfig::parse(&toml)
        .expect("test config")
        .validate(&Overrides {
            database_url: Some(db.url.clone()),
            ..Default::default()
        })
        .expect("valid test config")
}

impl TestServer {
    pub async fn start(backend: Backend) -> TestServer {
        Self::start_with(backend, "").await
    }

    /// `extra_toml` goes into the `[http]` table (and may open further tables).
    pub async fn start_with(backend: Backend, extra_toml: &str) -> TestServer {
        Self::start_on(TestDb::new(backend).await, extra_toml).await
    }

    /// A server on a database another instance may have written first (with the same key,
    /// `test.key` of the database's directory).
    pub async fn start_on(db: TestDb, extra_toml: &str) -> TestServer {
        let cfg = config(&db, extra_toml);
        let running = plinth::app::spawn(&cfg).await.expect("server starts");
        let store = plinth::app::open_store(&cfg, false).await.expect("store");
        let tokens = plinth::app::tokens(&store);
        let mut t = Vec::new();
        for role in [ApiRole::Admin, ApiRole::Operator, ApiRole::Viewer] {
            t.push(
                tokens
                    .create(&format!("test-{role}"), role, None, "test")
                    .await
                    .expect("token")
                    .0,
            );
        }
        TestServer {
            base: format!("http://{}", running.http_addr),
            admin: t[0].clone(),
            operator: t[1].clone(),
            viewer: t[2].clone(),
            data_dir: cfg.data_dir.clone(),
            images_base: running.images_addr.map(|a| format!("http://{a}")),
            tftp_addr: running.tftp_addr,
            db,
            client: Client::new(),
            running: Some(running),
        }
    }

    /// A server over the stores `wrap` makes of the migrated real ones (say, a store that fails),
    /// through `app::spawn_with_stores`. The tokens of every role are minted in the real store
    /// first.
    pub async fn start_over(
        backend: Backend,
        extra_toml: &str,
        wrap: impl FnOnce(plinth::service::Stores) -> plinth::service::Stores,
    ) -> TestServer {
        let db = TestDb::new(backend).await;
        let cfg = config(&db, extra_toml);
        let store = plinth::app::open_store(&cfg, true).await.expect("store");
        let tokens = plinth::app::tokens(&store);
        let mut t = Vec::new();
        for role in [ApiRole::Admin, ApiRole::Operator, ApiRole::Viewer] {
            t.push(
                tokens
                    .create(&format!("test-{role}"), role, None, "test")
                    .await
                    .expect("token")
                    .0,
            );
        }
        let running = plinth::app::spawn_with_stores(&cfg, wrap(store))
            .await
            .expect("server starts");
        TestServer {
            base: format!("http://{}", running.http_addr),
            admin: t[0].clone(),
            operator: t[1].clone(),
            viewer: t[2].clone(),
            data_dir: cfg.data_dir.clone(),
            images_base: running.images_addr.map(|a| format!("http://{a}")),
            tftp_addr: running.tftp_addr,
            db,
            client: Client::new(),
            running: Some(running),
        }
    }

    /// The running server (its addresses).
    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request to `path` on the main port with `token` as its bearer token; send it with
    /// [`Ask::answer`].
    pub fn req(&self, method: reqwest::Method, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, self.url(path))
            .bearer_auth(token)
    }

    /// `GET path` with `token`: the answer's JSON (panics naming the request when it is not).
    pub async fn get_json(&self, path: &str, token: &str) -> Value {
        self.req(reqwest::Method::GET, path, token)
            .answer()
            .await
            .json()
    }

    /// `/metrics` as the scraper reads it (no token).
    pub async fn metrics(&self) -> String {
        self.client.get(self.url("/metrics")).answer().await.text
    }

    /// A console session signed in with `token` as a browser does it: the sign-in form (its
    /// cookie and CSRF token), then the POST. The session's cookie pair (`plinth_session=...`).
    pub async fn console_session(&self, token: &str) -> String {
        let (form_cookie, csrf) = self.console_sign_in_form().await;
        let r = no_redirects()
            .post(self.url("/console/sign-in"))
            .header("cookie", &form_cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}&csrf={csrf}"))
            .answer()
            .await
            .expect_status(StatusCode::SEE_OTHER);
        set_cookie(&r, "plinth_session").expect("a session cookie")
    }

    /// The console's sign-in form: its cookie pair (`plinth_sign_in=...`) and CSRF token.
    pub async fn console_sign_in_form(&self) -> (String, String) {
        let r = no_redirects()
            .get(self.url("/console/sign-in"))
            .answer()
            .await
            .expect_status(StatusCode::OK);
        let cookie = set_cookie(&r, "plinth_sign_in").expect("the sign-in form's cookie");
        (cookie, form_field(&r.text, "csrf"))
    }

    /// Stop the server and start it again on the same database and key (a new port: `base`
    /// changes; the tokens stay valid).
    pub async fn restart(&mut self, extra_toml: &str) {
        if let Some(r) = self.running.take() {
            r.stop().await.expect("clean shutdown");
        }
        let cfg = config(&self.db, extra_toml);
        let running = plinth::app::spawn(&cfg).await.expect("server starts again");
        self.base = format!("http://{}", running.http_addr);
        self.images_base = running.images_addr.map(|a| format!("http://{a}"));
        self.running = Some(running);
    }

    pub async fn finish(mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await.expect("clean shutdown");
        }
        self.db.drop_db().await;
    }
}

/// Define one test per backend from an async fn taking a `Backend`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(super::support::Backend::Sqlite).await })+
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(super::support::Backend::Postgres).await })+
        }
    };
}

/// A client that does not follow redirects (to see the console's 303s).
pub fn no_redirects() -> Client {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// The `name=value` pair of the cookie `name` an answer sets, if it sets one.
pub fn set_cookie(r: &Answer, name: &str) -> Option<String> {
    r.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .find(|pair| pair.split('=').next() == Some(name))
        .map(str::to_string)
}

/// The value of the hidden form field `name` in a console page.
pub fn form_field(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let at = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no field {name} in the page"))
        + marker.len();
    html[at..].split('"').next().unwrap_or("").to_string()
}
