//! The command line's side of the HTTP API: `ApiArgs` (server, token, `--json`), flattened into
//! every command group that talks to a running server, and `ApiClient`, which sends a request and
//! turns an error answer into an error that names its fields, rows and conflicts.
//!
//! Imports `cli::output` and `domain` only; it never reaches the store, a service or a BMC.

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;

/// How to reach the API, shared by every command group that talks to a running server.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// Server URL.
    #[arg(
        long,
        global = true,
        env = "PLINTH_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// API token.
    #[arg(long, global = true, env = "PLINTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

impl ApiArgs {
    /// A client for these arguments.
    pub fn client(&self) -> anyhow::Result<ApiClient> {
        ApiClient::new(&self.server, self.token.clone())
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
            base: server.trim_end_matches('/').to_string(),
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
        bail!("{}", describe_error(status.as_u16(), &body))
    }

    /// A machine named any way the CLI accepts (id, host name, MAC, serial, asset tag, SMBIOS
    /// UUID) and its version.
    pub(crate) async fn get_machine(&self, reference: &str) -> anyhow::Result<(i64, Value)> {
        let path = if let Ok(mac) = reference.parse::<crate::domain::MacAddr>() {
            format!("/machines/lookup?mac={mac}")
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
