//! API tokens and roles. A token is 32 random bytes shown once to its creator; only its SHA-256 is
//! stored (a high-entropy secret needs no slow hash). Roles are ordered: viewer < operator < admin.

use std::fmt;
use std::str::FromStr;

use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

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

/// Prefix of every Plinth token, so secret scanners can find leaked ones.
pub const TOKEN_PREFIX: &str = "plinth_";

/// A fresh secret and the record to store for it.
pub fn mint_token(
    name: &str,
    role: ApiRole,
    expires_at: Option<DateTime<Utc>>,
) -> (String, NewToken) {
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    let secret = format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    );
    let rec = NewToken {
        id: Uuid::now_v7(),
        name: name.to_string(),
        role,
        hash: token_hash(&secret),
        expires_at,
    };
    (secret, rec)
}

/// SHA-256 of a token secret.
pub fn token_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_differ_and_hash_matches() {
        let (a, ra) = mint_token("a", ApiRole::Admin, None);
        let (b, _) = mint_token("b", ApiRole::Admin, None);
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(ra.hash, token_hash(&a));
        assert!(ApiRole::Viewer < ApiRole::Operator && ApiRole::Operator < ApiRole::Admin);
    }
}

/// Token use cases: mint, authenticate, list, revoke.
#[derive(Clone)]
pub struct Tokens {
    store: std::sync::Arc<dyn super::InventoryStore>,
}

impl Tokens {
    /// Over a store.
    pub fn new(store: std::sync::Arc<dyn super::InventoryStore>) -> Self {
        Self { store }
    }

    /// Mint and store a token; the secret is returned once and never stored.
    pub async fn create(
        &self,
        name: &str,
        role: ApiRole,
        expires_at: Option<DateTime<Utc>>,
        actor: &str,
    ) -> Result<(String, TokenInfo), super::StoreError> {
        let (secret, rec) = mint_token(name, role, expires_at);
        let info = self.store.create_token(&rec).await?;
        self.store
            .append_event(&super::NewEvent {
                machine_id: None,
                kind: "token.created".into(),
                actor: actor.into(),
                detail: serde_json::json!({"token_id": info.id, "name": name, "role": role}),
            })
            .await?;
        Ok((secret, info))
    }

    /// The live token for a presented secret.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<TokenInfo>, super::StoreError> {
        if !secret.starts_with(TOKEN_PREFIX) || secret.len() > 128 {
            return Ok(None);
        }
        self.store.token_by_hash(&token_hash(secret)).await
    }

    /// Every token's metadata.
    pub async fn list(&self) -> Result<Vec<TokenInfo>, super::StoreError> {
        self.store.list_tokens().await
    }

    /// Revoke; false when no live token had that id.
    pub async fn revoke(&self, id: Uuid, actor: &str) -> Result<bool, super::StoreError> {
        let done = self.store.revoke_token(id).await?;
        if done {
            self.store
                .append_event(&super::NewEvent {
                    machine_id: None,
                    kind: "token.revoked".into(),
                    actor: actor.into(),
                    detail: serde_json::json!({"token_id": id}),
                })
                .await?;
        }
        Ok(done)
    }
}
