//! HTTP to one BMC: authentication (Redfish sessions with basic auth as fallback), ETags and
//! `If-Match`, task monitors, timeouts, bounded retries and the per-BMC limit of concurrent requests.
//!
//! Sessions: `POST` to the service root's `Links.Sessions`; the token comes in `X-Auth-Token` and
//! the session URI in `Location` or, on some BMCs, only in the body's `@odata.id`. A 401 on a
//! session token logs in again once. The session is deleted on `close()` and, failing that, when the
//! transport is dropped, because BMCs cap sessions and lock users out when they pile up.
//!
//! Success is decided by the status code alone: some BMCs answer 200 with an `error` object that
//! only carries informational messages, others send error bodies that are not JSON.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue, ETAG, IF_MATCH, LOCATION, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;
use tokio::sync::Semaphore;

use super::tls::TlsPolicy;
use super::BmcError;

/// The service root; the only path ever built by hand (DSP0266 §6.3).
pub(crate) const SERVICE_ROOT: &str = "/redfish/v1/";

/// A BMC password. Its `Debug` and `Display` never show it.
#[derive(Clone)]
pub struct Password(String);

impl Password {
    /// Wrap a password.
    pub fn new(p: impl Into<String>) -> Self {
        Password(p.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where and how to reach one BMC.
#[derive(Clone, Debug)]
pub struct BmcEndpoint {
    /// Redfish service URL, e.g. `https://10.0.0.5` (a path up to `/redfish/v1` is ignored).
    pub url: String,
    /// Redfish user name.
    pub username: String,
    /// Password.
    pub password: Password,
    /// TLS verification.
    pub tls: TlsPolicy,
}

impl BmcEndpoint {
    /// From a BMC record of the inventory and its decrypted password.
    pub fn from_inventory(bmc: &crate::domain::Bmc, password: Password) -> Result<Self, BmcError> {
        Ok(BmcEndpoint {
            url: bmc.url.clone(),
            username: bmc.username.clone(),
            password,
            tls: TlsPolicy::from_inventory(bmc.tls, bmc.fingerprint.as_deref())?,
        })
    }
}

/// Timeouts, retries and limits of the client. `Default` suits real BMCs; tests shorten them.
#[derive(Clone, Debug)]
pub struct BmcOptions {
    /// Whole-request timeout (connect, send, answer, body).
    pub request_timeout: Duration,
    /// TCP/TLS connect timeout.
    pub connect_timeout: Duration,
    /// Retries after a 5xx answer or a broken connection (so at most `1 + max_retries` tries).
    pub max_retries: u32,
    /// First back-off between retries; doubles each time, capped at 8x.
    pub retry_backoff: Duration,
    /// Longest `Retry-After` this client honours.
    pub max_retry_after: Duration,
    /// Requests in flight to this BMC at once.
    pub max_concurrent_requests: usize,
    /// Deadline for a power state to reach its target.
    pub power_timeout: Duration,
    /// Interval between `PowerState` polls and read-backs.
    pub poll_interval: Duration,
    /// Deadline for a task monitor to finish.
    pub task_timeout: Duration,
    /// Which system to drive when the BMC has several: its `Id` or `@odata.id`. Default: the first.
    pub system: Option<String>,
}

impl Default for BmcOptions {
    fn default() -> Self {
        BmcOptions {
            request_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            max_retries: 3,
            retry_backoff: Duration::from_millis(500),
            max_retry_after: Duration::from_secs(30),
            max_concurrent_requests: 4,
            power_timeout: Duration::from_secs(300),
            poll_interval: Duration::from_secs(2),
            task_timeout: Duration::from_secs(600),
            system: None,
        }
    }
}

/// How the client authenticates to the BMC right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Not logged in yet.
    None,
    /// A Redfish session (`X-Auth-Token`).
    Session,
    /// HTTP basic authentication on every request.
    Basic,
}

#[derive(Clone)]
enum AuthState {
    Unknown,
    Session { token: String, uri: Option<String> },
    Basic,
    Closed,
}

/// An answer from the BMC.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Option<Value>,
    pub text: String,
}

impl Answer {
    /// The ETag of the answer: header first, then `@odata.etag`.
    pub fn etag(&self) -> Option<String> {
        self.headers
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| {
                self.body
                    .as_ref()
                    .and_then(|b| b.get("@odata.etag"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .filter(|s| !s.is_empty())
    }

    fn location(&self) -> Option<String> {
        self.headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

/// A JSON resource and its ETag.
#[derive(Debug, Clone)]
pub(crate) struct Doc {
    pub uri: String,
    pub json: Value,
    pub etag: Option<String>,
}

/// HTTP to one BMC.
pub(crate) struct Transport {
    http: reqwest::Client,
    base: Url,
    username: String,
    password: Password,
    tls: TlsPolicy,
    opts: BmcOptions,
    auth: Mutex<AuthState>,
    login_gate: tokio::sync::Mutex<()>,
    limit: Arc<Semaphore>,
    if_match_required: AtomicBool,
    sessions_linked: AtomicBool,
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::PATCH
    )
}

/// `W/"x"` -> `"x"`.
fn strong_form(etag: &str) -> Option<String> {
    etag.strip_prefix("W/").map(str::to_string)
}

/// Redfish error message of an error answer, or the start of a non-JSON body.
pub(crate) fn error_message(body: Option<&Value>, text: &str) -> String {
    if let Some(err) = body.and_then(|b| b.get("error")) {
        let mut parts = Vec::new();
        if let Some(m) = err.get("message").and_then(Value::as_str) {
            parts.push(m.to_string());
        }
        if let Some(infos) = err.get("@Message.ExtendedInfo").and_then(Value::as_array) {
            for i in infos {
                let id = i.get("MessageId").and_then(Value::as_str).unwrap_or("");
                let msg = i.get("Message").and_then(Value::as_str).unwrap_or("");
                parts.push(format!("{id}: {msg}").trim_matches([':', ' ']).to_string());
            }
        }
        if !parts.is_empty() {
            return parts.join("; ");
        }
    }
    let t: String = text.chars().filter(|c| !c.is_control()).take(200).collect();
    if t.trim().is_empty() {
        "(empty body)".into()
    } else {
        t.trim().to_string()
    }
}

fn transport_reason(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn parse_retry_after(h: &HeaderMap) -> Option<Duration> {
    h.get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

impl Transport {
    pub fn new(ep: &BmcEndpoint, opts: BmcOptions) -> Result<Self, BmcError> {
        let mut base = Url::parse(ep.url.trim())
            .map_err(|e| BmcError::Config(format!("BMC URL `{}`: {e}", ep.url)))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(BmcError::Config(format!(
                "BMC URL `{}` must be http(s)://host[:port]",
                ep.url
            )));
        }
        if !base.username().is_empty() || base.password().is_some() {
            return Err(BmcError::Config(
                "credentials belong in the user name and password, not the BMC URL".into(),
            ));
        }
        base.set_path("/");
        base.set_query(None);
        base.set_fragment(None);
        if opts.max_concurrent_requests == 0 {
            return Err(BmcError::Config(
                "max_concurrent_requests must be at least 1".into(),
            ));
        }
        let mut builder = reqwest::Client::builder()
            .timeout(opts.request_timeout)
            .connect_timeout(opts.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("plinth/", env!("CARGO_PKG_VERSION")));
        if base.scheme() == "https" {
            builder = builder.use_preconfigured_tls(ep.tls.client_config()?);
        }
        let http = builder
            .build()
            .map_err(|e| BmcError::Config(format!("HTTP client: {e}")))?;
        Ok(Transport {
            http,
            base,
            username: ep.username.clone(),
            password: ep.password.clone(),
            tls: ep.tls.clone(),
            limit: Arc::new(Semaphore::new(opts.max_concurrent_requests)),
            opts,
            auth: Mutex::new(AuthState::Unknown),
            login_gate: tokio::sync::Mutex::new(()),
            if_match_required: AtomicBool::new(false),
            sessions_linked: AtomicBool::new(false),
        })
    }

    pub fn options(&self) -> &BmcOptions {
        &self.opts
    }

    pub fn tls(&self) -> &TlsPolicy {
        &self.tls
    }

    pub fn auth_mode(&self) -> AuthMode {
        match &*self.lock_auth() {
            AuthState::Session { .. } => AuthMode::Session,
            AuthState::Basic => AuthMode::Basic,
            AuthState::Unknown | AuthState::Closed => AuthMode::None,
        }
    }

    pub fn sessions_linked(&self) -> bool {
        self.sessions_linked.load(Ordering::Relaxed)
    }

    pub fn if_match_required(&self) -> bool {
        self.if_match_required.load(Ordering::Relaxed)
    }

    pub fn require_if_match(&self) {
        self.if_match_required.store(true, Ordering::Relaxed);
    }

    fn lock_auth(&self) -> std::sync::MutexGuard<'_, AuthState> {
        // A poisoned lock only means another task panicked mid-update; the state is still usable.
        self.auth.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolve a link against the BMC's origin. Absolute links keep only their path, so a BMC
    /// cannot send our credentials to another host; fragments (`#/StorageControllers/0`) go.
    pub fn resolve(&self, link: &str) -> Result<Url, BmcError> {
        let path = if let Some(rest) = link
            .strip_prefix("https://")
            .or_else(|| link.strip_prefix("http://"))
        {
            match rest.find('/') {
                Some(i) => &rest[i..],
                None => "/",
            }
        } else {
            link
        };
        let path = path.split('#').next().unwrap_or(path);
        let path = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        };
        self.base.join(&path).map_err(|e| BmcError::Protocol {
            path: link.to_string(),
            reason: format!("not a usable link: {e}"),
        })
    }

    /// The path (and query) of a link, as shown in errors and logs.
    pub fn path_of(&self, link: &str) -> String {
        match self.resolve(link) {
            Ok(u) => match u.query() {
                Some(q) => format!("{}?{q}", u.path()),
                None => u.path().to_string(),
            },
            Err(_) => link.to_string(),
        }
    }

    /// One request with authentication, retries and the concurrency limit; no status check.
    pub async fn request(
        &self,
        method: Method,
        link: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, BmcError> {
        self.ensure_login().await?;
        let mut reauthed = false;
        loop {
            let auth = self.lock_auth().clone();
            let ans = self
                .request_as(&auth, method.clone(), link, body, if_match)
                .await?;
            if ans.status == StatusCode::UNAUTHORIZED {
                match auth {
                    AuthState::Session { token, .. } if !reauthed => {
                        tracing::info!(path = %self.path_of(link), "BMC session expired; logging in again");
                        self.relogin(&token).await?;
                        reauthed = true;
                        continue;
                    }
                    _ => {
                        return Err(BmcError::Unauthorized(format!(
                            "{method} {}: {}",
                            self.path_of(link),
                            error_message(ans.body.as_ref(), &ans.text)
                        )))
                    }
                }
            }
            return Ok(ans);
        }
    }

    /// One request as `auth`, retried on 5xx and broken connections.
    async fn request_as(
        &self,
        auth: &AuthState,
        method: Method,
        link: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, BmcError> {
        let url = self.resolve(link)?;
        let path = self.path_of(link);
        let mut attempt = 0u32;
        loop {
            let permit = self
                .limit
                .acquire()
                .await
                .map_err(|_| BmcError::Config("BMC client is closed".into()))?;
            let mut req = self
                .http
                .request(method.clone(), url.clone())
                .header("Accept", "application/json")
                .header("OData-Version", "4.0");
            req = match auth {
                AuthState::Session { token, .. } => req.header("X-Auth-Token", token),
                AuthState::Basic => req.basic_auth(&self.username, Some(self.password.expose())),
                AuthState::Unknown | AuthState::Closed => req,
            };
            if let Some(tag) = if_match {
                if let Ok(v) = HeaderValue::from_str(tag) {
                    req = req.header(IF_MATCH, v);
                }
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let started = Instant::now();
            let sent = req.send().await;
            let result = match sent {
                Ok(resp) => {
                    let status = resp.status();
                    let headers = resp.headers().clone();
                    match resp.bytes().await {
                        Ok(bytes) => Ok((status, headers, bytes)),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            drop(permit);
            let retry_left = attempt < self.opts.max_retries;
            match result {
                Err(e) if e.is_timeout() => {
                    tracing::warn!(%method, %path, after = ?self.opts.request_timeout, "BMC request timed out");
                    return Err(BmcError::Timeout {
                        method: method.to_string(),
                        path,
                        after: self.opts.request_timeout,
                    });
                }
                Err(e) => {
                    let reason = transport_reason(&e);
                    // A request that never left (connect failed) is safe to send again; others
                    // only when repeating them does no harm.
                    if retry_left && (e.is_connect() || is_idempotent(&method)) {
                        tracing::warn!(%method, %path, attempt, %reason, "BMC connection failed; retrying");
                        self.backoff(attempt, None).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(BmcError::Transport {
                        method: method.to_string(),
                        path,
                        reason,
                    });
                }
                Ok((status, headers, bytes)) => {
                    let text = String::from_utf8_lossy(&bytes).into_owned();
                    let json = if bytes.is_empty() {
                        None
                    } else {
                        serde_json::from_slice::<Value>(&bytes).ok()
                    };
                    tracing::debug!(%method, %path, status = status.as_u16(), elapsed_ms = started.elapsed().as_millis() as u64, "BMC request");
                    let transient =
                        status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED;
                    if transient
                        && retry_left
                        && (is_idempotent(&method) || status == StatusCode::SERVICE_UNAVAILABLE)
                    {
                        tracing::warn!(%method, %path, status = status.as_u16(), attempt, "BMC answered a server error; retrying");
                        self.backoff(attempt, parse_retry_after(&headers)).await;
                        attempt += 1;
                        continue;
                    }
                    return Ok(Answer {
                        status,
                        headers,
                        body: json,
                        text,
                    });
                }
            }
        }
    }

    async fn backoff(&self, attempt: u32, retry_after: Option<Duration>) {
        let exp = self.opts.retry_backoff * 2u32.saturating_pow(attempt.min(3));
        let wait = retry_after
            .map(|d| d.min(self.opts.max_retry_after))
            .unwrap_or(exp);
        tokio::time::sleep(wait).await;
    }

    /// Turn a non-2xx answer into an error.
    pub fn check(&self, method: &Method, link: &str, ans: Answer) -> Result<Answer, BmcError> {
        if ans.status.is_success() {
            if let Some(err) = ans.body.as_ref().and_then(|b| b.get("error")) {
                // Success by status code: HPE iLO, for one, wraps informational messages of a
                // successful PATCH in an `error` object. Keep them in the log.
                tracing::info!(%method, path = %self.path_of(link), status = ans.status.as_u16(),
                    message = %error_message(ans.body.as_ref(), &err.to_string()),
                    "BMC reported success with an error-shaped body");
            }
            Ok(ans)
        } else {
            let message = if ans.status.is_redirection() {
                // Redirects are not followed (credentials stay on the configured origin).
                format!(
                    "the BMC redirects to {}; configure that URL instead",
                    ans.location().as_deref().unwrap_or("(no Location)")
                )
            } else {
                error_message(ans.body.as_ref(), &ans.text)
            };
            Err(BmcError::Http {
                method: method.to_string(),
                path: self.path_of(link),
                status: ans.status.as_u16(),
                message,
            })
        }
    }

    /// GET a JSON resource. A 404 is retried once with the trailing slash toggled (BMCs disagree
    /// on `/Systems` vs `/Systems/`).
    pub async fn get(&self, link: &str) -> Result<Doc, BmcError> {
        let ans = self.request(Method::GET, link, None, None).await?;
        let (link, ans) = if ans.status == StatusCode::NOT_FOUND {
            let other = match link.strip_suffix('/') {
                Some(s) => s.to_string(),
                None => format!("{link}/"),
            };
            let again = self.request(Method::GET, &other, None, None).await?;
            if again.status.is_success() {
                (other, again)
            } else {
                (link.to_string(), ans)
            }
        } else {
            (link.to_string(), ans)
        };
        let ans = self.check(&Method::GET, &link, ans)?;
        let etag = ans.etag();
        match ans.body {
            Some(json @ Value::Object(_)) => Ok(Doc {
                uri: link,
                json,
                etag,
            }),
            _ => Err(BmcError::Protocol {
                path: self.path_of(&link),
                reason: format!(
                    "expected a JSON object, got: {}",
                    error_message(None, &ans.text)
                ),
            }),
        }
    }

    /// PATCH with `If-Match`: the given ETag first; on 412/428 the strong form of a weak ETag, then
    /// without `If-Match` (or, on 428, with a freshly read ETag), as the known clients do.
    pub async fn patch(
        &self,
        link: &str,
        body: &Value,
        etag: Option<String>,
    ) -> Result<Answer, BmcError> {
        let mut etag = etag;
        if etag.is_none() && self.if_match_required() {
            // The BMC wants If-Match: its ETag if it shows one, else the wildcard.
            etag = Some(
                self.fetch_etag(link)
                    .await?
                    .unwrap_or_else(|| "*".to_string()),
            );
        }
        let mut queue: Vec<Option<String>> = vec![etag.clone()];
        let mut tried: Vec<Option<String>> = Vec::new();
        let mut last: Option<Answer> = None;
        while let Some(cand) = queue.first().cloned() {
            queue.remove(0);
            if tried.contains(&cand) || tried.len() >= 5 {
                continue;
            }
            tried.push(cand.clone());
            let ans = self
                .request(Method::PATCH, link, Some(body), cand.as_deref())
                .await?;
            match ans.status {
                StatusCode::PRECONDITION_FAILED | StatusCode::PRECONDITION_REQUIRED => {
                    let required = ans.status == StatusCode::PRECONDITION_REQUIRED;
                    tracing::info!(path = %self.path_of(link), status = ans.status.as_u16(),
                        if_match = cand.is_some(), "BMC refused the ETag precondition; retrying");
                    if required {
                        self.require_if_match();
                    }
                    match &cand {
                        Some(tag) => {
                            if let Some(strong) = strong_form(tag) {
                                queue.push(Some(strong));
                            }
                            if required {
                                // The resource may have changed: read its ETag again.
                                if let Some(fresh) = self.fetch_etag(link).await? {
                                    if let Some(strong) = strong_form(&fresh) {
                                        queue.push(Some(strong));
                                    }
                                    queue.push(Some(fresh));
                                }
                                queue.push(Some("*".into()));
                            } else {
                                queue.push(None);
                            }
                        }
                        None => {
                            if let Some(fresh) = self.fetch_etag(link).await? {
                                queue.push(Some(fresh.clone()));
                                if let Some(strong) = strong_form(&fresh) {
                                    queue.push(Some(strong));
                                }
                            }
                            queue.push(Some("*".into()));
                        }
                    }
                    last = Some(ans);
                }
                _ => return self.finish(Method::PATCH, link, ans).await,
            }
        }
        match last {
            Some(ans) => self.check(&Method::PATCH, link, ans),
            None => Err(BmcError::Protocol {
                path: self.path_of(link),
                reason: "no PATCH was sent".into(),
            }),
        }
    }

    async fn fetch_etag(&self, link: &str) -> Result<Option<String>, BmcError> {
        Ok(self.get(link).await?.etag)
    }

    /// POST (an action, usually) and follow a task monitor if the BMC hands one out.
    pub async fn post(&self, link: &str, body: &Value) -> Result<Answer, BmcError> {
        let ans = self.request(Method::POST, link, Some(body), None).await?;
        self.finish(Method::POST, link, ans).await
    }

    /// Check an answer; on 202 with `Location`, poll the task monitor to its end.
    async fn finish(&self, method: Method, link: &str, ans: Answer) -> Result<Answer, BmcError> {
        if ans.status == StatusCode::ACCEPTED {
            if let Some(monitor) = ans.location() {
                let first_wait = parse_retry_after(&ans.headers);
                return self.wait_task(&monitor, first_wait).await;
            }
        }
        self.check(&method, link, ans)
    }

    /// Poll a task monitor (DSP0266 §12.2): 202 while running, then the final answer. A monitor
    /// that answers with a Task resource is read by its `TaskState`.
    pub async fn wait_task(
        &self,
        monitor: &str,
        first_wait: Option<Duration>,
    ) -> Result<Answer, BmcError> {
        let deadline = Instant::now() + self.opts.task_timeout;
        let mut wait = first_wait;
        let mut last_state = String::from("(not polled)");
        loop {
            let pause = wait
                .unwrap_or(self.opts.poll_interval)
                .min(self.opts.max_retry_after);
            if Instant::now() + pause > deadline {
                return Err(BmcError::Deadline {
                    what: format!("task {}", self.path_of(monitor)),
                    after: self.opts.task_timeout,
                    last: last_state,
                });
            }
            tokio::time::sleep(pause).await;
            let ans = self.request(Method::GET, monitor, None, None).await?;
            wait = parse_retry_after(&ans.headers);
            if ans.status == StatusCode::ACCEPTED {
                last_state = ans
                    .body
                    .as_ref()
                    .and_then(|b| b.get("TaskState"))
                    .and_then(Value::as_str)
                    .unwrap_or("running")
                    .to_string();
                continue;
            }
            let ans = self.check(&Method::GET, monitor, ans)?;
            let state = ans
                .body
                .as_ref()
                .and_then(|b| b.get("TaskState"))
                .and_then(Value::as_str)
                .map(str::to_string);
            match state.as_deref() {
                Some(
                    "New" | "Starting" | "Running" | "Pending" | "Suspended" | "Stopping"
                    | "Cancelling" | "Service",
                ) => {
                    last_state = state.unwrap_or_default();
                    continue;
                }
                Some(s @ ("Exception" | "Killed" | "Cancelled" | "Interrupted")) => {
                    let messages = ans
                        .body
                        .as_ref()
                        .and_then(|b| b.get("Messages"))
                        .and_then(Value::as_array)
                        .map(|ms| {
                            ms.iter()
                                .filter_map(|m| m.get("Message").and_then(Value::as_str))
                                .collect::<Vec<_>>()
                                .join("; ")
                        })
                        .unwrap_or_default();
                    return Err(BmcError::TaskFailed {
                        task: self.path_of(monitor),
                        state: s.to_string(),
                        message: messages,
                    });
                }
                _ => return Ok(ans),
            }
        }
    }

    /// Log in if not yet logged in.
    async fn ensure_login(&self) -> Result<(), BmcError> {
        match &*self.lock_auth() {
            AuthState::Unknown => {}
            AuthState::Closed => {
                return Err(BmcError::Config("BMC client is closed".into()));
            }
            _ => return Ok(()),
        }
        let _gate = self.login_gate.lock().await;
        if !matches!(&*self.lock_auth(), AuthState::Unknown) {
            return Ok(());
        }
        let state = self.login().await?;
        *self.lock_auth() = state;
        Ok(())
    }

    /// After a 401 on `stale`: log in again unless another task already did. The stale session
    /// is deleted first, best effort: a 401 usually means it expired, but if the BMC still holds
    /// it, it must not pile up.
    async fn relogin(&self, stale: &str) -> Result<(), BmcError> {
        let _gate = self.login_gate.lock().await;
        let old = self.lock_auth().clone();
        match &old {
            AuthState::Session { token, .. } if token != stale => return Ok(()),
            AuthState::Closed => return Err(BmcError::Config("BMC client is closed".into())),
            _ => {}
        }
        if let AuthState::Session { uri: Some(uri), .. } = &old {
            match self.request_as(&old, Method::DELETE, uri, None, None).await {
                Ok(a) => {
                    tracing::debug!(session = %self.path_of(uri), status = a.status.as_u16(), "stale BMC session deleted")
                }
                Err(e) => tracing::debug!(error = %e, "could not delete the stale BMC session"),
            }
        }
        let state = self.login().await?;
        *self.lock_auth() = state;
        Ok(())
    }

    /// Create a session through the service root's `Links.Sessions`, else settle for basic auth.
    async fn login(&self) -> Result<AuthState, BmcError> {
        let mut root = self
            .request_as(&AuthState::Unknown, Method::GET, SERVICE_ROOT, None, None)
            .await?;
        if root.status == StatusCode::UNAUTHORIZED || root.status == StatusCode::FORBIDDEN {
            // Some BMCs protect even the service root.
            root = self
                .request_as(&AuthState::Basic, Method::GET, SERVICE_ROOT, None, None)
                .await?;
        }
        if root.status == StatusCode::UNAUTHORIZED {
            return Err(BmcError::Unauthorized(format!(
                "GET {SERVICE_ROOT}: {}",
                error_message(root.body.as_ref(), &root.text)
            )));
        }
        let root = self.check(&Method::GET, SERVICE_ROOT, root)?;
        let sessions = root
            .body
            .as_ref()
            .and_then(|b| b.pointer("/Links/Sessions/@odata.id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let Some(sessions) = sessions else {
            tracing::info!("BMC links no session service; using basic auth");
            return Ok(AuthState::Basic);
        };
        self.sessions_linked.store(true, Ordering::Relaxed);
        let body = serde_json::json!({
            "UserName": self.username,
            "Password": self.password.expose(),
        });
        let ans = self
            .request_as(
                &AuthState::Unknown,
                Method::POST,
                &sessions,
                Some(&body),
                None,
            )
            .await?;
        if ans.status == StatusCode::UNAUTHORIZED || ans.status == StatusCode::FORBIDDEN {
            // Wrong credentials: trying them again with basic auth only brings a lock-out closer.
            return Err(BmcError::Unauthorized(format!(
                "POST {}: HTTP {}: {}",
                self.path_of(&sessions),
                ans.status.as_u16(),
                error_message(ans.body.as_ref(), &ans.text)
            )));
        }
        if !ans.status.is_success() {
            tracing::warn!(status = ans.status.as_u16(),
                message = %error_message(ans.body.as_ref(), &ans.text),
                "BMC refused a new session; using basic auth");
            return Ok(AuthState::Basic);
        }
        let token = ans
            .headers
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let uri = ans.location().or_else(|| {
            ans.body
                .as_ref()
                .and_then(|b| b.get("@odata.id"))
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        match token {
            Some(token) if !token.is_empty() => {
                if uri.is_none() {
                    tracing::warn!("BMC gave a session token but no session URI; it cannot be deleted and will expire on the BMC");
                }
                tracing::debug!(session = ?uri.as_deref().map(|u| self.path_of(u)), "BMC session created");
                Ok(AuthState::Session { token, uri })
            }
            _ => {
                tracing::info!("BMC session answer carried no X-Auth-Token; using basic auth");
                Ok(AuthState::Basic)
            }
        }
    }

    /// Delete the session, if any. Afterwards every request fails.
    pub async fn close(&self) -> Result<(), BmcError> {
        let _gate = self.login_gate.lock().await;
        let prev = std::mem::replace(&mut *self.lock_auth(), AuthState::Closed);
        if let AuthState::Session { uri: Some(uri), .. } = &prev {
            let ans = self
                .request_as(&prev, Method::DELETE, uri, None, None)
                .await?;
            // 404/401: the BMC no longer knows the session (it expired); nothing left to delete.
            let gone =
                ans.status == StatusCode::NOT_FOUND || ans.status == StatusCode::UNAUTHORIZED;
            if !ans.status.is_success() && !gone {
                return Err(BmcError::Http {
                    method: "DELETE".into(),
                    path: self.path_of(uri),
                    status: ans.status.as_u16(),
                    message: error_message(ans.body.as_ref(), &ans.text),
                });
            }
            tracing::debug!(session = %self.path_of(uri), "BMC session deleted");
        }
        Ok(())
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut *self.lock_auth(), AuthState::Closed);
        let AuthState::Session {
            token,
            uri: Some(uri),
        } = state
        else {
            return;
        };
        let Ok(url) = self.resolve(&uri) else { return };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(session = %url.path(), "BMC client dropped outside a runtime; session left to expire");
            return;
        };
        let http = self.http.clone();
        handle.spawn(async move {
            match http
                .delete(url.clone())
                .header("X-Auth-Token", token)
                .send()
                .await
            {
                Ok(r) => {
                    tracing::debug!(session = %url.path(), status = r.status().as_u16(), "BMC session deleted on drop")
                }
                Err(e) => {
                    tracing::warn!(session = %url.path(), error = %e, "could not delete BMC session on drop")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_is_redacted() {
        let ep = BmcEndpoint {
            url: "https://bmc".into(),
            username: "root".into(),
            password: Password::new("hunter2"),
            tls: TlsPolicy::Insecure,
        };
        let shown = format!("{ep:?} {}", ep.password);
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn endpoint_from_inventory() {
        let inv = crate::domain::Bmc {
            url: "https://10.0.0.5".into(),
            username: "root".into(),
            tls: crate::domain::TlsMode::Pinned,
            fingerprint: Some("ab".repeat(32)),
            has_password: true,
        };
        let ep = BmcEndpoint::from_inventory(&inv, Password::new("pw")).expect("endpoint");
        assert!(matches!(ep.tls, TlsPolicy::Pinned(_)));
        let bad = crate::domain::Bmc {
            fingerprint: None,
            ..inv
        };
        assert!(BmcEndpoint::from_inventory(&bad, Password::new("pw")).is_err());
    }

    #[test]
    fn links_resolve_on_the_bmc_origin() {
        let ep = BmcEndpoint {
            url: "http://10.0.0.5:8000/redfish/v1".into(),
            username: "u".into(),
            password: Password::new("p"),
            tls: TlsPolicy::Verify,
        };
        let t = Transport::new(&ep, BmcOptions::default()).expect("transport");
        let u = t
            .resolve("https://evil.example:443/redfish/v1/Systems/1#/x")
            .expect("url");
        assert_eq!(u.as_str(), "http://10.0.0.5:8000/redfish/v1/Systems/1");
        assert_eq!(
            t.resolve("redfish/v1/Managers").expect("rel").path(),
            "/redfish/v1/Managers"
        );
        assert!(Transport::new(
            &BmcEndpoint {
                url: "http://u:p@host".into(),
                ..ep.clone()
            },
            BmcOptions::default()
        )
        .is_err());
    }

    #[test]
    fn error_messages() {
        let body = serde_json::json!({"error": {"message": "bad", "@Message.ExtendedInfo": [
            {"MessageId": "Base.1.0.PropertyValueNotInList", "Message": "Foo not allowed"}]}});
        assert_eq!(
            error_message(Some(&body), ""),
            "bad; Base.1.0.PropertyValueNotInList: Foo not allowed"
        );
        assert_eq!(error_message(None, "<html>\n oops"), "<html> oops");
        assert_eq!(error_message(None, ""), "(empty body)");
        assert_eq!(strong_form("W/\"abc\"").as_deref(), Some("\"abc\""));
        assert_eq!(strong_form("\"abc\""), None);
    }
}
