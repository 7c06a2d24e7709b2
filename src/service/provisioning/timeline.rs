//! The boot timeline: every DHCP, TFTP and HTTP step seen for a machine, as events of that
//! machine, so a tech can see where a boot stopped. The provisioning service reports steps with
//! what it knows (the machine, a MAC, or only the client's address); a background task finds the
//! machine (`Identities`: by MAC, else by the address's lease or reservation) and writes the
//! events in batches, off the hot path: a boot never waits for the timeline's database writes, and
//! when the queue is full a step is dropped and counted rather than slowing a boot. Steps come
//! from anonymous packets (a spoofed TFTP read, DISCOVERs with a machine's MAC), so each machine
//! and kind has a budget: a burst, then a rate, the steps between counted into the next event
//! written (`"suppressed": n`) and in `plinth_timeline_suppressed_total`.
//!
//! Takes the events port; imports `domain` and the rest of `service`, nothing from `store` or the
//! front doors.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::identity::Identities;
use crate::domain::{MacAddr, MachineId};
use crate::service::ports::{EventStore, NewEvent};

/// One step of a boot.
#[derive(Clone, Debug)]
pub struct Step {
    /// Event kind, e.g. `dhcp.ack`, `tftp.read`, `http.image`.
    pub kind: &'static str,
    /// The client's MAC, when the protocol tells it.
    pub mac: Option<MacAddr>,
    /// The client's address.
    pub ip: Option<Ipv4Addr>,
    /// The machine, when the front door's request was already resolved to one.
    pub machine: Option<MachineId>,
    /// What happened (never secrets).
    pub detail: serde_json::Value,
}

/// Where front doors report steps.
#[derive(Clone)]
pub struct Timeline {
    tx: mpsc::Sender<Step>,
    dropped: Counter,
    suppressed: Counter,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline").finish_non_exhaustive()
    }
}

impl Timeline {
    /// Start the writer, which finds a step's machine through `identities` and writes the steps
    /// to `events`; it stops when `stop` is cancelled (after writing what is queued).
    pub fn start(
        events: Arc<dyn EventStore>,
        identities: Identities,
        stop: CancellationToken,
    ) -> Timeline {
        let (tx, rx) = mpsc::channel(QUEUE);
        let suppressed = Counter::default();
        tokio::spawn(writer(events, identities, rx, stop, suppressed.clone()));
        Timeline {
            tx,
            dropped: Counter::default(),
            suppressed,
        }
    }

    /// Report a step; never waits.
    pub fn record(&self, step: Step) {
        if self.tx.try_send(step).is_err() {
            self.dropped.inc();
        }
    }

    /// Steps dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Steps over their machine's budget (counted into its next event instead of written).
    pub fn suppressed(&self) -> u64 {
        self.suppressed.get()
    }

    /// Export the dropped steps as `plinth_timeline_dropped_total`.
    pub fn register(&self, metrics: &crate::metrics::Metrics) {
        metrics.register(
            "timeline_dropped",
            "Boot timeline steps dropped because the writer's queue was full",
            self.dropped.clone(),
        );
        metrics.register(
            "timeline_suppressed",
            "Boot timeline steps over their machine's budget, counted into its next event",
            self.suppressed.clone(),
        );
    }
}

/// Steps queued for the writer at most (a boot storm of 1,000 machines makes some 10,000 within
/// half a minute).
const QUEUE: usize = 65_536;

/// How long the writer gathers steps after the first of a batch: a boot storm's steps (a
/// TFTP read per transfer, two DHCP rounds per machine) are written a batch and a look-up at a
/// time, not one each.
const GATHER: Duration = Duration::from_millis(50);
/// Steps in one batch at most.
const BATCH: usize = 256;

/// Steps of one kind for one machine written at once (a boot makes two DHCP rounds, PXE's and
/// iPXE's, and a few TFTP and HTTP reads)...
const STEP_BURST: f64 = 20.0;
/// ...and then per second.
const STEP_RATE: f64 = 0.2;

/// The machine a step belongs to: the one it names, else the owner of its MAC, else the machine
/// at its address. A look-up that fails loses the step (logged), never the writer.
async fn machine_of(identities: &Identities, step: &Step) -> Option<MachineId> {
    if step.machine.is_some() {
        return step.machine;
    }
    let found = match (step.mac, step.ip) {
        (Some(mac), _) => identities.machine_of_mac(mac).await,
        (None, Some(ip)) => identities.machine_at(ip).await,
        (None, None) => return None,
    };
    found.unwrap_or_else(|e| {
        tracing::warn!(error = %e, kind = step.kind, "boot timeline: machine look-up failed");
        None
    })
}

async fn writer(
    store: Arc<dyn EventStore>,
    identities: Identities,
    mut rx: mpsc::Receiver<Step>,
    stop: CancellationToken,
    suppressed: Counter,
) {
    let budget = crate::service::throttle::Budget::new(STEP_RATE, STEP_BURST);
    let mut batch = Vec::new();
    loop {
        let first = tokio::select! {
            s = rx.recv() => s,
            _ = stop.cancelled() => { rx.close(); rx.recv().await }
        };
        let Some(first) = first else { return };
        batch.push(first);
        // Gather what arrives within a moment (GATHER), up to a bounded batch (BATCH): one timer
        // for the batch, the steps taken as many at a time as are queued.
        let until = tokio::time::Instant::now() + GATHER;
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            match tokio::time::timeout_at(until, rx.recv_many(&mut batch, room)).await {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        // The MACs of the batch whose machine is not remembered, in one look-up.
        let macs = batch
            .iter()
            .filter(|s| s.machine.is_none())
            .filter_map(|s| s.mac);
        if let Err(e) = identities.remember_owners(macs).await {
            tracing::warn!(error = %e, "boot timeline: machine look-up failed");
        }
        let mut events = Vec::with_capacity(batch.len());
        for step in batch.drain(..) {
            let machine = machine_of(&identities, &step).await;
            if let ("dhcp.ack", Some(mac), Some(ip)) = (step.kind, step.mac, step.ip) {
                // Steps after this one known by this address are the new holder's.
                identities.acknowledged(ip, mac);
            }
            let Some(id) = machine else {
                continue;
            };
            let Some(over) = budget.admit(&(id, step.kind)) else {
                suppressed.inc();
                continue;
            };
            let mut detail = step.detail;
            if let (true, serde_json::Value::Object(o)) = (over > 0, &mut detail) {
                o.insert("suppressed".into(), over.into());
            }
            if let (Some(ip), serde_json::Value::Object(o)) = (step.ip, &mut detail) {
                o.entry("ip").or_insert_with(|| ip.to_string().into());
            }
            events.push(NewEvent {
                machine_id: Some(id),
                kind: step.kind.into(),
                actor: "boot".into(),
                detail,
            });
        }
        write_batch(&store, &events).await;
    }
}

/// Write one batch in one transaction: a commit per step would cost an fsync each, on the same
/// single SQLite writer that DHCP's lease commits wait for (a boot storm of 1,000 machines makes
/// some 7,000 steps). A batch that fails is retried one event at a time, so one bad event does
/// not lose the others.
async fn write_batch(store: &Arc<dyn EventStore>, events: &[NewEvent]) {
    if events.is_empty() || store.append_events(events).await.is_ok() {
        return;
    }
    for ev in events {
        if let Err(e) = store.append_event(ev).await {
            tracing::warn!(error = %e, "boot timeline: event not written");
        }
    }
}
