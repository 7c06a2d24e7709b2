//! API tokens and roles. A token is 32 random bytes shown once to its creator; only its SHA-256 is
//! stored (a high-entropy secret needs no slow hash). Roles are ordered: viewer < operator < admin.
//! The web console's sessions are minted from a token at sign-in: a session id of 32 random
//! bytes (the cookie's value; only its SHA-256 is stored) that carries the token's name and role
//! until it expires, is signed out, or its token stops being live. Each session's CSRF token is
//! derived from its id, so it needs no storage and cannot be guessed without the cookie.
//!
//! Takes the tokens and events ports; imports nothing from `store` or the front doors.

use std::sync::Arc;

use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::ports::{
    ApiRole, EventStore, NewEvent, NewSession, NewToken, StoreError, TokenInfo, TokenStore,
};

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

/// Longest accepted session id (a minted one is 43 characters).
const SESSION_MAX: usize = 64;

/// The CSRF token of the session with this id: a keyed digest of the id, so each session has its
/// own and nobody without the cookie can compute it.
pub fn csrf_token(session_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"plinth console csrf\0");
    h.update(session_id.as_bytes());
    hex::encode(&h.finalize()[..20])
}

/// Does `presented` equal the session's CSRF token? Compared without an early exit.
pub fn csrf_matches(session_id: &str, presented: &str) -> bool {
    let want = csrf_token(session_id);
    want.len() == presented.len()
        && want
            .bytes()
            .zip(presented.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// A fresh random value for the console's sign-in form (its pre-session cookie): 32 bytes,
/// base64url. The form's CSRF token is [`csrf_token`] of it, so a form posted from another site
/// (which cannot read or send the cookie) signs nobody in.
pub fn sign_in_nonce() -> String {
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// A signed-in console session: the token it was minted from and when it ends.
#[derive(Clone, Debug)]
pub struct Session {
    /// The token (its name is the actor of every action; its role bounds them).
    pub token: TokenInfo,
    /// When the session ends.
    pub expires_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_tokens_are_per_session_and_checked_whole() {
        let a = csrf_token("session-a");
        assert_ne!(a, csrf_token("session-b"));
        assert!(csrf_matches("session-a", &a));
        assert!(!csrf_matches("session-b", &a));
        assert!(!csrf_matches("session-a", &a[..a.len() - 1]));
        assert!(!csrf_matches("session-a", ""));
    }

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

    /// Sign in to the console with a token secret: a new session id (for the cookie; shown once,
    /// only its hash is stored) lasting `ttl` but never past the token's own expiry, and the
    /// token. `None` when the secret is not a live token. The sign-in is an event naming the token.
    pub async fn sign_in(
        &self,
        secret: &str,
        ttl: chrono::Duration,
    ) -> Result<Option<(String, Session)>, StoreError> {
        let Some(token) = self.authenticate(secret.trim()).await? else {
            return Ok(None);
        };
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let mut expires_at = Utc::now() + ttl;
        if let Some(t) = token.expires_at {
            expires_at = expires_at.min(t);
        }
        self.tokens
            .create_session(&NewSession {
                hash: token_hash(&id),
                token_id: token.id,
                expires_at,
            })
            .await?;
        self.events
            .append_event(&NewEvent {
                machine_id: None,
                kind: "console.signed_in".into(),
                actor: format!("token:{}", token.name),
                detail: serde_json::json!({"token_id": token.id, "role": token.role, "expires_at": expires_at}),
            })
            .await?;
        Ok(Some((id, Session { token, expires_at })))
    }

    /// The live session with this id (from the cookie), if any.
    pub async fn session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        if id.is_empty() || id.len() > SESSION_MAX {
            return Ok(None);
        }
        Ok(self
            .tokens
            .session_by_hash(&token_hash(id))
            .await?
            .map(|(token, expires_at)| Session { token, expires_at }))
    }

    /// Sign out: delete the session, with an event naming its token. False when there was none.
    pub async fn sign_out(&self, id: &str) -> Result<bool, StoreError> {
        let Some(s) = self.session(id).await? else {
            return Ok(false);
        };
        let done = self.tokens.delete_session(&token_hash(id)).await?;
        if done {
            self.events
                .append_event(&NewEvent {
                    machine_id: None,
                    kind: "console.signed_out".into(),
                    actor: format!("token:{}", s.token.name),
                    detail: serde_json::json!({"token_id": s.token.id}),
                })
                .await?;
        }
        Ok(done)
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
