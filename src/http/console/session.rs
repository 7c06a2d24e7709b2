//! Signing in and out of the console, and what every console request carries: the session
//! (cookie `plinth_session`: `HttpOnly`, `SameSite=Strict`, `Path=/`, and `Secure` when the
//! public URL is https) and, on every POST, the session's CSRF token (a form field `csrf`; a
//! missing or wrong one is a 403 before anything else is read). The sign-in form has its own
//! (login CSRF): a random `plinth_sign_in` cookie minted with the form, whose token the form
//! carries, so another site cannot sign a browser into a session of its choosing. Roles are the API's: a session
//! has its token's role, and every action is an event naming the token.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;

use super::layout;
use crate::http::AppState;
use crate::service::auth::{csrf_matches, csrf_token, sign_in_nonce, token_hash, Session};
use crate::service::{ApiRole, ServiceError, StoreError};

/// The session cookie's name.
pub const COOKIE: &str = "plinth_session";
/// The sign-in form's cookie (login CSRF): a random value whose CSRF token the form carries.
pub const SIGN_IN_COOKIE: &str = "plinth_sign_in";
/// How long a sign-in form stays usable.
const SIGN_IN_SECONDS: i64 = 3600;
/// How long a session lasts (a shift), unless its token expires first.
const SESSION_HOURS: i64 = 12;

/// An error page: a status and a sentence for the tech. Internal detail goes to the log only.
#[derive(Debug)]
pub struct ConsoleError {
    status: StatusCode,
    message: String,
}

impl ConsoleError {
    /// An error with a status and a message shown as it is.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ConsoleError {
            status,
            message: message.into(),
        }
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    /// The sentence shown.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// 400.
    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<ServiceError> for ConsoleError {
    fn from(e: ServiceError) -> Self {
        let status = match &e {
            ServiceError::Invalid(_) | ServiceError::Config(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
            ServiceError::Conflict(_)
            | ServiceError::InvalidTransition { .. }
            | ServiceError::NoBmc(_)
            | ServiceError::Busy(_) => StatusCode::CONFLICT,
            ServiceError::PreconditionFailed { .. } => StatusCode::PRECONDITION_FAILED,
            ServiceError::PreconditionRequired => StatusCode::PRECONDITION_REQUIRED,
            ServiceError::ImportRejected(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ServiceError::Bmc(_) => StatusCode::BAD_GATEWAY,
            ServiceError::Store(_) => {
                tracing::error!(error = %e, "console request failed");
                return Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error; the server log has the detail",
                );
            }
        };
        let message = match &e {
            ServiceError::PreconditionFailed { .. } => {
                "the machine changed meanwhile: reload its page and try again".to_string()
            }
            other => other.to_string(),
        };
        Self::new(status, message)
    }
}

impl From<StoreError> for ConsoleError {
    fn from(e: StoreError) -> Self {
        Self::from(ServiceError::from(e))
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let page = layout::bare(
            "Error",
            html! {
                h1 { "Error " (self.status.as_u16()) }
                p.error role="alert" { (self.message) }
                p { a href="/console" { "Back to the overview" } }
            },
        );
        (self.status, page).into_response()
    }
}

/// A signed-in console user.
#[derive(Clone, Debug)]
pub struct Signed {
    id: String,
    /// The session.
    pub session: Session,
}

impl Signed {
    /// The SHA-256 of the session id, as the database keys the session.
    pub fn session_hash(&self) -> Vec<u8> {
        token_hash(&self.id)
    }

    /// The session's CSRF token, for forms.
    pub fn csrf(&self) -> String {
        csrf_token(&self.id)
    }

    /// Does the session's role reach `role`?
    pub fn can(&self, role: ApiRole) -> bool {
        self.session.token.role >= role
    }

    /// Refuse (403) unless the session's role reaches `role`.
    pub fn require(&self, role: ApiRole) -> Result<(), ConsoleError> {
        if self.can(role) {
            Ok(())
        } else {
            Err(ConsoleError::forbidden(format!(
                "this needs a token with role {role} or higher; you are signed in as {} ({})",
                self.session.token.name, self.session.token.role
            )))
        }
    }

    /// The actor written into events: the token's name, as the API writes it.
    pub fn actor(&self) -> String {
        format!("token:{}", self.session.token.name)
    }
}

/// A cookie's value, if the request has it.
fn cookie_of(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
}

/// The session cookie's value, if the request has one.
fn cookie(parts: &Parts) -> Option<String> {
    cookie_of(&parts.headers, COOKIE)
}

/// Why a request has no session: a page asks the browser to sign in, anything else is refused.
pub enum NoSession {
    /// Go to the sign-in page, then come back here.
    SignIn(String),
    /// Refused (a POST without a session).
    Refused,
    /// The session could not be checked.
    Fault(ConsoleError),
}

impl IntoResponse for NoSession {
    fn into_response(self) -> Response {
        match self {
            NoSession::SignIn(next) => {
                let q = url::form_urlencoded::Serializer::new(String::new())
                    .append_pair("next", &next)
                    .finish();
                Redirect::to(&format!("/console/sign-in?{q}")).into_response()
            }
            NoSession::Refused => {
                ConsoleError::forbidden("sign in first: this needs a console session")
                    .into_response()
            }
            NoSession::Fault(e) => e.into_response(),
        }
    }
}

impl FromRequestParts<AppState> for Signed {
    type Rejection = NoSession;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let reject = || {
            if parts.method == Method::GET || parts.method == Method::HEAD {
                NoSession::SignIn(
                    parts
                        .uri
                        .path_and_query()
                        .map_or("/console".to_string(), |p| p.to_string()),
                )
            } else {
                NoSession::Refused
            }
        };
        let Some(id) = cookie(parts) else {
            return Err(reject());
        };
        match state.tokens.session(&id).await {
            Ok(Some(session)) => Ok(Signed { id, session }),
            Ok(None) => Err(reject()),
            Err(e) => Err(NoSession::Fault(e.into())),
        }
    }
}

/// A console action: a POSTed form from a signed-in session whose `csrf` field matches the
/// session's token (403 otherwise, before any other field is looked at).
pub struct Action {
    /// Who.
    pub who: Signed,
    /// The form's other fields.
    pub fields: HashMap<String, String>,
}

impl Action {
    /// A field, trimmed; `None` when absent or empty.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .get(name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }
}

impl FromRequest<AppState> for Action {
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let who = Signed::from_request_parts(&mut parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let bytes = Bytes::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(|e| {
                ConsoleError::new(e.status(), "the form could not be read").into_response()
            })?;
        let mut fields: HashMap<String, String> = HashMap::new();
        for (k, v) in url::form_urlencoded::parse(&bytes) {
            fields.insert(k.into_owned(), v.into_owned());
        }
        let presented = fields.remove("csrf").unwrap_or_default();
        if !csrf_matches(&who.id, &presented) {
            tracing::warn!(actor = %who.actor(), "console: action refused, missing or wrong CSRF token");
            return Err(ConsoleError::forbidden(
                "this form did not come from your console session (missing or wrong CSRF token): reload the page and try again",
            )
            .into_response());
        }
        Ok(Action { who, fields })
    }
}

/// Where to go after signing in.
#[derive(Debug, serde::Deserialize)]
pub struct Next {
    next: Option<String>,
}

/// Only a console path of this server: never another origin (`//host`, `/\host`).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with("/console")
                && !n.contains("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control) =>
        {
            n.to_string()
        }
        _ => "/console".to_string(),
    }
}

fn sign_in_form(next: &str, csrf: &str, problem: Option<&str>) -> maud::Markup {
    layout::bare(
        "Sign in",
        html! {
            h1 { "Sign in to Plinth" }
            @if let Some(p) = problem { p.error role="alert" { (p) } }
            form method="post" action="/console/sign-in" {
                input type="hidden" name="next" value=(next);
                input type="hidden" name="csrf" value=(csrf);
                label for="token" { "API token" }
                input #token type="password" name="token" autocomplete="off" required autofocus;
                p.hint { "A token from " code { "plinth token create" } "; its role decides what you may do here." }
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// The sign-in cookie's value when it has the shape of one we mint (43 base64url characters).
fn sign_in_cookie(headers: &HeaderMap) -> Option<String> {
    cookie_of(headers, SIGN_IN_COOKIE).filter(|v| {
        v.len() == 43
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// A `Set-Cookie` value of this console: `HttpOnly; SameSite=Strict`, `Secure` when the public
/// URL is https.
fn set_cookie(s: &AppState, name: &str, value: &str, path: &str, max_age: i64) -> HeaderValue {
    let secure = if s.secure_cookies { "; Secure" } else { "" };
    let text = format!(
        "{name}={value}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    );
    // Names, base64url values, paths and digits only: always a valid header value.
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("invalid=; Max-Age=0"))
}

/// The sign-in form, with its cookie: the browser's own if it has one, else a fresh one.
fn sign_in_response(
    s: &AppState,
    headers: &HeaderMap,
    status: StatusCode,
    next: &str,
    problem: Option<&str>,
) -> Response {
    let (nonce, fresh) = match sign_in_cookie(headers) {
        Some(n) => (n, false),
        None => (sign_in_nonce(), true),
    };
    let mut resp = (status, sign_in_form(next, &csrf_token(&nonce), problem)).into_response();
    if fresh {
        resp.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(
                s,
                SIGN_IN_COOKIE,
                &nonce,
                "/console/sign-in",
                SIGN_IN_SECONDS,
            ),
        );
    }
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The sign-in form.
pub async fn sign_in_page(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(n): Query<Next>,
) -> Response {
    sign_in_response(
        &s,
        &headers,
        StatusCode::OK,
        &safe_next(n.next.as_deref()),
        None,
    )
}

/// Sign in with a token: a session cookie and back to where the browser wanted to go. The form
/// must come from this console's sign-in page (login CSRF): its `csrf` field matches the
/// sign-in cookie, which a page of another site can neither read nor make the browser send
/// (`SameSite=Strict`); a request the browser marks `Sec-Fetch-Site: cross-site` is refused
/// too. Refused: 403 and a fresh form.
pub async fn sign_in(State(s): State<AppState>, req: Request) -> Result<Response, ConsoleError> {
    let headers = req.headers().clone();
    let bytes = Bytes::from_request(req, &s)
        .await
        .map_err(|e| ConsoleError::new(e.status(), "the form could not be read"))?;
    let mut token = String::new();
    let mut next = None;
    let mut csrf = String::new();
    for (k, v) in url::form_urlencoded::parse(&bytes) {
        match k.as_ref() {
            "token" => token = v.into_owned(),
            "next" => next = Some(v.into_owned()),
            "csrf" => csrf = v.into_owned(),
            _ => {}
        }
    }
    let next = safe_next(next.as_deref());
    let cross_site = headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site");
    let from_form = sign_in_cookie(&headers).is_some_and(|n| csrf_matches(&n, &csrf));
    if cross_site || !from_form {
        tracing::warn!(cross_site, "console: sign-in refused, not posted from the sign-in form (missing or wrong CSRF token)");
        return Ok(sign_in_response(
            &s,
            &headers,
            StatusCode::FORBIDDEN,
            &next,
            Some("This sign-in did not come from the console's sign-in form (missing or wrong CSRF token): sign in again here."),
        ));
    }
    let Some((id, session)) = s
        .tokens
        .sign_in(&token, chrono::Duration::hours(SESSION_HOURS))
        .await?
    else {
        tracing::info!("console: sign-in refused");
        return Ok(sign_in_response(
            &s,
            &headers,
            StatusCode::UNAUTHORIZED,
            &next,
            Some("That token is not valid: unknown, revoked or expired."),
        ));
    };
    tracing::info!(actor = %format!("token:{}", session.token.name), role = %session.token.role, "console: signed in");
    let max_age = (session.expires_at - chrono::Utc::now())
        .num_seconds()
        .max(0);
    let mut resp = Redirect::to(&next).into_response();
    resp.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&s, COOKIE, &id, "/", max_age),
    );
    resp.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&s, SIGN_IN_COOKIE, "", "/console/sign-in", 0),
    );
    Ok(resp)
}

/// Sign out: the session is deleted on the server and the cookie cleared.
pub async fn sign_out(State(s): State<AppState>, a: Action) -> Result<Response, ConsoleError> {
    s.tokens.sign_out(&a.who.id).await?;
    tracing::info!(actor = %a.who.actor(), "console: signed out");
    let mut resp = Redirect::to("/console/sign-in").into_response();
    resp.headers_mut()
        .insert(header::SET_COOKIE, set_cookie(&s, COOKIE, "", "/", 0));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_paths_are_followed_after_sign_in() {
        assert_eq!(
            safe_next(Some("/console/racks?site=a")),
            "/console/racks?site=a"
        );
        for bad in [
            "//evil.example/",
            "https://evil.example/",
            "/console//evil",
            "/\\evil",
            "/api/v1/tokens",
        ] {
            assert_eq!(safe_next(Some(bad)), "/console", "{bad}");
        }
        assert_eq!(safe_next(None), "/console");
    }
}
