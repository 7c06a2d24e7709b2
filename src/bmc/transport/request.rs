//! One request to a BMC: authentication header, the per-BMC limit of concurrent requests, bounded
//! retries (5xx answers and broken connections, only where repeating does no harm, honouring
//! `Retry-After` up to a cap), the whole-request timeout, and the status check. Success is decided
//! by the status code alone: some BMCs answer 200 with an `error` object that only carries
//! informational messages, others send error bodies that are not JSON. Redirects are not
//! followed, so credentials stay on the configured origin.

use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue, IF_MATCH, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::session::AuthState;
use super::{Answer, Doc, Transport};
use crate::bmc::odata::{list, prop, text};
use crate::bmc::BmcError;

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::PATCH
    )
}

/// Redfish error message of an error answer, or the start of a non-JSON body.
pub(super) fn error_message(body: Option<&Value>, raw: &str) -> String {
    if let Some(err) = body.and_then(|b| prop(b, "error")) {
        let mut parts = Vec::new();
        if let Some(m) = text(err, "message") {
            parts.push(m);
        }
        for i in list(err, "@Message.ExtendedInfo") {
            let id = text(i, "MessageId").unwrap_or_default();
            let msg = text(i, "Message").unwrap_or_default();
            parts.push(format!("{id}: {msg}").trim_matches([':', ' ']).to_string());
        }
        if !parts.is_empty() {
            return parts.join("; ");
        }
    }
    let t: String = raw.chars().filter(|c| !c.is_control()).take(200).collect();
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

pub(super) fn parse_retry_after(h: &HeaderMap) -> Option<Duration> {
    h.get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

impl Transport {
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
    pub(super) async fn request_as(
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
            if let Some(err) = ans.body.as_ref().and_then(|b| prop(b, "error")) {
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
    /// GET a resource without credentials (the service root), status checked.
    pub async fn get_anonymous(&self, link: &str) -> Result<Value, BmcError> {
        let ans = self
            .request_as(&AuthState::Unknown, Method::GET, link, None, None)
            .await?;
        let ans = self.check(&Method::GET, link, ans)?;
        match ans.body {
            Some(json @ Value::Object(_)) => Ok(json),
            _ => Err(BmcError::Protocol {
                path: self.path_of(link),
                reason: format!(
                    "expected a JSON object, got: {}",
                    error_message(None, &ans.text)
                ),
            }),
        }
    }

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
