//! HTTP to one BMC, in the parts each concern owns: `endpoint` (where and how to reach it, the
//! client's options, the redacted `Password`), `request` (one request: authentication header,
//! concurrency limit, bounded retries, timeouts, the status check, JSON GETs), `session` (Redfish
//! sessions with basic auth as fallback, re-login, logout on close and drop), `etag` (`If-Match`
//! and its 412/428 ladder) and `task` (actions and task monitors). This file holds the `Transport`
//! itself: the HTTP client bound to the BMC's origin, and how links resolve on that origin.
//!
//! Imports `reqwest`, the sibling `tls` module and `BmcError`; nothing from `service` use cases,
//! `store` or `http`. Passwords and session tokens are never logged.

mod endpoint;
mod etag;
mod request;
mod session;
mod task;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderMap, LOCATION};
use reqwest::{StatusCode, Url};
use serde_json::Value;
use tokio::sync::Semaphore;

use super::tls::TlsPolicy;
use super::BmcError;
pub use endpoint::{BmcEndpoint, BmcOptions, Password};
pub use session::AuthMode;
use session::AuthState;

/// The service root; the only path ever built by hand (DSP0266 §6.3).
pub(crate) const SERVICE_ROOT: &str = "/redfish/v1/";

/// An answer from the BMC.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Option<Value>,
    pub text: String,
}

impl Answer {
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
        if base.scheme() == "http"
            && !ep.password.expose().is_empty()
            && ep.tls != TlsPolicy::PlainHttp
        {
            // The one place a password leaves for the BMC: never in clear unless said so.
            return Err(BmcError::Config(format!(
                "refusing to send the password to the http:// BMC URL `{}` in clear: set bmc.tls \
                 to `insecure-http` to allow it, or use https://",
                ep.url
            )));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_on_the_bmc_origin() {
        let ep = BmcEndpoint {
            url: "http://10.0.0.5:8000/redfish/v1".into(),
            username: "u".into(),
            password: Password::new("p"),
            tls: TlsPolicy::PlainHttp,
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
    fn a_password_goes_to_plain_http_only_when_said_so() {
        let ep = BmcEndpoint {
            url: "http://10.0.0.5".into(),
            username: "u".into(),
            password: Password::new("p"),
            tls: TlsPolicy::Verify,
        };
        for tls in [TlsPolicy::Verify, TlsPolicy::Insecure] {
            let refused = Transport::new(&BmcEndpoint { tls, ..ep.clone() }, BmcOptions::default());
            match refused {
                Err(BmcError::Config(m)) => assert!(m.contains("bmc.tls"), "{m}"),
                _ => panic!("a password to http:// without insecure-http"),
            }
        }
        let plain = BmcEndpoint {
            tls: TlsPolicy::PlainHttp,
            ..ep.clone()
        };
        assert!(Transport::new(&plain, BmcOptions::default()).is_ok());
        let no_password = BmcEndpoint {
            password: Password::new(""),
            ..ep.clone()
        };
        assert!(Transport::new(&no_password, BmcOptions::default()).is_ok());
        let https = BmcEndpoint {
            url: "https://10.0.0.5".into(),
            ..plain
        };
        assert!(Transport::new(&https, BmcOptions::default()).is_err());
    }
}
