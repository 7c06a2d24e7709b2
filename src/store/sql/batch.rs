//! The group commit's batches in SQL (`crate::store::group_commit` queues and answers them):
//! every write of a batch in one transaction, in queue order, one commit. Compiled once per
//! dialect (`super::Db`).

use async_trait::async_trait;

use super::configs::{served_config, use_token, window_token};
use super::events::insert_events;
use super::leases::{end, flush, Written};
use super::Db;
use crate::service::ports::{Lease, StoreError};
use crate::store::group_commit::{WriteBatch, WriteOp};

/// The group commit's batches: every op in one transaction, in queue order, one commit.
/// Consecutive claims of distinct addresses by distinct MACs form a run written by a few
/// multi-row statements; an `End`, or a second claim of one address or by one MAC in
/// one subnet, starts the next run.
/// The rows the batch wrote are handed to the store's lease view after the commit.
pub(super) struct Batch {
    pub(super) pool: sqlx::Pool<Db>,
    pub(super) view: std::sync::Arc<crate::store::lease_view::LeaseView>,
    /// Does the view hold every row (see `Written::exact`)?
    pub(super) exact: bool,
}

#[async_trait]
impl WriteBatch for Batch {
    async fn apply(&self, ops: &[WriteOp]) -> Result<Vec<bool>, StoreError> {
        use WriteOp;
        let mut written = Written {
            view: &self.view,
            exact: self.exact,
            rows: Vec::new(),
        };
        // One write that is one statement (a claim whose MAC holds no other row to expire, the
        // end of a lease) needs no BEGIN and COMMIT of its own: alone, the statement is its own
        // transaction, committed (fsynced) before it returns. Most batches are one write
        // when DHCP is not busy; this spares two of their three statements.
        if let [op] = ops {
            let single = match op {
                WriteOp::Claim(c) => !written.may_expire_others(&c.lease),
                WriteOp::End { .. } => true,
                _ => false,
            };
            if single {
                let mut conn = self.pool.acquire().await?;
                let done = match op {
                    WriteOp::Claim(c) => {
                        let mut out = Vec::with_capacity(1);
                        flush(&mut conn, &mut vec![&c.lease], &mut out, &mut written).await?;
                        out
                    }
                    WriteOp::End {
                        ip,
                        mac,
                        state,
                        expires_ms,
                        now_ms,
                    } => {
                        let op = (*ip, *mac, *state, *expires_ms, *now_ms);
                        vec![end(&mut conn, op, &mut written).await?]
                    }
                    _ => Vec::new(),
                };
                written.view.apply(written.rows);
                return Ok(done);
            }
        }
        let mut tx = self.pool.begin().await?;
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
                        flush(&mut tx, &mut run, &mut out, &mut written).await?;
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
                    flush(&mut tx, &mut run, &mut out, &mut written).await?;
                    let op = (*ip, *mac, *state, *expires_ms, *now_ms);
                    out.push(end(&mut tx, op, &mut written).await?);
                }
                WriteOp::Event(event) => {
                    flush(&mut tx, &mut run, &mut out, &mut written).await?;
                    insert_events(&mut tx, &[event]).await?;
                    out.push(true);
                }
                WriteOp::WindowToken {
                    id,
                    token_sha256,
                    ip,
                    now,
                } => {
                    flush(&mut tx, &mut run, &mut out, &mut written).await?;
                    out.push(window_token(&mut tx, *id, token_sha256, ip, *now).await?);
                }
                WriteOp::Served {
                    id,
                    token_sha256,
                    served,
                    event,
                } => {
                    flush(&mut tx, &mut run, &mut out, &mut written).await?;
                    let used = use_token(&mut tx, *id, token_sha256, served.at).await?;
                    if used {
                        served_config(&mut tx, *id, served).await?;
                        insert_events(&mut tx, &[event]).await?;
                    }
                    out.push(used);
                }
            }
            debug_assert!(out.len() + run.len() == i + 1);
        }
        flush(&mut tx, &mut run, &mut out, &mut written).await?;
        tx.commit().await?;
        // Committed (and on SQLite fsynced): only now does the view show these rows.
        written.view.apply(written.rows);
        Ok(out)
    }
}
