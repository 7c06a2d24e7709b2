//! API tokens and roles. A token is 32 random bytes shown once to its creator; only its SHA-256 is
//! stored (a high-entropy secret needs no slow hash). Roles are ordered: viewer < operator < admin.
//!
//! Takes the tokens and events ports; imports nothing from `store` or the front doors.

use std::sync::Arc;

use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::ports::{ApiRole, EventStore, NewEvent, NewToken, StoreError, TokenInfo, TokenStore};

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
    tokens: Arc<dyn TokenStore>,
    events: Arc<dyn EventStore>,
}

impl Tokens {
    /// Over the tokens and the event log.
    pub fn new(tokens: Arc<dyn TokenStore>, events: Arc<dyn EventStore>) -> Self {
        Self { tokens, events }
    }

    /// Mint and store a token; the secret is returned once and never stored.
    pub async fn create(
        &self,
        name: &str,
        role: ApiRole,
        expires_at: Option<DateTime<Utc>>,
        actor: &str,
    ) -> Result<(String, TokenInfo), StoreError> {
        let (secret, rec) = mint_token(name, role, expires_at);
        let info = self.tokens.create_token(&rec).await?;
        self.events
            .append_event(&NewEvent {
                machine_id: None,
                kind: "token.created".into(),
                actor: actor.into(),
                detail: serde_json::json!({"token_id": info.id, "name": name, "role": role}),
            })
            .await?;
        Ok((secret, info))
    }

    /// The live token for a presented secret.
    pub async fn authenticate(&self, secret: &str) -> Result<Option<TokenInfo>, StoreError> {
        if !secret.starts_with(TOKEN_PREFIX) || secret.len() > 128 {
            return Ok(None);
        }
        self.tokens.token_by_hash(&token_hash(secret)).await
    }

    /// Every token's metadata.
    pub async fn list(&self) -> Result<Vec<TokenInfo>, StoreError> {
        self.tokens.list_tokens().await
    }

    /// Revoke; false when no live token had that id.
    pub async fn revoke(&self, id: Uuid, actor: &str) -> Result<bool, StoreError> {
        let done = self.tokens.revoke_token(id).await?;
        if done {
            self.events
                .append_event(&NewEvent {
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
