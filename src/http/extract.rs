//! Request extraction shared by handlers: a JSON body whose errors name the field, the caller's
//! token and role, and the `If-Match` version.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::AppState;
use crate::domain::import::json_path;
use crate::service::{ApiRole, TokenInfo};

/// A JSON body. Malformed JSON is a 400 with line and column; a wrong type or unknown field is a
/// 400 naming the field; a body over the limit is a 413.
pub struct JsonBody<T>(pub T);

/// Read a body within the configured limit (413 past it).
pub async fn body_bytes(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "request body is larger than http.max_body_bytes ({} bytes)",
                    state.max_body_bytes
                ),
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("cannot read body: {e}"),
            )
        }
    })
}

/// Deserialize JSON text, naming the field on failure.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = json_path(e.path());
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("malformed JSON: {inner}"),
            )
        } else {
            ApiError::bad_field(path, inner.to_string())
        }
    })?;
    de.end().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("malformed JSON: {e}"),
        )
    })?;
    Ok(value)
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !ct.is_empty() && !ct.starts_with("application/json") && !ct.contains("+json") {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("send JSON (Content-Type: application/json), not `{ct}`"),
            ));
        }
        let bytes = body_bytes(req, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The authenticated caller.
#[derive(Clone, Debug)]
pub struct Caller(pub TokenInfo);

impl Caller {
    /// Refuse (403) unless the caller has at least `role`.
    pub fn require(&self, role: ApiRole) -> Result<&Self, ApiError> {
        if self.0.role >= role {
            Ok(self)
        } else {
            Err(ApiError::forbidden(role))
        }
    }

    /// The actor name written into events.
    pub fn actor(&self) -> String {
        format!("token:{}", self.0.name)
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let secret = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(ApiError::unauthorized)?;
        match state.tokens.authenticate(secret).await {
            Ok(Some(t)) => Ok(Caller(t)),
            Ok(None) => Err(ApiError::unauthorized()),
            Err(e) => Err(ApiError::from(e)),
        }
    }
}

/// The version in `If-Match: "7"` (or `W/"7"`, or `7`); `None` when absent.
pub fn if_match(parts: &axum::http::HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(v) = parts.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let text = v.to_str().unwrap_or("").trim();
    let t = text.trim_start_matches("W/").trim_matches('"');
    t.parse::<i64>().map(Some).map_err(|_| {
        ApiError::bad_field(
            "If-Match",
            format!("`{text}` is not a machine version; send the ETag of the machine, e.g. \"3\""),
        )
    })
}

/// Query parameters: a malformed query string is a 400 naming `query` and what is wrong.
pub struct QueryParams<T>(pub T);

impl<T, S> FromRequestParts<S> for QueryParams<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(QueryParams(v)),
            Err(e) => Err(ApiError::bad_field("query", e.body_text())),
        }
    }
}
