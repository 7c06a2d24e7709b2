//! `TokenStore` in SQL: API tokens, kept as the SHA-256 of their secret. Compiled once per
//! dialect (`super::Db`).

use async_trait::async_trait;
use chrono::Utc;
use sqlx::Row as _;
use uuid::Uuid;

use super::{Row, Store};
use crate::service::ports::{NewToken, StoreError, TokenInfo, TokenStore};

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
        let Some(r) = row else { return Ok(None) };
        let t = token_row(&r)?;
        if t.revoked || t.expires_at.is_some_and(|e| e <= Utc::now()) {
            return Ok(None);
        }
        Ok(Some(t))
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
