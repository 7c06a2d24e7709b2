//! The group commit's batches in SQL (`crate::store::group_commit` queues and answers them):
//! every write of a batch in one transaction, in queue order, one commit. Compiled once per
//! dialect (`super::Db`).

use async_trait::async_trait;

use super::configs::{served_config, window_token};
use super::events::insert_events;
use super::leases::{flush, ip_key};
use super::Db;
use crate::service::ports::{Lease, StoreError};
use crate::store::group_commit::{WriteBatch, WriteOp};

/// The group commit's batches: every op in one transaction, in queue order, one commit.
/// Consecutive claims of distinct addresses by distinct MACs form a run written by a few
/// multi-row statements; an `End`, or a second claim of one address or by one MAC in
/// one subnet, starts the next run.
pub(super) struct Batch(pub(super) sqlx::Pool<Db>);

#[async_trait]
impl WriteBatch for Batch {
    async fn apply(&self, ops: &[WriteOp]) -> Result<Vec<bool>, StoreError> {
        use WriteOp;
        let mut tx = self.0.begin().await?;
        let mut out = Vec::with_capacity(ops.len());
        let mut run: Vec<&Lease> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match op {
                WriteOp::Claim(c) => {
                    let l = &c.lease;
                    if run
                        .iter()
                        .any(|r| r.ip == l.ip || (r.mac == l.mac && r.subnet == l.subnet))
                    {
                        flush(&mut tx, &mut run, &mut out).await?;
                    }
                    run.push(&c.lease);
                }
                WriteOp::End {
                    ip,
                    mac,
                    state,
                    expires_ms,
                    now_ms,
                } => {
                    flush(&mut tx, &mut run, &mut out).await?;
                    let done = sqlx::query(
                        "UPDATE dhcp_leases SET state = $1, expires_ms = $2, updated_ms = $3 WHERE ip = $4 AND mac = $5",
                    )
                    .bind(state.as_str())
                    .bind(*expires_ms)
                    .bind(*now_ms)
                    .bind(ip_key(*ip))
                    .bind(mac.to_string())
                    .execute(&mut *tx)
                    .await
                    ?;
                    out.push(done.rows_affected() > 0);
                }
                WriteOp::Event(event) => {
                    flush(&mut tx, &mut run, &mut out).await?;
                    insert_events(&mut tx, &[event]).await?;
                    out.push(true);
                }
                WriteOp::WindowToken {
                    id,
                    token_sha256,
                    now,
                } => {
                    flush(&mut tx, &mut run, &mut out).await?;
                    out.push(window_token(&mut tx, *id, token_sha256, *now).await?);
                }
                WriteOp::Served { id, served, event } => {
                    flush(&mut tx, &mut run, &mut out).await?;
                    served_config(&mut tx, *id, served).await?;
                    insert_events(&mut tx, &[event]).await?;
                    out.push(true);
                }
            }
            debug_assert!(out.len() + run.len() == i + 1);
        }
        flush(&mut tx, &mut run, &mut out).await?;
        tx.commit().await?;
        Ok(out)
    }
}
