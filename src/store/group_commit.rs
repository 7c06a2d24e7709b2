//! Group commit for the writes of a boot: DHCP lease mutations (a claim, the end of a lease) and
//! the small writes every network boot makes (its boot-script event, the config token it is
//! handed, the record of the config it fetched). Each is sent to one writer task per store; the
//! task takes whatever is queued (up to `MAX_BATCH`), applies it in order inside one transaction,
//! commits once, and only then answers each waiter. One fsync (or one PostgreSQL commit) covers
//! many writes, and an answer still means "committed": an ACK still goes out only after its lease
//! is durable. A boot storm of a thousand machines would otherwise queue several thousand
//! single-write commits, an fsync each, on SQLite's one writer.
//!
//! Each claim inside the batch is the same conditional upsert it is alone, executed in queue order,
//! so a batch behaves exactly like its claims run one after another: two claims of one address by
//! two MACs in one batch still give it to the first only, and the database's primary key (plus, on
//! PostgreSQL, its row locks against other instances' transactions) still decides. When a batch
//! fails (a constraint, a deadlock with another instance, an I/O error) nothing of it is kept: it
//! is rolled back and its writes are retried one transaction each, so one bad write fails alone.
//!
//! Why hand-written: the batching has to live next to the SQL (the per-claim statements run inside
//! the batch's transaction); no crate offers group commit over sqlx.

use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use crate::domain::{MacAddr, MachineId};
use crate::service::ports::{
    CommitObserver, CommitReport, LeaseClaim, LeaseState, NewEvent, ServedConfig, StoreError,
};

/// Most writes committed together. Bounds one transaction's time and the latency the first
/// waiter of a batch pays for the others.
pub(crate) const MAX_BATCH: usize = 256;

/// Writes waiting for the writer; beyond it senders wait (back-pressure, not loss).
const QUEUE: usize = 4096;

/// One write.
#[derive(Clone, Debug)]
pub(crate) enum WriteOp {
    /// `EventStore::append_event`.
    Event(NewEvent),
    /// `ConfigStore::set_window_token`.
    WindowToken {
        id: MachineId,
        token_sha256: String,
        ip: String,
        now: chrono::DateTime<chrono::Utc>,
    },
    /// `ConfigStore::record_served`.
    Served {
        id: MachineId,
        token_sha256: String,
        served: ServedConfig,
        event: NewEvent,
    },
    /// `LeaseStore::claim_lease`.
    Claim(LeaseClaim),
    /// `LeaseStore::end_lease`.
    End {
        ip: Ipv4Addr,
        mac: MacAddr,
        state: LeaseState,
        expires_ms: i64,
        now_ms: i64,
    },
}

/// Applies a batch of writes in one transaction: every op's result in order, or an error
/// and nothing kept.
#[async_trait]
pub(crate) trait WriteBatch: Send + Sync + 'static {
    async fn apply(&self, ops: &[WriteOp]) -> Result<Vec<bool>, StoreError>;
}

struct Job {
    op: WriteOp,
    done: oneshot::Sender<Result<bool, StoreError>>,
    queued_at: Instant,
}

/// Where the writer reports its transactions (set once, after the store opened).
type Observer = Arc<OnceLock<Arc<dyn CommitObserver>>>;

/// The handle stores keep: send a write, wait for its committed result.
#[derive(Clone)]
pub(crate) struct GroupCommit {
    tx: mpsc::Sender<Job>,
    observer: Observer,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// Start `writers` writer tasks on the current Tokio runtime, taking turns at the queue: each
    /// takes what is queued and commits it while the next one gathers the writes that arrive
    /// meanwhile (one on SQLite, whose one writer connection serialises them anyway; several on
    /// PostgreSQL, where transactions of distinct rows proceed together and the commits' WAL
    /// flushes overlap). They end when every handle is dropped.
    pub(crate) fn spawn(batch: impl WriteBatch, writers: usize) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let observer = Observer::default();
        let (batch, rx): (Arc<dyn WriteBatch>, _) =
            (Arc::new(batch), Arc::new(tokio::sync::Mutex::new(rx)));
        for _ in 0..writers.max(1) {
            tokio::spawn(run(batch.clone(), rx.clone(), observer.clone()));
        }
        Self { tx, observer }
    }

    /// Report every transaction to `observer` from now on (the first one set stays).
    pub(crate) fn observe(&self, observer: Arc<dyn CommitObserver>) {
        let _ = self.observer.set(observer);
    }

    /// Queue `op` and wait until the transaction that holds it has committed.
    pub(crate) async fn write(&self, op: WriteOp) -> Result<bool, StoreError> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(Job {
                op,
                done,
                queued_at: Instant::now(),
            })
            .await
            .map_err(|_| StoreError::Backend("the group commit writer has stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Backend("the group commit writer dropped a write".into()))?
    }
}

async fn run(
    batch: Arc<dyn WriteBatch>,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    observer: Observer,
) {
    let mut jobs: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    loop {
        // This writer's turn at the queue: wait for the first write, then take whatever else is
        // already queued.
        let queued = {
            let mut rx = rx.lock().await;
            if rx.recv_many(&mut jobs, MAX_BATCH).await == 0 {
                return;
            }
            rx.len()
        };
        let ops: Vec<WriteOp> = jobs.iter().map(|j| j.op.clone()).collect();
        let began = Instant::now();
        let result = batch.apply(&ops).await;
        if let Some(o) = observer.get() {
            o.transaction(CommitReport {
                writes: ops.len(),
                waited: jobs
                    .first()
                    .map(|j| began.duration_since(j.queued_at))
                    .unwrap_or_default(),
                took: began.elapsed(),
                committed: result.is_ok(),
                queued,
            });
        }
        match result {
            Ok(results) if results.len() == jobs.len() => {
                for (job, r) in jobs.drain(..).zip(results) {
                    let _ = job.done.send(Ok(r));
                }
            }
            Ok(_) => {
                for job in jobs.drain(..) {
                    let _ = job.done.send(Err(StoreError::Backend(
                        "a write batch returned the wrong number of results".into(),
                    )));
                }
            }
            Err(e) if jobs.len() == 1 => {
                if let Some(job) = jobs.pop() {
                    let _ = job.done.send(Err(e));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, writes = jobs.len(), "write batch rolled back; retrying its writes one by one");
                for job in jobs.drain(..) {
                    let began = Instant::now();
                    let r = batch.apply(std::slice::from_ref(&job.op)).await;
                    if let Some(o) = observer.get() {
                        o.transaction(CommitReport {
                            writes: 1,
                            waited: began.duration_since(job.queued_at),
                            took: began.elapsed(),
                            committed: r.is_ok(),
                            queued,
                        });
                    }
                    let r = r.and_then(|v| {
                        v.first()
                            .copied()
                            .ok_or_else(|| StoreError::Backend("a write returned no result".into()))
                    });
                    let _ = job.done.send(r);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records batch sizes; fails any batch containing an `End` for 0.0.0.0 (a "bad" write).
    struct Fake {
        sizes: Mutex<Vec<usize>>,
        gate: tokio::sync::Semaphore,
    }

    #[async_trait]
    impl WriteBatch for Arc<Fake> {
        async fn apply(&self, ops: &[WriteOp]) -> Result<Vec<bool>, StoreError> {
            // The first batch waits for the test's signal so the rest pile up behind it.
            let _permit = self
                .gate
                .acquire()
                .await
                .map_err(|_| StoreError::Backend("gate".into()))?;
            self.sizes.lock().expect("lock").push(ops.len());
            if ops
                .iter()
                .any(|o| matches!(o, WriteOp::End { ip, .. } if ip.is_unspecified()))
            {
                return Err(StoreError::Backend("bad write".into()));
            }
            Ok(ops
                .iter()
                .map(|o| matches!(o, WriteOp::End { ip, .. } if ip.octets()[3] % 2 == 0))
                .collect())
        }
    }

    fn end(last: u8) -> WriteOp {
        WriteOp::End {
            ip: if last == 0 {
                Ipv4Addr::UNSPECIFIED
            } else {
                Ipv4Addr::new(10, 0, 0, last)
            },
            mac: "52:54:00:00:00:01".parse().expect("mac"),
            state: LeaseState::Released,
            expires_ms: 0,
            now_ms: 0,
        }
    }

    #[tokio::test]
    async fn dhcp_lease_writes_queued_together_share_a_batch_and_a_bad_one_fails_alone() {
        let fake = Arc::new(Fake {
            sizes: Mutex::new(Vec::new()),
            gate: tokio::sync::Semaphore::new(0),
        });
        let w = GroupCommit::spawn(fake.clone(), 1);
        // One write starts a batch and blocks in it; the next ones queue behind it.
        let first = tokio::spawn({
            let w = w.clone();
            async move { w.write(end(2)).await }
        });
        tokio::task::yield_now().await;
        let rest: Vec<_> = [3u8, 0, 4]
            .into_iter()
            .map(|last| {
                let w = w.clone();
                tokio::spawn(async move { w.write(end(last)).await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        fake.gate.add_permits(100);
        assert!(first.await.expect("join").expect("write"));
        let mut got = Vec::new();
        for t in rest {
            got.push(t.await.expect("join").map_err(|e| e.to_string()));
        }
        assert_eq!(
            got,
            vec![Ok(false), Err("database: bad write".to_string()), Ok(true)],
            "results in order; the bad write fails alone"
        );
        // [first], then the three queued together (rolled back), then each alone.
        assert_eq!(*fake.sizes.lock().expect("lock"), vec![1, 3, 1, 1, 1]);
    }
}
