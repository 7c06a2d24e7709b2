//! The command line's side of the HTTP API: `ApiArgs` (server, token, `--json`), flattened into
//! every command group that talks to a running server, and `ApiClient`, which sends a request and
//! turns an error answer into an error that names its fields, rows and conflicts.
//!
//! Imports `config::env_value` and `domain` only; it never reaches the store, a service or a BMC.

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;

use crate::config::env_value;

/// Environment variable standing for `--server`.
pub const SERVER_ENV: &str = "PLINTH_SERVER";
/// Environment variable standing for `--token`.
pub const TOKEN_ENV: &str = "PLINTH_TOKEN";
/// The server when neither `--server` nor `PLINTH_SERVER` names one.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// How to reach the API, shared by every command group that talks to a running server. The
/// environment variables are read here rather than by clap so that an empty one counts as unset.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// Server: a URL, or HOST:PORT for http://HOST:PORT [env: PLINTH_SERVER] [default:
    /// http://127.0.0.1:8080].
    #[arg(long, global = true, value_name = "URL")]
    pub server: Option<String>,
    /// API token [env: PLINTH_TOKEN].
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// Print JSON instead of tables; errors too, as {"error": {...}} on stderr.
    #[arg(long, global = true)]
    pub json: bool,
}

impl ApiArgs {
    /// The server: `--server`, else `PLINTH_SERVER`, else the default.
    pub fn server(&self) -> String {
        self.server
            .clone()
            .filter(|s| !s.is_empty())
            .or_else(|| env_value(SERVER_ENV))
            .unwrap_or_else(|| DEFAULT_SERVER.to_string())
    }

    /// The token: `--token`, else `PLINTH_TOKEN`.
    pub fn token(&self) -> Option<String> {
        self.token
            .clone()
            .filter(|t| !t.is_empty())
            .or_else(|| env_value(TOKEN_ENV))
    }

    /// A client for these arguments.
    pub fn client(&self) -> anyhow::Result<ApiClient> {
        ApiClient::new(&self.server(), self.token())
    }
}

/// An error answer of the API: its status and body (`{"error": {...}}`), shown as text naming
/// its fields, rows and conflicts, or passed on as it is under `--json`.
#[derive(Debug)]
pub struct ApiFailure {
    /// HTTP status.
    pub status: u16,
    /// The answer's body.
    pub body: Value,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&describe_error(self.status, &self.body))
    }
}

impl std::error::Error for ApiFailure {}

/// The base URL of a `--server` value: `HOST:PORT` means `http://HOST:PORT`.
pub fn server_url(server: &str) -> anyhow::Result<String> {
    let server = server.trim();
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    };
    match reqwest::Url::parse(&url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
            Ok(url.trim_end_matches('/').to_string())
        }
        _ => bail!(
            "--server `{server}` is not a server address: give http://HOST:PORT, https://HOST or HOST:PORT"
        ),
    }
}

/// A small client of the Plinth API.
pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ApiClient {
    /// For `server`, authenticating with `token`.
    pub fn new(server: &str, token: Option<String>) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(300))
            .build()
            .context("HTTP client")?;
        Ok(Self {
            base: server_url(server)?,
            token,
            http,
        })
    }

    /// A request to `/api/v1{path}`, with the token.
    pub(crate) fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .http
            .request(method, format!("{}/api/v1{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Send and decode; an error answer becomes an error naming its fields, rows and conflicts.
    pub async fn send(
        &self,
        rb: reqwest::RequestBuilder,
    ) -> anyhow::Result<(reqwest::header::HeaderMap, Value)> {
        let resp = rb
            .send()
            .await
            .with_context(|| format!("cannot reach Plinth at {}", self.base))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap_or_default();
        let body: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            return Ok((headers, body));
        }
        Err(ApiFailure {
            status: status.as_u16(),
            body,
        }
        .into())
    }

    /// A machine named any way the CLI accepts (id, host name, MAC, IPv4, serial, asset tag,
    /// SMBIOS UUID) and its version.
    pub(crate) async fn get_machine(&self, reference: &str) -> anyhow::Result<(i64, Value)> {
        let path = if let Ok(mac) = reference.parse::<crate::domain::MacAddr>() {
            format!("/machines/lookup?mac={mac}")
        } else if let Ok(ip) = reference.parse::<std::net::Ipv4Addr>() {
            format!("/machines/lookup?ipv4={ip}")
        } else {
            format!("/machines/{}", urlencode(reference))
        };
        let (h, body) = match self.send(self.req(reqwest::Method::GET, &path)).await {
            Ok(ok) => ok,
            Err(first) => {
                // Not an id or host name: try serial, asset tag, SMBIOS UUID.
                let mut found = None;
                for key in ["serial", "asset_tag", "uuid"] {
                    let p = format!("/machines/lookup?{key}={}", urlencode(reference));
                    if let Ok(ok) = self.send(self.req(reqwest::Method::GET, &p)).await {
                        found = Some(ok);
                        break;
                    }
                }
                found.ok_or(first)?
            }
        };
        let version = etag_version(&h)
            .or_else(|| body["version"].as_i64())
            .context("answer has no version")?;
        Ok((version, body))
    }

    /// The inventory id of a machine named any way the CLI accepts.
    pub(crate) async fn machine_id(&self, reference: &str) -> anyhow::Result<String> {
        let (_, m) = self.get_machine(reference).await?;
        m["id"]
            .as_str()
            .map(str::to_string)
            .context("the machine has no id")
    }
}

/// Percent-encode a path segment or query value.
pub(crate) fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn etag_version(h: &reqwest::header::HeaderMap) -> Option<i64> {
    h.get(reqwest::header::ETAG)?
        .to_str()
        .ok()?
        .trim_matches('"')
        .parse()
        .ok()
}

/// Human text for an API error answer.
pub fn describe_error(status: u16, body: &Value) -> String {
    let e = &body["error"];
    let mut out = format!(
        "HTTP {status}: {}",
        e["message"].as_str().unwrap_or(&body.to_string())
    );
    for f in e["fields"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  {}: {}",
            f["field"].as_str().unwrap_or("-"),
            f["message"].as_str().unwrap_or("")
        ));
    }
    for c in e["conflicts"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  {}: {} belongs to {} ({})",
            c["field"].as_str().unwrap_or("-"),
            c["value"].as_str().unwrap_or(""),
            c["owner"]["name"].as_str().unwrap_or(""),
            c["owner"]["id"].as_str().unwrap_or("")
        ));
    }
    for r in e["rows"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  line {}: {}: {}",
            r["line"],
            r["field"].as_str().unwrap_or("-"),
            r["message"].as_str().unwrap_or("")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        for (given, want) in [
            ("127.0.0.1:8080", Some("http://127.0.0.1:8080")),
            ("plinth.example:8080/", Some("http://plinth.example:8080")),
            ("https://plinth.example/", Some("https://plinth.example")),
            ("http://[::1]:8080", Some("http://[::1]:8080")),
            ("http://", None),
            ("ftp://x", None),
            ("", None),
        ] {
            assert_eq!(server_url(given).ok().as_deref(), want, "{given}");
        }
    }
}
