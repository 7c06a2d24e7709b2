//! Authentication to one BMC: a Redfish session (`POST` to the service root's `Links.Sessions`;
//! the token comes in `X-Auth-Token`, the session URI in `Location` or, on some BMCs, only in the
//! body's `@odata.id`), with HTTP basic authentication as the fallback when the BMC links no
//! session service or refuses a new session. A 401 on a session token logs in again once. The
//! session is deleted on `close()` and, failing that, when the transport is dropped, because BMCs
//! cap sessions and lock users out when they pile up. Neither the password nor the token is logged.

use std::sync::atomic::Ordering;

use reqwest::{Method, StatusCode};

use super::request::error_message;
use super::{Transport, SERVICE_ROOT};
use crate::bmc::odata::{text, text_at};
use crate::bmc::BmcError;

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

/// The authentication state behind `AuthMode`, with the session token and URI.
#[derive(Clone)]
pub(super) enum AuthState {
    Unknown,
    Session { token: String, uri: Option<String> },
    Basic,
    Closed,
}

impl Transport {
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

    pub(super) fn lock_auth(&self) -> std::sync::MutexGuard<'_, AuthState> {
        // A poisoned lock only means another task panicked mid-update; the state is still usable.
        self.auth.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Log in if not yet logged in.
    pub(super) async fn ensure_login(&self) -> Result<(), BmcError> {
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
    pub(super) async fn relogin(&self, stale: &str) -> Result<(), BmcError> {
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
            .and_then(|b| text_at(b, "/Links/Sessions/@odata.id"));
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
        let uri = ans
            .location()
            .or_else(|| ans.body.as_ref().and_then(|b| text(b, "@odata.id")));
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
