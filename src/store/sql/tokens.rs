//! `TokenStore` in SQL: API tokens, kept as the SHA-256 of their secret. Compiled once per
//! dialect (`super::Db`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row as _;
use uuid::Uuid;

use super::{Row, Store};
use crate::service::ports::{NewSession, NewToken, StoreError, TokenInfo, TokenStore};

#[async_trait]
impl TokenStore for Store {
    async fn create_token(&self, t: &NewToken) -> Result<TokenInfo, StoreError> {
        let now = Utc::now();
        sqlx::query(
            "INSERT INTO api_tokens (id, name, role, token_hash, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(t.id)
        .bind(&t.name)
        .bind(t.role.as_str())
        .bind(&t.hash)
        .bind(now)
        .bind(t.expires_at)
        .execute(&mut *self.write_conn().await?.1)
        .await?;
        Ok(TokenInfo {
            id: t.id,
            name: t.name.clone(),
            role: t.role,
            created_at: now,
            expires_at: t.expires_at,
            revoked: false,
        })
    }

    async fn token_by_hash(&self, hash: &[u8]) -> Result<Option<TokenInfo>, StoreError> {
        let row = sqlx::query(
            "SELECT id, name, role, created_at, expires_at, revoked_at IS NOT NULL AS revoked \
             FROM api_tokens WHERE token_hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.read)
        .await?;
        live(row.as_ref().map(token_row).transpose()?)
    }

    async fn live_token(&self, id: Uuid) -> Result<Option<TokenInfo>, StoreError> {
        let row = sqlx::query(
            "SELECT id, name, role, created_at, expires_at, revoked_at IS NOT NULL AS revoked \
             FROM api_tokens WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.read)
        .await?;
        live(row.as_ref().map(token_row).transpose()?)
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, name, role, created_at, expires_at, revoked_at IS NOT NULL AS revoked \
             FROM api_tokens ORDER BY created_at, id",
        )
        .fetch_all(&self.read)
        .await?;
        rows.iter().map(token_row).collect()
    }

    async fn revoke_token(&self, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
        )
        .bind(Utc::now())
        .bind(id)
        .execute(&mut *self.write_conn().await?.1)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn create_session(&self, s: &NewSession) -> Result<(), StoreError> {
        let now = Utc::now();
        let mut conn = self.write_conn().await?;
        sqlx::query("DELETE FROM console_sessions WHERE expires_at < $1")
            .bind(now)
            .execute(&mut *conn.1)
            .await?;
        sqlx::query(
            "INSERT INTO console_sessions (session_hash, token_id, created_at, expires_at) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(&s.hash)
        .bind(s.token_id)
        .bind(now)
        .bind(s.expires_at)
        .execute(&mut *conn.1)
        .await?;
        Ok(())
    }

    async fn session_by_hash(
        &self,
        hash: &[u8],
    ) -> Result<Option<(TokenInfo, DateTime<Utc>)>, StoreError> {
        let row = sqlx::query(
            "SELECT t.id, t.name, t.role, t.created_at, t.expires_at, \
             t.revoked_at IS NOT NULL AS revoked, s.expires_at AS session_expires_at \
             FROM console_sessions s JOIN api_tokens t ON t.id = s.token_id \
             WHERE s.session_hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.read)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let until: DateTime<Utc> = row.try_get("session_expires_at")?;
        if until <= Utc::now() {
            return Ok(None);
        }
        Ok(live(Some(token_row(&row)?))?.map(|t| (t, until)))
    }

    async fn delete_session(&self, hash: &[u8]) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM console_sessions WHERE session_hash = $1")
            .bind(hash)
            .execute(&mut *self.write_conn().await?.1)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

/// The token, unless it is revoked or expired.
fn live(t: Option<TokenInfo>) -> Result<Option<TokenInfo>, StoreError> {
    Ok(t.filter(|t| !t.revoked && t.expires_at.is_none_or(|e| e > Utc::now())))
}

fn token_row(r: &Row) -> Result<TokenInfo, StoreError> {
    let role: String = r.try_get("role")?;
    Ok(TokenInfo {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        role: role.parse().map_err(|e: String| StoreError::Backend(e))?,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        revoked: r.try_get("revoked")?,
    })
}
