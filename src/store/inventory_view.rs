//! What DHCP asks the inventory about a client (its NIC's machine and reserved address,
//! that machine's relay-circuit pin, the addresses reserved for other MACs), in memory, so that a
//! DISCOVER and a REQUEST need no reader connection. The view answers only while it is current:
//! - every write of this process (a turn at SQLite's writer connection, any write transaction on
//!   PostgreSQL: every change of `interfaces` and `dhcp_circuit_pins` made by the server is one)
//!   bumps a generation after its transaction ended, and the view answers only at the generation
//!   it was loaded at: a change through the API is seen by the next DHCP message;
//! - a change by another process (`plinth apply` against the same SQLite file while the server
//!   runs, another instance on the same PostgreSQL database) is not announced, so the view also
//!   ages out after [`MAX_AGE`] (longer for a large inventory: at least twenty times what a load
//!   took, so reloads cost at most about 5% of a core): such a change is seen within that time,
//!   as if it had been made that much later.
//!
//! When it is not current the caller reads the database as before, and one reload runs in the
//! background (one at a time, spaced by at least twenty times the last load's duration): a burst
//! of inventory writes costs what it did without the view, never a stale answer past those
//! bounds.
//!
//! Imports the leases port's types only.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use crate::domain::{MacAddr, MachineId};
use crate::service::ports::{CircuitPin, ClientFacts};

/// How long a loaded view answers at most without a reload (another process's writes are not
/// announced).
pub(crate) const MAX_AGE: Duration = Duration::from_secs(1);
/// A reload may start this long after the last one started, at the soonest (and not sooner than
/// twenty times the last one's duration).
const MIN_GAP: Duration = Duration::from_millis(50);

/// NICs past this many are not held (the view stays unloaded; look-ups read the database).
const MAX_NICS: usize = 1_000_000;

/// One NIC of the inventory.
#[derive(Clone, Debug)]
pub(crate) struct Nic {
    pub(crate) mac: MacAddr,
    pub(crate) machine: MachineId,
    /// The reserved address as stored (text).
    pub(crate) ipv4: Option<String>,
}

/// A machine's pin as DHCP compares it.
#[derive(Clone, Debug)]
pub(crate) struct Pin {
    pub(crate) machine: MachineId,
    pub(crate) relay: String,
    pub(crate) circuit_id: Option<String>,
}

#[derive(Default)]
struct Loaded {
    /// The generation the rows were read at (`None`: never loaded).
    generation: Option<u64>,
    /// When they were read, and for how long they answer.
    at: Option<Instant>,
    max_age: Duration,
    /// The reserved address is held parsed (no text per NIC: the view's size is a fixed cost
    /// per NIC; a stored address that does not parse is not a reservation DHCP can give).
    by_mac: HashMap<MacAddr, (MachineId, Option<Ipv4Addr>)>,
    /// Reserved address -> the MACs reserving it.
    by_ip: HashMap<Ipv4Addr, Vec<MacAddr>>,
    pins: HashMap<MachineId, (String, Option<String>)>,
}

impl Loaded {
    /// Loaded at `generation`, and young enough.
    fn current(&self, generation: u64) -> bool {
        self.generation == Some(generation) && self.at.is_some_and(|at| at.elapsed() < self.max_age)
    }
}

/// See [`InventoryView::writing`].
pub(crate) struct WriteGuard<'a>(&'a AtomicU64);

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// The in-memory inventory facts (see the module's paragraph).
pub(crate) struct InventoryView {
    generation: AtomicU64,
    loaded: RwLock<Loaded>,
    reloading: AtomicBool,
    /// When the last reload started, and how long the last load took.
    last_reload: std::sync::Mutex<(Option<Instant>, Duration)>,
}

impl std::fmt::Debug for InventoryView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InventoryView").finish_non_exhaustive()
    }
}

impl InventoryView {
    /// An empty view, at generation 0.
    pub(crate) fn new() -> Self {
        InventoryView {
            generation: AtomicU64::new(0),
            loaded: RwLock::default(),
            reloading: AtomicBool::new(false),
            last_reload: std::sync::Mutex::new((None, Duration::ZERO)),
        }
    }

    /// A write that may change the inventory is under way: when the guard drops (after its
    /// transaction ended) the generation moves on, and the view stops answering until reloaded.
    pub(crate) fn writing(&self) -> WriteGuard<'_> {
        WriteGuard(&self.generation)
    }

    /// The generation now: read it before reading the rows handed to `load`.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Replace the view with `nics` and `pins`, read after `generation` was, at `started`.
    pub(crate) fn load(&self, generation: u64, started: Instant, nics: Vec<Nic>, pins: Vec<Pin>) {
        let took = started.elapsed();
        self.last_reload.lock().unwrap_or_else(|e| e.into_inner()).1 = took;
        // The rows held now are stale (a reload runs only when the view is not current, and
        // callers read the database meanwhile): free them before building the new ones, so a
        // reload never holds two views at once (an import of 20,000 rows into an inventory of
        // 60,000 measured +29 MiB at its peak with both).
        *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = Loaded::default();
        let mut l = Loaded::default();
        if nics.len() <= MAX_NICS {
            l.generation = Some(generation);
            l.at = Some(started);
            l.max_age = MAX_AGE.max(took * 20);
            l.by_mac.reserve(nics.len());
            for nic in nics {
                let ip = nic.ipv4.as_deref().and_then(|s| s.parse::<Ipv4Addr>().ok());
                if let Some(ip) = ip {
                    l.by_ip.entry(ip).or_default().push(nic.mac);
                }
                l.by_mac.insert(nic.mac, (nic.machine, ip));
            }
            for p in pins {
                l.pins.insert(p.machine, (p.relay, p.circuit_id));
            }
        }
        *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = l;
    }

    /// Should the caller start a reload now? True for one caller at a time, spaced (see
    /// [`MIN_GAP`]), and only when the view is not current; that caller must call `reloaded`.
    pub(crate) fn claim_reload(&self) -> bool {
        if self.is_current() {
            return false;
        }
        let mut last = self.last_reload.lock().unwrap_or_else(|e| e.into_inner());
        let gap = MIN_GAP.max(last.1 * 20);
        if last.0.is_some_and(|at| at.elapsed() < gap) {
            return false;
        }
        if self.reloading.swap(true, Ordering::AcqRel) {
            return false;
        }
        last.0 = Some(Instant::now());
        true
    }

    /// The reload `claim_reload` granted is over (loaded or failed).
    pub(crate) fn reloaded(&self) {
        self.reloading.store(false, Ordering::Release);
    }

    fn is_current(&self) -> bool {
        let now = self.generation();
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .current(now)
    }

    /// The inventory's facts about `mac` and `ips` (the lease left out), if the view is current.
    pub(crate) fn facts(&self, mac: MacAddr, ips: [Option<Ipv4Addr>; 2]) -> Option<ClientFacts> {
        let now = self.generation();
        let l = self.loaded.read().unwrap_or_else(|e| e.into_inner());
        if !l.current(now) {
            return None;
        }
        let nic = l.by_mac.get(&mac);
        let machine = nic.map(|(m, _)| *m);
        let mut facts = ClientFacts {
            machine,
            reserved_ip: nic.and_then(|(_, ip)| *ip),
            pin: machine
                .and_then(|m| l.pins.get(&m))
                .map(|(relay, circuit)| CircuitPin {
                    relay: relay.clone(),
                    circuit_id: circuit.clone(),
                    remote_id: None,
                    pinned_at: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
                    pinned_by: String::new(),
                }),
            ..Default::default()
        };
        for ip in ips.into_iter().flatten() {
            if l.by_ip
                .get(&ip)
                .is_some_and(|macs| macs.iter().any(|m| *m != mac))
            {
                facts.reserved_for_other.push(ip);
            }
        }
        Some(facts)
    }

    /// The machine owning each of `macs` that has one, if the view is current.
    pub(crate) fn owners(&self, macs: &[MacAddr]) -> Option<Vec<(MacAddr, MachineId)>> {
        let now = self.generation();
        let l = self.loaded.read().unwrap_or_else(|e| e.into_inner());
        if !l.current(now) {
            return None;
        }
        Some(
            macs.iter()
                .filter_map(|m| l.by_mac.get(m).map(|(id, _)| (*m, *id)))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_answers_only_at_the_generation_it_was_loaded_at() {
        let v = InventoryView::new();
        let (a, b) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        let id = MachineId(uuid::Uuid::from_u128(7));
        assert!(v.facts(a, [None, None]).is_none(), "never loaded");
        assert!(v.claim_reload());
        assert!(!v.claim_reload(), "one reload at a time");
        v.load(
            0,
            Instant::now(),
            vec![Nic {
                mac: a,
                machine: id,
                ipv4: Some("10.0.0.5".into()),
            }],
            vec![Pin {
                machine: id,
                relay: "10.0.0.1".into(),
                circuit_id: None,
            }],
        );
        v.reloaded();
        let ip = Ipv4Addr::new(10, 0, 0, 5);
        let f = v.facts(a, [Some(ip), None]).expect("current");
        assert_eq!(f.machine, Some(id));
        assert_eq!(f.reserved_ip, Some(ip));
        assert!(f.pin.is_some_and(|p| p.is("10.0.0.1", None)));
        assert!(f.reserved_for_other.is_empty(), "its own reservation");
        let f = v.facts(b, [Some(ip), None]).expect("current");
        assert_eq!((f.machine, f.reserved_for_other), (None, vec![ip]));
        assert_eq!(v.owners(&[a, b]).expect("current"), vec![(a, id)]);
        // A write ended: stale until reloaded.
        drop(v.writing());
        assert!(v.facts(a, [None, None]).is_none());
        assert!(v.owners(&[a]).is_none());
    }
}
