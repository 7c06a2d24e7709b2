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

/// API tokens.
#[async_trait]
pub trait TokenStore: Send + Sync + 'static {
    /// Store a new API token (its hash only).
    async fn create_token(&self, token: &NewToken) -> Result<TokenInfo, StoreError>;

    /// A live (not revoked, not expired) token by the SHA-256 of its secret.
    async fn token_by_hash(&self, hash: &[u8]) -> Result<Option<TokenInfo>, StoreError>;

    /// All tokens (metadata only).
    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError>;

    /// Revoke a token; false when there was none.
    async fn revoke_token(&self, id: Uuid) -> Result<bool, StoreError>;
}
