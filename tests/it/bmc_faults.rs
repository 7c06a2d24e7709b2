//! A fault-injecting BMC (axum on 127.0.0.1:0) for what the real peers do not do: sessions whose
//! URI is only in the body, a session cap (503), expired sessions (401), 428 without If-Match, 412
//! on weak ETags, 202 task monitors with Retry-After, 200 with an error body, non-JSON error bodies,
//! a boot mode that silently reverts, 5xx bursts, paged collections and trailing-slash links, a
//! connection reset on a kept-alive connection, and a BMC that never answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use plinth::bmc::{
    AuthMode, Bmc, BmcEndpoint, BmcError, BmcOptions, BootMode, BootTarget, Password, PowerAction,
    PowerState, RedfishBmc, TlsPolicy,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const USER: &str = "ops";
const PASSWORD: &str = "Fault-Pa55";

/// What the fault BMC does wrong (or merely differently).
#[derive(Clone, Default)]
struct Knobs {
    vendor: String,
    /// Session created without a `Location` header; the URI is only in the body.
    session_location_in_body: bool,
    /// Refuse new sessions with 503 once this many are open.
    session_cap: Option<usize>,
    /// PATCH without If-Match answers 428.
    require_if_match: bool,
    /// GET shows no ETag at all.
    hide_etag: bool,
    /// ETags are handed out weak, and If-Match with the weak form answers 412.
    weak_etag_412: bool,
    /// Resets answer 202 with a task monitor that stays running for this many polls.
    reset_task: Option<usize>,
    /// The task ends in `Exception`.
    task_fails: bool,
    /// Successful PATCH/POST answer 200 with an `error` object.
    ok_with_error_body: bool,
    /// Resets are refused with 400 and an HTML body.
    html_error_on_reset: bool,
    /// PATCH keeps target and enablement but silently keeps the old boot mode.
    revert_boot_mode: bool,
    /// The next this-many GETs of a system answer 500.
    fail_next_gets: usize,
    /// Delay every authenticated request.
    slow: Option<Duration>,
}

struct Fault {
    knobs: Knobs,
    sessions: HashMap<String, String>,
    next_session: usize,
    created: usize,
    deleted: usize,
    power: String,
    pending_power: Option<String>,
    boot: (String, String, String),
    etag_n: u64,
    task_polls: Vec<Instant>,
    patches: Vec<(Option<String>, u16)>,
    resets: Vec<String>,
    in_flight: usize,
    max_in_flight: usize,
}

type Shared = Arc<Mutex<Fault>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Fault> {
    s.lock().expect("fault state")
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn redfish_error(status: StatusCode, msg: &str) -> Response {
    json_response(
        status,
        json!({"error": {"code": "Base.1.8.GeneralError", "message": msg}}),
    )
}

impl Fault {
    fn etag(&self) -> String {
        if self.knobs.weak_etag_412 {
            format!("W/\"{}\"", self.etag_n)
        } else {
            format!("\"{}\"", self.etag_n)
        }
    }

    fn system(&self, id: &str) -> Value {
        let mut v = json!({
            "@odata.id": format!("/redfish/v1/Systems/{id}"),
            "Id": id,
            "Manufacturer": "Faulty Inc.",
            "Model": "FX-1",
            "UUID": "11111111-2222-3333-4444-555555555555",
            "SerialNumber": "FAULT-0001",
            "PowerState": self.power,
            "Boot": {
                "BootSourceOverrideTarget": self.boot.0,
                "BootSourceOverrideEnabled": self.boot.1,
                "BootSourceOverrideMode": self.boot.2,
                "BootSourceOverrideTarget@Redfish.AllowableValues": ["None", "Pxe", "Cd", "Hdd", "UefiHttp"]
            },
            "Actions": {"#ComputerSystem.Reset": {
                "target": format!("/redfish/v1/Systems/{id}/Actions/ComputerSystem.Reset"),
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulRestart", "ForceRestart"]
            }},
            "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/bmc"}]}
        });
        if !self.knobs.hide_etag {
            v["@odata.etag"] = json!(self.etag());
        }
        v
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        if let Some(tok) = headers.get("x-auth-token").and_then(|v| v.to_str().ok()) {
            return self.sessions.contains_key(tok);
        }
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
        );
        headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == expected)
    }
}

struct InFlight(Shared);

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.0).in_flight -= 1;
    }
}

async fn handle(
    State(s): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let raw_path = uri.path().to_string();
    let query = uri.query().unwrap_or("").to_string();
    let path = raw_path.trim_end_matches('/').to_string();

    // Unauthenticated: the service root and session creation.
    if path == "/redfish/v1" && method == Method::GET {
        let vendor = lock(&s).knobs.vendor.clone();
        return json_response(
            StatusCode::OK,
            json!({
                "@odata.id": "/redfish/v1/",
                "RedfishVersion": "1.8.0",
                "Vendor": vendor,
                // Trailing slash on purpose: this BMC serves only the form without it.
                "Systems": {"@odata.id": "/redfish/v1/Systems/"},
                "Managers": {"@odata.id": "/redfish/v1/Managers"},
                "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}
            }),
        );
    }
    if path == "/redfish/v1/SessionService/Sessions" && method == Method::POST {
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if req["UserName"] != USER || req["Password"] != PASSWORD {
            return redfish_error(StatusCode::UNAUTHORIZED, "bad credentials");
        }
        let mut st = lock(&s);
        if st
            .knobs
            .session_cap
            .is_some_and(|cap| st.sessions.len() >= cap)
        {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [("retry-after", "0")],
                "session limit reached",
            )
                .into_response();
        }
        st.next_session += 1;
        st.created += 1;
        let id = st.next_session.to_string();
        let token = format!("tok-{id}-{}", uuid::Uuid::new_v4());
        st.sessions.insert(token.clone(), id.clone());
        let uri = format!("/redfish/v1/SessionService/Sessions/{id}");
        let mut resp = json_response(
            StatusCode::CREATED,
            json!({"@odata.id": uri, "Id": id, "UserName": USER}),
        );
        let h = resp.headers_mut();
        h.insert(
            "x-auth-token",
            HeaderValue::from_str(&token).expect("token"),
        );
        if !st.knobs.session_location_in_body {
            h.insert("location", HeaderValue::from_str(&uri).expect("uri"));
        }
        return resp;
    }

    let slow = {
        let mut st = lock(&s);
        if !st.authorized(&headers) {
            return redfish_error(StatusCode::UNAUTHORIZED, "authentication required");
        }
        st.in_flight += 1;
        st.max_in_flight = st.max_in_flight.max(st.in_flight);
        st.knobs.slow
    };
    let _guard = InFlight(s.clone());
    if let Some(d) = slow {
        tokio::time::sleep(d).await;
    }
    if raw_path.ends_with('/') {
        return (StatusCode::NOT_FOUND, "no such resource (mind the slash)").into_response();
    }

    let mut st = lock(&s);
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.clone(), segs.as_slice()) {
        (Method::DELETE, ["redfish", "v1", "SessionService", "Sessions", id]) => {
            let tok = st
                .sessions
                .iter()
                .find(|(_, v)| v.as_str() == *id)
                .map(|(k, _)| k.clone());
            match tok {
                Some(t) => {
                    st.sessions.remove(&t);
                    st.deleted += 1;
                    StatusCode::NO_CONTENT.into_response()
                }
                None => redfish_error(StatusCode::NOT_FOUND, "no such session"),
            }
        }
        (Method::GET, ["redfish", "v1", "Systems"]) => {
            if query == "page=2" {
                json_response(
                    StatusCode::OK,
                    json!({"Members": [{"@odata.id": "/redfish/v1/Systems/sys-b"}]}),
                )
            } else {
                json_response(
                    StatusCode::OK,
                    json!({"Members": [{"@odata.id": "/redfish/v1/Systems/sys-a"}],
                           "Members@odata.nextLink": "/redfish/v1/Systems?page=2"}),
                )
            }
        }
        (Method::GET, ["redfish", "v1", "Managers", "bmc"]) => json_response(
            StatusCode::OK,
            json!({"@odata.id": "/redfish/v1/Managers/bmc", "Id": "bmc"}),
        ),
        (Method::GET, ["redfish", "v1", "Systems", id]) => {
            if st.knobs.fail_next_gets > 0 {
                st.knobs.fail_next_gets -= 1;
                return (StatusCode::INTERNAL_SERVER_ERROR, "<html>busy</html>").into_response();
            }
            let mut resp = json_response(StatusCode::OK, st.system(id));
            if !st.knobs.hide_etag {
                let tag = st.etag();
                resp.headers_mut()
                    .insert("etag", HeaderValue::from_str(&tag).expect("etag"));
            }
            resp
        }
        (Method::PATCH, ["redfish", "v1", "Systems", _]) => {
            let if_match = headers
                .get("if-match")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let status = match &if_match {
                None if st.knobs.require_if_match => StatusCode::PRECONDITION_REQUIRED,
                Some(t) if t == "*" => StatusCode::OK,
                Some(t) if st.knobs.weak_etag_412 && t.starts_with("W/") => {
                    StatusCode::PRECONDITION_FAILED
                }
                Some(t) if t.trim_start_matches("W/") != st.etag().trim_start_matches("W/") => {
                    StatusCode::PRECONDITION_FAILED
                }
                _ => StatusCode::OK,
            };
            st.patches.push((if_match, status.as_u16()));
            if status != StatusCode::OK {
                return redfish_error(status, "precondition");
            }
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let b = &req["Boot"];
            if let Some(t) = b["BootSourceOverrideTarget"].as_str() {
                st.boot.0 = t.to_string();
            }
            if let Some(e) = b["BootSourceOverrideEnabled"].as_str() {
                st.boot.1 = e.to_string();
            }
            if let Some(m) = b["BootSourceOverrideMode"].as_str() {
                if !st.knobs.revert_boot_mode {
                    st.boot.2 = m.to_string();
                }
            }
            st.etag_n += 1;
            if st.knobs.ok_with_error_body {
                json_response(
                    StatusCode::OK,
                    json!({"error": {"code": "iLO.0.10.ExtendedInfo",
                        "message": "See @Message.ExtendedInfo for more information.",
                        "@Message.ExtendedInfo": [{"MessageId": "Base.1.4.Success"}]}}),
                )
            } else {
                StatusCode::NO_CONTENT.into_response()
            }
        }
        (Method::POST, ["redfish", "v1", "Systems", _, "Actions", "ComputerSystem.Reset"]) => {
            if st.knobs.html_error_on_reset {
                return (
                    StatusCode::BAD_REQUEST,
                    [("content-type", "text/html")],
                    "<html><body><h1>Bad Request</h1>reset refused by policy</body></html>",
                )
                    .into_response();
            }
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let kind = req["ResetType"].as_str().unwrap_or("").to_string();
            st.resets.push(kind.clone());
            let target = match kind.as_str() {
                "On" | "ForceRestart" | "GracefulRestart" => "On",
                "ForceOff" => "Off",
                _ => return redfish_error(StatusCode::BAD_REQUEST, "bad ResetType"),
            };
            if st.knobs.reset_task.is_some() {
                st.pending_power = Some(target.to_string());
                st.task_polls.clear();
                return (
                    StatusCode::ACCEPTED,
                    [
                        ("location", "/redfish/v1/TaskService/TaskMonitors/1"),
                        ("retry-after", "1"),
                    ],
                    "",
                )
                    .into_response();
            }
            st.power = target.to_string();
            if st.knobs.ok_with_error_body {
                json_response(
                    StatusCode::OK,
                    json!({"error": {"code": "Base.1.4.Success", "message": "Successfully Completed Request"}}),
                )
            } else {
                StatusCode::NO_CONTENT.into_response()
            }
        }
        (Method::GET, ["redfish", "v1", "TaskService", "TaskMonitors", "1"]) => {
            st.task_polls.push(Instant::now());
            let running_polls = st.knobs.reset_task.unwrap_or(0);
            if st.task_polls.len() <= running_polls {
                return (
                    StatusCode::ACCEPTED,
                    [("retry-after", "1"), ("content-type", "application/json")],
                    json!({"TaskState": "Running"}).to_string(),
                )
                    .into_response();
            }
            if st.knobs.task_fails {
                st.pending_power = None;
                return json_response(
                    StatusCode::OK,
                    json!({"TaskState": "Exception", "TaskStatus": "Critical",
                           "Messages": [{"Message": "Power supply fault"}]}),
                );
            }
            if let Some(p) = st.pending_power.take() {
                st.power = p;
            }
            json_response(
                StatusCode::OK,
                json!({"TaskState": "Completed", "TaskStatus": "OK"}),
            )
        }
        _ => (StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

/// A running fault BMC.
struct FaultBmc {
    addr: SocketAddr,
    state: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultBmc {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultBmc {
    async fn start(knobs: Knobs) -> FaultBmc {
        let state = Arc::new(Mutex::new(Fault {
            knobs,
            sessions: HashMap::new(),
            next_session: 0,
            created: 0,
            deleted: 0,
            power: "Off".into(),
            pending_power: None,
            boot: ("None".into(), "Disabled".into(), "UEFI".into()),
            etag_n: 1,
            task_polls: Vec::new(),
            patches: Vec::new(),
            resets: Vec::new(),
            in_flight: 0,
            max_in_flight: 0,
        }));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fault BMC");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FaultBmc { addr, state, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn st(&self) -> std::sync::MutexGuard<'_, Fault> {
        lock(&self.state)
    }

    fn client(&self) -> RedfishBmc {
        client_with(self.url(), options())
    }
}

fn options() -> BmcOptions {
    BmcOptions {
        request_timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(50),
        power_timeout: Duration::from_secs(10),
        task_timeout: Duration::from_secs(15),
        retry_backoff: Duration::from_millis(20),
        ..BmcOptions::default()
    }
}

fn client_with(url: String, opts: BmcOptions) -> RedfishBmc {
    RedfishBmc::new(
        BmcEndpoint {
            url,
            username: USER.into(),
            password: Password::new(PASSWORD),
            tls: TlsPolicy::PlainHttp,
        },
        opts,
    )
    .expect("client")
}

/// Wait (bounded) for a condition on the fault BMC's state.
async fn eventually(bmc: &FaultBmc, what: &str, cond: impl Fn(&Fault) -> bool) {
    for _ in 0..100 {
        if cond(&bmc.st()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not happen within 5 s");
}

#[tokio::test]
async fn session_uri_only_in_body_is_deleted_on_close_and_drop() {
    let f = FaultBmc::start(Knobs {
        session_location_in_body: true,
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    assert_eq!(bmc.power_state().await.expect("state"), PowerState::Off);
    assert_eq!(bmc.auth_mode(), AuthMode::Session);
    assert_eq!(f.st().sessions.len(), 1);
    bmc.close().await.expect("close");
    assert_eq!(f.st().sessions.len(), 0, "close() deleted the session");
    assert!(matches!(bmc.power_state().await, Err(BmcError::Config(_))));

    // Dropped without close(): the session is deleted in the background.
    let bmc = f.client();
    bmc.inspect().await.expect("inspect");
    assert_eq!(f.st().sessions.len(), 1);
    drop(bmc);
    eventually(&f, "logout on drop", |s| s.sessions.is_empty()).await;
    let st = f.st();
    assert_eq!((st.created, st.deleted), (2, 2));
}

#[tokio::test]
async fn expired_session_logs_in_again() {
    let f = FaultBmc::start(Knobs::default()).await;
    let bmc = f.client();
    bmc.power_state().await.expect("state");
    f.st().sessions.clear(); // the BMC forgets every session (timeout, BMC reboot)
    assert_eq!(bmc.power_state().await.expect("after 401"), PowerState::Off);
    assert_eq!(f.st().created, 2);
    bmc.close().await.expect("close");
    assert!(f.st().sessions.is_empty(), "no session leaked");
}

#[tokio::test]
async fn session_cap_falls_back_to_basic_auth() {
    let f = FaultBmc::start(Knobs {
        session_cap: Some(0),
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    assert_eq!(
        bmc.power(PowerAction::On).await.expect("on"),
        PowerState::On
    );
    assert_eq!(bmc.auth_mode(), AuthMode::Basic);
    assert_eq!(f.st().created, 0);
    bmc.close().await.expect("close");
}

#[tokio::test]
async fn if_match_required_428() {
    let f = FaultBmc::start(Knobs {
        require_if_match: true,
        hide_etag: true,
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    let ov = bmc.boot_once(BootTarget::Pxe, None).await.expect("boot");
    assert_eq!(ov.target.as_deref(), Some("Pxe"));
    assert_eq!(ov.enabled.as_deref(), Some("Once"));
    // First without If-Match (no ETag anywhere), 428, then If-Match: *.
    assert_eq!(f.st().patches, [(None, 428), (Some("*".to_string()), 200)]);
    assert!(
        bmc.capabilities()
            .await
            .expect("caps")
            .etag
            .if_match_required
    );
    // Learned: the next PATCH goes with If-Match at once.
    bmc.boot_once(BootTarget::Cd, None).await.expect("boot cd");
    assert_eq!(f.st().patches.len(), 3);
    assert_eq!(f.st().patches[2].1, 200);
}

#[tokio::test]
async fn ami_row_sends_if_match_first() {
    let f = FaultBmc::start(Knobs {
        vendor: "AMI".into(),
        require_if_match: true,
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    assert_eq!(bmc.quirks().await.expect("quirks").name, "ami-megarac");
    bmc.boot_once(BootTarget::Pxe, Some(BootMode::Uefi))
        .await
        .expect("boot");
    assert_eq!(f.st().patches, [(Some("\"1\"".to_string()), 200)]);
}

#[tokio::test]
async fn weak_etag_412_retries_strong_form() {
    let f = FaultBmc::start(Knobs {
        weak_etag_412: true,
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    let ov = bmc
        .boot_once(BootTarget::Cd, Some(BootMode::Legacy))
        .await
        .expect("boot");
    assert_eq!(ov.mode.as_deref(), Some("Legacy"));
    assert_eq!(
        f.st().patches,
        [
            (Some("W/\"1\"".to_string()), 412),
            (Some("\"1\"".to_string()), 200)
        ]
    );
    let caps = bmc.capabilities().await.expect("caps");
    assert!(caps.etag.offered && caps.etag.weak);
}

#[tokio::test]
async fn task_monitor_honours_retry_after() {
    let f = FaultBmc::start(Knobs {
        reset_task: Some(2),
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    assert_eq!(
        bmc.power(PowerAction::On).await.expect("on"),
        PowerState::On
    );
    let polls = f.st().task_polls.clone();
    assert_eq!(polls.len(), 3, "two 202s, then the result");
    for w in polls.windows(2) {
        assert!(
            w[1] - w[0] >= Duration::from_millis(900),
            "Retry-After: 1 honoured between polls, got {:?}",
            w[1] - w[0]
        );
    }

    f.st().knobs.task_fails = true;
    match bmc.power(PowerAction::Off).await {
        Err(BmcError::TaskFailed { state, message, .. }) => {
            assert_eq!(state, "Exception");
            assert_eq!(message, "Power supply fault");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
}

#[tokio::test]
async fn success_by_status_code_not_body() {
    let f = FaultBmc::start(Knobs {
        ok_with_error_body: true,
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    let ov = bmc
        .boot_once(BootTarget::Pxe, None)
        .await
        .expect("200 + error body is success");
    assert_eq!(ov.target.as_deref(), Some("Pxe"));
    assert_eq!(
        bmc.power(PowerAction::On).await.expect("on"),
        PowerState::On
    );

    // A refusal with an HTML body: the status decides, the text is kept for the operator.
    f.st().knobs.html_error_on_reset = true;
    match bmc.power(PowerAction::Off).await {
        Err(BmcError::Http {
            status, message, ..
        }) => {
            assert_eq!(status, 400);
            assert!(message.contains("reset refused by policy"), "{message}");
        }
        other => panic!("expected Http 400, got {other:?}"),
    }
}

#[tokio::test]
async fn silently_reverted_boot_mode_is_reported() {
    let f = FaultBmc::start(Knobs {
        revert_boot_mode: true,
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    let err = bmc
        .boot_once(BootTarget::Pxe, Some(BootMode::Legacy))
        .await
        .expect_err("mode reverted");
    match &err {
        BmcError::BootNotApplied { wanted, actual } => {
            assert_eq!(wanted.mode.as_deref(), Some("Legacy"));
            assert_eq!(actual.mode.as_deref(), Some("UEFI"));
            assert_eq!(actual.target.as_deref(), Some("Pxe"));
        }
        other => panic!("expected BootNotApplied, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("mode Legacy") && msg.contains("mode UEFI"),
        "{msg}"
    );
}

#[tokio::test]
async fn paged_collection_and_trailing_slash_links() {
    let f = FaultBmc::start(Knobs::default()).await;
    // Default: the first member, found behind a `Systems/` link the BMC only serves as `Systems`.
    assert_eq!(
        f.client().system_uri().await.expect("discover"),
        "/redfish/v1/Systems/sys-a"
    );
    // A chosen system on the second page of the collection.
    let bmc = client_with(
        f.url(),
        BmcOptions {
            system: Some("sys-b".into()),
            ..options()
        },
    );
    assert_eq!(
        bmc.system_uri().await.expect("discover"),
        "/redfish/v1/Systems/sys-b"
    );
    let bmc = client_with(
        f.url(),
        BmcOptions {
            system: Some("sys-z".into()),
            ..options()
        },
    );
    assert!(matches!(
        bmc.system_uri().await,
        Err(BmcError::Protocol { .. })
    ));
}

#[tokio::test]
async fn server_errors_are_retried_a_bounded_number_of_times() {
    let f = FaultBmc::start(Knobs {
        fail_next_gets: 2,
        ..Knobs::default()
    })
    .await;
    let bmc = f.client();
    assert_eq!(
        bmc.power_state().await.expect("after two 500s"),
        PowerState::Off
    );

    f.st().knobs.fail_next_gets = 100;
    match bmc.power_state().await {
        Err(BmcError::Http {
            status, message, ..
        }) => {
            assert_eq!(status, 500);
            assert!(message.contains("busy"), "{message}");
        }
        other => panic!("expected Http 500, got {other:?}"),
    }
    // 1 try + 3 retries, no more.
    assert_eq!(f.st().knobs.fail_next_gets, 96);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_limited_per_bmc() {
    let f = FaultBmc::start(Knobs {
        slow: Some(Duration::from_millis(150)),
        ..Knobs::default()
    })
    .await;
    let bmc = client_with(
        f.url(),
        BmcOptions {
            max_concurrent_requests: 2,
            ..options()
        },
    );
    bmc.power_state().await.expect("warm up");
    let calls = (0..6).map(|_| bmc.power_state());
    for r in futures::future::join_all(calls).await {
        assert_eq!(r.expect("state"), PowerState::Off);
    }
    let max = f.st().max_in_flight;
    assert!(max <= 2, "at most 2 requests in flight, saw {max}");
    assert_eq!(max, 2);
}

/// A TCP proxy in front of the fault BMC that, when armed, resets (RST) the next request that
/// arrives on a connection which already carried one: a kept-alive connection dying under reuse.
async fn reset_proxy(
    backend: SocketAddr,
    arm: Arc<AtomicBool>,
    conns: Arc<AtomicUsize>,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind proxy");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            conns.fetch_add(1, Ordering::SeqCst);
            let arm = arm.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                // Linger 0: dropping the socket sends RST instead of FIN.
                #[allow(deprecated)]
                let _ = client.set_linger(Some(Duration::ZERO));
                let (mut cr, mut cw) = client.split();
                let (mut sr, mut sw) = server.split();
                let mut served = 0usize;
                let (mut a, mut b) = ([0u8; 16384], [0u8; 16384]);
                loop {
                    tokio::select! {
                        n = cr.read(&mut a) => {
                            let Ok(n) = n else { return };
                            if n == 0 { return; }
                            let requests = a[..n].windows(11).filter(|w| w == b" HTTP/1.1\r\n").count();
                            if requests > 0 && served > 0 && arm.swap(false, Ordering::SeqCst) {
                                return; // RST
                            }
                            served += requests;
                            if sw.write_all(&a[..n]).await.is_err() { return; }
                        }
                        n = sr.read(&mut b) => {
                            let Ok(n) = n else { return };
                            if n == 0 { return; }
                            if cw.write_all(&b[..n]).await.is_err() { return; }
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn connection_reset_on_a_kept_alive_connection_is_retried() {
    let f = FaultBmc::start(Knobs::default()).await;
    let arm = Arc::new(AtomicBool::new(false));
    let conns = Arc::new(AtomicUsize::new(0));
    let proxy = reset_proxy(f.addr, arm.clone(), conns.clone()).await;
    let bmc = client_with(format!("http://{proxy}"), options());
    bmc.power_state().await.expect("first");
    let before = conns.load(Ordering::SeqCst);
    arm.store(true, Ordering::SeqCst);
    assert_eq!(
        bmc.power_state().await.expect("after reset"),
        PowerState::Off
    );
    assert!(!arm.load(Ordering::SeqCst), "the reset was injected");
    assert!(
        conns.load(Ordering::SeqCst) > before,
        "the retry used a new connection"
    );
    bmc.close().await.expect("close");
    assert!(f.st().sessions.is_empty());
}

#[tokio::test]
async fn a_bmc_that_never_answers_times_out() {
    // Accepts connections and never says a word.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let bmc = client_with(
        format!("http://{addr}"),
        BmcOptions {
            request_timeout: Duration::from_millis(500),
            ..options()
        },
    );
    let res = tokio::time::timeout(Duration::from_secs(20), bmc.power_state())
        .await
        .expect("the client gave up on its own");
    assert!(
        matches!(res, Err(BmcError::Timeout { .. })),
        "expected Timeout, got {res:?}"
    );
    silent.abort();

    // Nobody listening at all: connect errors, retried a bounded number of times.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let bmc = client_with(format!("http://{closed}"), options());
    let res = tokio::time::timeout(Duration::from_secs(20), bmc.power_state())
        .await
        .expect("bounded");
    assert!(
        matches!(res, Err(BmcError::Transport { .. })),
        "expected Transport, got {res:?}"
    );
}
