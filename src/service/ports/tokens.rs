//! The `TokenStore` port: API tokens, stored as the SHA-256 of their secret only, with the role
//! they carry. Imports `StoreError` only.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::StoreError;

/// What a token may do.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ApiRole {
    /// Reads the inventory and events.
    Viewer,
    /// Also registers, edits and removes machines.
    Operator,
    /// Also manages tokens and secrets.
    Admin,
}

impl ApiRole {
    /// Database and wire spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            ApiRole::Viewer => "viewer",
            ApiRole::Operator => "operator",
            ApiRole::Admin => "admin",
        }
    }
}

impl fmt::Display for ApiRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApiRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "viewer" => Ok(ApiRole::Viewer),
            "operator" => Ok(ApiRole::Operator),
            "admin" => Ok(ApiRole::Admin),
            o => Err(format!("`{o}` is not a role: viewer, operator or admin")),
        }
    }
}

/// A token to store.
#[derive(Clone, Debug)]
pub struct NewToken {
    /// Id.
    pub id: Uuid,
    /// Human name, shown as the actor of events.
    pub name: String,
    /// Role.
    pub role: ApiRole,
    /// SHA-256 of the secret.
    pub hash: Vec<u8>,
    /// Expiry, if any.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A stored token, without its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenInfo {
    /// Id.
    pub id: Uuid,
    /// Name.
    pub name: String,
    /// Role.
    pub role: ApiRole,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Expires.
    pub expires_at: Option<DateTime<Utc>>,
    /// Revoked.
    pub revoked: bool,
}

/// A web console session to store: minted from a live token at sign-in.
#[derive(Clone, Debug)]
pub struct NewSession {
    /// SHA-256 of the session id (the cookie's value); the id itself is never stored.
    pub hash: Vec<u8>,
    /// The token the session was minted from: its name and role are the session's.
    pub token_id: Uuid,
    /// When the session ends.
    pub expires_at: DateTime<Utc>,
}

/// API tokens, and the console sessions minted from them.
#[async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// Store a new API token (its hash only).
    async fn create_token(&self, token: &NewToken) -> Result<TokenInfo, StoreError>;

    /// A live (not revoked, not expired) token by the SHA-256 of its secret.
    async fn token_by_hash(&self, hash: &[u8]) -> Result<Option<TokenInfo>, StoreError>;

    /// A live (not revoked, not expired) token by its id.
    async fn live_token(&self, id: Uuid) -> Result<Option<TokenInfo>, StoreError>;

    /// All tokens (metadata only).
    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError>;

    /// Revoke a token; false when there was none.
    async fn revoke_token(&self, id: Uuid) -> Result<bool, StoreError>;

    /// Store a console session (and drop the sessions that have expired).
    async fn create_session(&self, session: &NewSession) -> Result<(), StoreError>;

    /// The live token of a session that has not expired, by the SHA-256 of its id, with the
    /// session's expiry. `None` for an unknown or expired session, or one whose token is no
    /// longer live.
    async fn session_by_hash(
        &self,
        hash: &[u8],
    ) -> Result<Option<(TokenInfo, DateTime<Utc>)>, StoreError>;

    /// Delete a session (sign-out); false when there was none.
    async fn delete_session(&self, hash: &[u8]) -> Result<bool, StoreError>;
}
