//! The boot timeline: every DHCP, TFTP and HTTP step seen for a machine, as events of that
//! machine, so a tech can see where a boot stopped. Front doors report steps with what they know
//! (a MAC, or only the client's address); a background task finds the machine (by MAC, else by
//! the address's lease or reservation) and writes the events in batches, off the hot path: a
//! front door never waits for the database, and when the queue is full a step is dropped and
//! counted rather than slowing a boot.
//!
//! Takes the machines, leases and events ports; imports `domain` and nothing from `store` or the
//! front doors.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::ports::{EventStore, LeaseStore, MachineStore, NewEvent};
use crate::domain::{MacAddr, UniqueKey};

/// One step of a boot.
#[derive(Clone, Debug)]
pub struct Step {
    /// Event kind, e.g. `dhcp.ack`, `tftp.read`, `http.image`.
    pub kind: &'static str,
    /// The client's MAC, when the protocol tells it.
    pub mac: Option<MacAddr>,
    /// The client's address.
    pub ip: Option<Ipv4Addr>,
    /// What happened (never secrets).
    pub detail: serde_json::Value,
}

/// Where front doors report steps.
#[derive(Clone)]
pub struct Timeline {
    tx: mpsc::Sender<Step>,
    dropped: Counter,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline").finish_non_exhaustive()
    }
}

impl Timeline {
    /// Start the writer, which finds a step's machine through `machines` and `leases` and writes
    /// the steps to `events`; it stops when `stop` is cancelled (after writing what is queued).
    pub fn start(
        machines: Arc<dyn MachineStore>,
        leases: Arc<dyn LeaseStore>,
        events: Arc<dyn EventStore>,
        stop: CancellationToken,
    ) -> Timeline {
        let (tx, rx) = mpsc::channel(QUEUE);
        let ports = Ports {
            machines,
            leases,
            events,
        };
        tokio::spawn(writer(ports, rx, stop));
        Timeline {
            tx,
            dropped: Counter::default(),
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

    /// Export the dropped steps as `plinth_timeline_dropped_total`.
    pub fn register(&self, metrics: &crate::metrics::Metrics) {
        metrics.register(
            "timeline_dropped",
            "Boot timeline steps dropped because the writer's queue was full",
            self.dropped.clone(),
        );
    }
}

/// What the writer reads and writes: machines and leases to find a step's machine, the event log
/// to write the steps to.
struct Ports {
    machines: Arc<dyn MachineStore>,
    leases: Arc<dyn LeaseStore>,
    events: Arc<dyn EventStore>,
}

/// Steps queued for the writer at most (a boot storm of 1,000 machines makes some 10,000 within
/// half a minute).
const QUEUE: usize = 65_536;

async fn machine_of(store: &Ports, step: &Step) -> Option<crate::domain::MachineId> {
    let mut mac = step.mac;
    if mac.is_none() {
        if let Some(ip) = step.ip {
            if let Ok(Some(l)) = store.leases.lease_by_ip(ip).await {
                mac = Some(l.mac);
            } else if let Ok(Some(m)) = store.machines.find_machine(&UniqueKey::Ipv4(ip)).await {
                return Some(m.id);
            }
        }
    }
    let mac = mac?;
    store
        .machines
        .find_machine(&UniqueKey::Mac(mac))
        .await
        .ok()
        .flatten()
        .map(|m| m.id)
}

/// MAC -> machine and address -> machine, remembered for a while (unknown ones too), so a DHCP
/// load of unknown clients does not cost a database look-up per packet, nor a boot's TFTP and HTTP
/// steps (known by address only) two look-ups each. An ACK step (MAC and address) refreshes its
/// address's entry, so an address that passes to another machine is attributed to the new one
/// from its ACK on.
struct MachineCache {
    map: Remembered<MacAddr>,
    by_ip: Remembered<Ipv4Addr>,
}

/// Key -> the machine it belonged to (or none) and when that was looked up.
type Remembered<K> =
    std::collections::HashMap<K, (Option<crate::domain::MachineId>, std::time::Instant)>;

impl MachineCache {
    const TTL: Duration = Duration::from_secs(10);

    async fn machine_of(&mut self, store: &Ports, step: &Step) -> Option<crate::domain::MachineId> {
        let Some(mac) = step.mac else {
            let ip = step.ip?;
            if let Some(id) = Self::fresh(&self.by_ip, &ip) {
                return id;
            }
            let id = machine_of(store, step).await;
            Self::remember(&mut self.by_ip, ip, id);
            return id;
        };
        let id = match Self::fresh(&self.map, &mac) {
            Some(id) => id,
            None => {
                let id = machine_of(store, step).await;
                Self::remember(&mut self.map, mac, id);
                id
            }
        };
        if let (Some(ip), "dhcp.ack") = (step.ip, step.kind) {
            Self::remember(&mut self.by_ip, ip, id);
        }
        id
    }

    /// The remembered machine of `key`, while the entry is younger than `TTL`.
    fn fresh<K: std::hash::Hash + Eq>(
        map: &Remembered<K>,
        key: &K,
    ) -> Option<Option<crate::domain::MachineId>> {
        map.get(key)
            .filter(|(_, at)| at.elapsed() < Self::TTL)
            .map(|(id, _)| *id)
    }

    fn remember<K: std::hash::Hash + Eq>(
        map: &mut Remembered<K>,
        key: K,
        id: Option<crate::domain::MachineId>,
    ) {
        if map.len() > 100_000 {
            map.clear();
        }
        map.insert(key, (id, std::time::Instant::now()));
    }
}

async fn writer(store: Ports, mut rx: mpsc::Receiver<Step>, stop: CancellationToken) {
    let mut cache = MachineCache {
        map: std::collections::HashMap::new(),
        by_ip: std::collections::HashMap::new(),
    };
    let mut batch = Vec::new();
    loop {
        let first = tokio::select! {
            s = rx.recv() => s,
            _ = stop.cancelled() => { rx.close(); rx.recv().await }
        };
        let Some(first) = first else { return };
        batch.push(first);
        // Gather what arrives within a moment, up to a bounded batch.
        let until = tokio::time::Instant::now() + Duration::from_millis(50);
        while batch.len() < 256 {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(s)) => batch.push(s),
                _ => break,
            }
        }
        let mut events = Vec::with_capacity(batch.len());
        for step in batch.drain(..) {
            let Some(id) = cache.machine_of(&store, &step).await else {
                continue;
            };
            let mut detail = step.detail;
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
        write_batch(&store.events, &events).await;
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
