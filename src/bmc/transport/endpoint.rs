//! Where and how to reach one BMC: its URL, user name and password (`Password` never shows itself
//! in `Debug` or `Display`), the TLS policy, and the timeouts, retries and limits of the client
//! (`BmcOptions`). No I/O here; `Transport::new` turns these into an HTTP client.

use std::fmt;
use std::time::Duration;

use crate::bmc::tls::TlsPolicy;
use crate::bmc::BmcError;

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
}
