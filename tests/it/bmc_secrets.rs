//! BMC passwords at rest and on the wire (issue 15, "Secrets at rest"): a stored password belongs
//! to its BMC's origin (`scheme://host:port`). Moving `bmc.url` elsewhere discards it (API, CLI and
//! `apply`), the sealed value does not open for another origin even when the row is edited behind
//! Plinth's back, passwords sealed before that binding are re-sealed at start, and a password goes
//! to an `http://` BMC only with `tls: insecure-http`.
//!
//! The BMCs are in-test HTTP servers serving a recorded Redfish tree (`RecordedBmc`) that record
//! every request, so the tests read the `Authorization` header and the session body each received.

use crate::support;
use crate::support::bmc_peers::{mockup_tree, RecordedBmc};

use plinth::domain::{MachineId, MachineSpec};
use plinth::service::{MachineRecord, MachineStore, NewEvent, PasswordChange, SecretBox};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::{Ask as _, Backend, TestServer};

const BIN: &str = env!("CARGO_BIN_EXE_plinth");
const PASSWORD: &str = "Old-Secret-7f3a9";

async fn send(
    s: &TestServer,
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
    assert!(
        !text.contains(PASSWORD),
        "the password in an answer: {text}"
    );
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

/// A recorded DMTF BMC (its root links a session service; a session POST gets no token, so the
/// client authenticates with basic auth).
async fn bmc() -> RecordedBmc {
    RecordedBmc::serve(mockup_tree("dmtf")).await
}

/// Register `host` with its BMC at `url` and `PASSWORD`.
async fn register(s: &TestServer, host: &str, url: &str) -> (String, i64) {
    let (st, m) = send(
        s,
        Method::POST,
        "/api/v1/machines",
        &s.operator,
        Some(
            json!({"hostname": host, "bmc": {"url": url, "username": "root",
            "password": PASSWORD, "tls": "insecure-http"}}),
        ),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{m}");
    let id = m["id"].as_str().expect("id").to_string();
    (id, m["version"].as_i64().expect("version"))
}

async fn patch(s: &TestServer, id: &str, body: Value) -> (StatusCode, Value) {
    send(
        s,
        Method::PATCH,
        &format!("/api/v1/machines/{id}"),
        &s.operator,
        Some(body),
    )
    .await
}

/// Everything that talks to a machine's BMC: probe, power state, inspection.
async fn use_the_bmc(s: &TestServer, id: &str) -> Vec<(StatusCode, Value)> {
    let mut out = Vec::new();
    for (method, path) in [
        (Method::POST, "bmc/probe"),
        (Method::GET, "power"),
        (Method::POST, "inspect"),
    ] {
        let p = format!("/api/v1/machines/{id}/{path}");
        out.push(send(s, method, &p, &s.operator, None).await);
    }
    out
}

/// The password never reached `bmc`: not in a basic-auth header, not in a body (session POST).
fn never_received(bmc: &RecordedBmc, password: &str) {
    let got = bmc.received();
    for r in &got {
        assert_ne!(
            r.basic_password().as_deref(),
            Some(password),
            "sent in basic auth: {} {}",
            r.method,
            r.path
        );
        assert!(
            !r.body.contains(password),
            "sent in a body: {} {}",
            r.method,
            r.path
        );
    }
}

fn received_password(bmc: &RecordedBmc, password: &str) -> bool {
    bmc.received()
        .iter()
        .any(|r| r.basic_password().as_deref() == Some(password) || r.body.contains(password))
}

async fn events(s: &TestServer, id: &str) -> Vec<Value> {
    let (st, v) = send(
        s,
        Method::GET,
        &format!("/api/v1/events?machine={id}&limit=1000"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    v.as_array().cloned().expect("events")
}

async fn moving_the_bmc_url_discards_its_password(b: Backend) {
    let real = bmc().await;
    let theirs = bmc().await;
    let s = TestServer::start(b).await;
    let (id, v) = register(&s, "n1", &real.url()).await;
    let (st, r) = send(
        &s,
        Method::GET,
        &format!("/api/v1/machines/{id}/power"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert!(
        received_password(&real, PASSWORD),
        "the real BMC gets the password"
    );

    // Same origin, another path: the password stays.
    let (st, m) = patch(
        &s,
        &id,
        json!({"version": v, "bmc": {"url": format!("{}/redfish/v1", real.url())}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{m}");
    assert_eq!(m["bmc"]["has_password"], true, "{m}");
    assert!(m.get("notices").is_none(), "{m}");

    // An operator points the URL at an http:// host of theirs: the password is discarded, and the
    // answer says so.
    let (st, m) = patch(
        &s,
        &id,
        json!({"version": m["version"], "bmc": {"url": theirs.url()}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{m}");
    assert_eq!(m["bmc"]["has_password"], false, "{m}");
    let notice = m["notices"][0].as_str().unwrap_or_default();
    assert!(
        notice.contains("bmc.password discarded") && notice.contains(&theirs.url()),
        "{m}"
    );
    for (st, r) in use_the_bmc(&s, &id).await {
        assert_ne!(st, StatusCode::INTERNAL_SERVER_ERROR, "{r}");
    }
    assert!(
        theirs
            .received()
            .iter()
            .any(|r| r.basic_password().is_some()),
        "their host was asked, with basic auth"
    );
    never_received(&theirs, PASSWORD);

    // The event of the edit says so too (and holds no password).
    let ev = events(&s, &id).await;
    let discarded = ev
        .iter()
        .filter(|e| e["kind"] == "machine.updated")
        .filter_map(|e| e["detail"]["changes"]["bmc.password"].as_str())
        .collect::<Vec<_>>();
    assert_eq!(discarded.len(), 1, "{ev:?}");
    assert!(discarded[0].starts_with("discarded"), "{discarded:?}");
    assert!(!serde_json::to_string(&ev).expect("json").contains(PASSWORD));

    // A new password in the same edit as the URL is kept, and is what goes there.
    let other = bmc().await;
    let (_, m) = send(
        &s,
        Method::GET,
        &format!("/api/v1/machines/{id}"),
        &s.viewer,
        None,
    )
    .await;
    let (st, m) = patch(
        &s,
        &id,
        json!({"version": m["version"], "bmc": {"url": other.url(), "password": "New-Secret-2b"}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{m}");
    assert_eq!(m["bmc"]["has_password"], true);
    assert!(m.get("notices").is_none(), "{m}");
    let (st, r) = send(
        &s,
        Method::GET,
        &format!("/api/v1/machines/{id}/power"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert!(received_password(&other, "New-Secret-2b"));
    never_received(&other, PASSWORD);

    // The CLI's edit: another origin through `--set`, the notice in its answer.
    let (id2, _) = register(&s, "n2", &real.url()).await;
    let out = tokio::process::Command::new(BIN)
        .args([
            "machine",
            "edit",
            "n2",
            "--set",
            &format!("bmc.url={}", theirs.url()),
            "--json",
        ])
        .env("PLINTH_SERVER", &s.base)
        .env("PLINTH_TOKEN", &s.operator)
        .output()
        .await
        .expect("run plinth");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    let m: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(m["bmc"]["has_password"], false, "{m}");
    assert!(
        m["notices"][0]
            .as_str()
            .is_some_and(|n| n.contains("bmc.password discarded")),
        "{m}"
    );
    use_the_bmc(&s, &id2).await;
    never_received(&theirs, PASSWORD);

    // Without `--json` the CLI prints the machine on stdout and the notice on stderr.
    let (id3, _) = register(&s, "n3", &real.url()).await;
    let out = tokio::process::Command::new(BIN)
        .args([
            "machine",
            "edit",
            "n3",
            "--set",
            &format!("bmc.url={}", theirs.url()),
        ])
        .env("PLINTH_SERVER", &s.base)
        .env("PLINTH_TOKEN", &s.operator)
        .output()
        .await
        .expect("run plinth");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("notice: bmc.password discarded") && l.contains(&theirs.url())),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("n3"),
        "the machine on stdout"
    );
    use_the_bmc(&s, &id3).await;
    never_received(&theirs, PASSWORD);
    s.finish().await;
}

/// The CLI's help names the TLS mode an http:// BMC with a password needs.
#[test]
fn machine_add_help_lists_insecure_http() {
    let out = std::process::Command::new(BIN)
        .args(["machine", "add", "--help"])
        .output()
        .expect("run plinth");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = help
        .lines()
        .skip_while(|l| !l.contains("--bmc-tls"))
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(line.contains("insecure-http"), "{help}");
}

async fn plain_http_needs_the_insecure_http_flag(b: Backend) {
    let real = bmc().await;
    let s = TestServer::start(b).await;
    let refused = |body: Value| {
        let s = &s;
        async move {
            let (st, e) = send(s, Method::POST, "/api/v1/machines", &s.operator, Some(body)).await;
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
            assert_eq!(e["error"]["fields"][0]["field"], "bmc.tls", "{e}");
            e["error"]["fields"][0]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
    };
    // A password for an http:// URL, without the flag: refused, naming the field and the fix.
    let message = refused(
        json!({"hostname": "h1", "bmc": {"url": real.url(), "username": "root",
        "password": PASSWORD}}),
    )
    .await;
    assert!(message.contains("insecure-http"), "{message}");
    refused(
        json!({"hostname": "h1", "bmc": {"url": real.url(), "username": "root",
        "password": PASSWORD, "tls": "insecure"}}),
    )
    .await;
    // The flag is for http:// only.
    refused(
        json!({"hostname": "h1", "bmc": {"url": "https://10.9.0.1", "username": "root",
        "tls": "insecure-http"}}),
    )
    .await;
    // Without a password there is nothing to protect.
    let (st, m) = send(
        &s,
        Method::POST,
        "/api/v1/machines",
        &s.operator,
        Some(json!({"hostname": "h0", "bmc": {"url": real.url(), "username": "root"}})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{m}");
    // Adding the password later needs the flag too.
    let (st, e) = patch(
        &s,
        "h0",
        json!({"version": m["version"], "bmc": {"password": PASSWORD}}),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(e["error"]["fields"][0]["field"], "bmc.tls", "{e}");

    // With it: accepted; dropping it later while the password stays is refused.
    let (id, v) = register(&s, "h1", &real.url()).await;
    let (st, e) = patch(&s, &id, json!({"version": v, "bmc": {"tls": "verify"}})).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(e["error"]["fields"][0]["field"], "bmc.tls", "{e}");

    // A bulk import is held to the same rule.
    let csv = format!(
        "hostname,bmc_url,bmc_username,bmc_password\nh2,{},root,{PASSWORD}\n",
        real.url()
    );
    let r = s
        .req(Method::POST, "/api/v1/machines/import", &s.operator)
        .header("content-type", "text/csv")
        .body(csv)
        .answer()
        .await
        .expect_status(StatusCode::UNPROCESSABLE_ENTITY);
    let e: Value = r.json();
    assert_eq!(e["error"]["rows"][0]["field"], "bmc_tls", "{e}");

    // A row set to `verify` behind Plinth's back: the client refuses to send the password.
    let cfg = support::config(&s.db, "");
    let store = plinth::app::open_store(&cfg, false)
        .await
        .expect("store")
        .machines;
    let mid: MachineId = id.parse().expect("id");
    let m = store.get_machine(mid).await.expect("get").expect("machine");
    let mut spec: MachineSpec = m.spec();
    if let Some(b) = spec.bmc.as_mut() {
        b.tls = plinth::domain::TlsMode::Verify;
    }
    behind_the_back(&*store, mid, m.version, spec).await;
    let before = real.received().len();
    let (st, e) = send(
        &s,
        Method::GET,
        &format!("/api/v1/machines/{id}/power"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(e["error"]["code"], "bmc_config", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("bmc.tls")),
        "{e}"
    );
    assert_eq!(real.received().len(), before, "nothing was sent");
    s.finish().await;
}

/// Rewrite a machine's row the way a SQL edit would: same password ciphertext, new spec.
async fn behind_the_back(store: &dyn MachineStore, id: MachineId, version: i64, spec: MachineSpec) {
    let rec = MachineRecord {
        spec,
        password: PasswordChange::Keep,
    };
    let ev = NewEvent {
        machine_id: Some(id),
        kind: "test.sql_edit".into(),
        actor: "test".into(),
        detail: json!({}),
    };
    store
        .update_machine(id, version, &rec, &ev)
        .await
        .expect("edit the row");
}

async fn sealed_for_its_origin_and_legacy_values_resealed(b: Backend) {
    let real = bmc().await;
    let theirs = bmc().await;
    let mut s = TestServer::start(b).await;
    let cfg = support::config(&s.db, "");
    let store = plinth::app::open_store(&cfg, false)
        .await
        .expect("store")
        .machines;
    let key = std::fs::read_to_string(s.db.dir.path().join("test.key")).expect("key");
    let secrets = SecretBox::from_text(&key).expect("key");

    // Its URL changed in the database, not through Plinth: the password does not open for the
    // new origin, and nothing reaches it.
    let (id, _) = register(&s, "r1", &real.url()).await;
    let mid: MachineId = id.parse().expect("id");
    let m = store.get_machine(mid).await.expect("get").expect("machine");
    let mut spec = m.spec();
    if let Some(b) = spec.bmc.as_mut() {
        b.url = theirs.url();
    }
    behind_the_back(&*store, mid, m.version, spec).await;
    for (st, e) in use_the_bmc(&s, &id).await {
        assert!(st.is_server_error(), "{st} {e}");
    }
    assert!(theirs.received().is_empty(), "not one request went there");

    // A password sealed the old way (machine id only): refused until re-sealed, which the next
    // start does, once, as a versioned change with its event.
    let (id2, _) = register(&s, "r2", &real.url()).await;
    let mid2: MachineId = id2.parse().expect("id");
    let m2 = store
        .get_machine(mid2)
        .await
        .expect("get")
        .expect("machine");
    let legacy = secrets.seal(&format!("bmc-password:{mid2}"), PASSWORD.as_bytes());
    let rec = MachineRecord {
        spec: m2.spec(),
        password: PasswordChange::Set(legacy),
    };
    let ev = NewEvent {
        machine_id: Some(mid2),
        kind: "test.legacy".into(),
        actor: "test".into(),
        detail: json!({}),
    };
    let m2 = store
        .update_machine(mid2, m2.version, &rec, &ev)
        .await
        .expect("legacy value");
    let (st, e) = send(
        &s,
        Method::GET,
        &format!("/api/v1/machines/{id2}/power"),
        &s.viewer,
        None,
    )
    .await;
    assert!(st.is_server_error(), "{st} {e}");

    s.restart("").await;
    let after = store
        .get_machine(mid2)
        .await
        .expect("get")
        .expect("machine");
    assert_eq!(
        after.version,
        m2.version + 1,
        "re-sealed as one versioned change"
    );
    let sealed = store.bmc_password(mid2).await.expect("read").expect("kept");
    let origin = plinth::domain::bmc_origin(&real.url()).expect("origin");
    assert_eq!(
        secrets
            .open(&format!("bmc-password:{mid2}:{origin}"), &sealed)
            .expect("bound to its origin"),
        PASSWORD.as_bytes()
    );
    assert!(
        secrets
            .open(&format!("bmc-password:{mid2}"), &sealed)
            .is_err(),
        "no longer opens the old way"
    );
    let ev = events(&s, &id2).await;
    let resealed: Vec<&Value> = ev
        .iter()
        .filter(|e| e["kind"] == "bmc.password_resealed")
        .collect();
    assert_eq!(resealed.len(), 1, "{ev:?}");
    assert_eq!(resealed[0]["detail"]["origin"], origin.as_str());
    let (st, r) = send(
        &s,
        Method::GET,
        &format!("/api/v1/machines/{id2}/power"),
        &s.viewer,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert!(received_password(&real, PASSWORD));

    // Once is enough: another start changes nothing.
    s.restart("").await;
    let again = store
        .get_machine(mid2)
        .await
        .expect("get")
        .expect("machine");
    assert_eq!(again.version, after.version);
    never_received(&theirs, PASSWORD);
    s.finish().await;
}

/// `plinth apply` never carries a password: a declared machine whose BMC moves to another origin
/// loses the stored one, and the plan says so before anything is written.
async fn apply_that_moves_the_bmc_discards_its_password(b: Backend) {
    let real = bmc().await;
    let theirs = bmc().await;
    let s = TestServer::start(b).await;
    let (id, _) = register(&s, "a1", &real.url()).await;
    let cfg = support::config(&s.db, "");
    let stores = plinth::app::open_store(&cfg, false).await.expect("store");
    let store = stores.machines.clone();
    let secrets = plinth::app::secret_box(&cfg).expect("key");
    let configs = plinth::app::config_service(&stores, secrets.clone(), None);
    let inv = plinth::app::inventory(&stores, secrets);
    let declare = |url: String| {
        let spec: MachineSpec = serde_json::from_value(json!({"hostname": "a1",
            "bmc": {"url": url, "username": "root", "tls": "insecure-http"}}))
        .expect("spec");
        plinth::service::apply::Declared {
            machines: vec![plinth::service::apply::DeclaredMachine {
                origin: "test.yaml".into(),
                spec: spec.validate().expect("valid"),
                patches: Default::default(),
            }],
            ..Default::default()
        }
    };
    let plan = plinth::service::apply::apply(&configs, &inv, declare(theirs.url()), true, "test")
        .await
        .expect("plan");
    assert!(!plan.applied);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("Machine a1") && n.contains("password is discarded")),
        "{:?}",
        plan.notes
    );
    let mid: MachineId = id.parse().expect("id");
    assert!(
        store.bmc_password(mid).await.expect("read").is_some(),
        "a plan writes nothing"
    );
    let done = plinth::service::apply::apply(&configs, &inv, declare(theirs.url()), false, "test")
        .await
        .expect("apply");
    assert!(done.applied, "{:?}", done.errors);
    assert!(store.bmc_password(mid).await.expect("read").is_none());
    use_the_bmc(&s, &id).await;
    never_received(&theirs, PASSWORD);
    s.finish().await;
}

both_backends!(
    moving_the_bmc_url_discards_its_password,
    plain_http_needs_the_insecure_http_flag,
    sealed_for_its_origin_and_legacy_values_resealed,
    apply_that_moves_the_bmc_discards_its_password
);
