//! Which decoded requests are decided at all: the flood guard, run before any task is spawned.
//! Each MAC gets a token bucket, so one client that floods is dropped and others are not; clients
//! the inventory does not know share one more bucket per arrival (the interface, or the relay
//! that forwarded them), so a flood of random MACs (each one new, each bucket full) cannot take the
//! decisions, the database and the answers away from the machines Plinth does know. Every check
//! is O(1) and the memory is bounded: per-MAC buckets live in two generations of at most
//! [`GENERATION`] entries each, the older one dropped whole when the newer fills.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::Instant;

use crate::domain::MacAddr;

/// Entries per generation of the per-MAC and per-source maps.
pub const GENERATION: usize = 65_536;

/// A token bucket.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Self {
        Bucket {
            tokens: burst,
            at: now,
        }
    }

    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> bool {
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * rate).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A bounded map of buckets: two generations, O(1) per look-up.
struct Buckets<K> {
    young: HashMap<K, Bucket>,
    old: HashMap<K, Bucket>,
    rate: f64,
    burst: f64,
}

impl<K: Hash + Eq + Copy> Buckets<K> {
    fn new(rate: f64, burst: f64) -> Self {
        Buckets {
            young: HashMap::new(),
            old: HashMap::new(),
            rate,
            burst,
        }
    }

    fn take(&mut self, key: K, now: Instant) -> bool {
        let (rate, burst) = (self.rate, self.burst);
        if let Some(b) = self.young.get_mut(&key) {
            return b.take(rate, burst, now);
        }
        let mut b = self
            .old
            .remove(&key)
            .unwrap_or_else(|| Bucket::full(burst, now));
        let ok = b.take(rate, burst, now);
        if self.young.len() >= GENERATION {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, b);
        ok
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }
}

/// Where a request came from, for the shared bucket of unknown clients.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Source {
    /// Relayed by this agent (`giaddr`).
    Relay(Ipv4Addr),
    /// Arrived directly on this interface (its index, 0 for a socket bound to one interface).
    Interface(u32),
}

/// The decision for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Decide it.
    Admit,
    /// This MAC sends faster than any firmware does.
    MacFlood,
    /// Too many unknown clients at once from this interface or relay.
    UnknownFlood,
}

impl Verdict {
    /// The drop reason counted in `plinth_dhcp_dropped_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Verdict::Admit => "admitted",
            Verdict::MacFlood => "rate_limited",
            Verdict::UnknownFlood => "unknown_flood",
        }
    }
}

/// Rates of the guard.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    /// Requests per second of one MAC.
    pub per_mac: f64,
    /// Burst of one MAC.
    pub per_mac_burst: f64,
    /// Requests per second of clients the inventory does not know, per interface or relay
    /// (0: no limit).
    pub unknown: f64,
    /// Their burst.
    pub unknown_burst: f64,
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            per_mac: 20.0,
            per_mac_burst: 40.0,
            // A thousand new machines powered on together, with room for their retransmissions.
            unknown: 2000.0,
            unknown_burst: 4000.0,
        }
    }
}

/// The flood guard (see the module's paragraph).
pub struct Admission {
    macs: Mutex<Buckets<MacAddr>>,
    unknown: Mutex<Buckets<Source>>,
    unknown_limited: bool,
}

impl Admission {
    /// A guard with `rates`.
    pub fn new(rates: Rates) -> Self {
        Admission {
            macs: Mutex::new(Buckets::new(rates.per_mac, rates.per_mac_burst)),
            unknown: Mutex::new(Buckets::new(rates.unknown, rates.unknown_burst)),
            unknown_limited: rates.unknown > 0.0,
        }
    }

    /// Admit a request of `mac` from `source`; `known` says the inventory knows the MAC.
    pub fn admit(&self, mac: MacAddr, source: Source, known: bool) -> Verdict {
        let now = Instant::now();
        if !self
            .macs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(mac, now)
        {
            return Verdict::MacFlood;
        }
        if !known
            && self.unknown_limited
            && !self
                .unknown
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(source, now)
        {
            return Verdict::UnknownFlood;
        }
        Verdict::Admit
    }

    /// Per-MAC buckets held now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.macs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(n: u64) -> MacAddr {
        let b = n.to_be_bytes();
        MacAddr([0x02, b[3], b[4], b[5], b[6], b[7]])
    }

    #[test]
    fn one_mac_is_limited_and_others_are_not() {
        let g = Admission::new(Rates::default());
        let src = Source::Interface(1);
        let admitted = (0..100)
            .filter(|_| g.admit(mac(1), src, true) == Verdict::Admit)
            .count();
        assert!((40..=42).contains(&admitted), "burst of 40, got {admitted}");
        assert_eq!(g.admit(mac(2), src, true), Verdict::Admit);
    }

    #[test]
    fn a_random_mac_flood_cannot_starve_known_machines_and_memory_stays_bounded() {
        let g = Admission::new(Rates {
            unknown: 500.0,
            unknown_burst: 1000.0,
            ..Rates::default()
        });
        let src = Source::Interface(1);
        let mut unknown_admitted = 0;
        for n in 0..300_000u64 {
            if g.admit(mac(1_000_000 + n), src, false) == Verdict::Admit {
                unknown_admitted += 1;
            }
            if n % 25_000 == 0 {
                assert_eq!(
                    g.admit(mac(7), src, true),
                    Verdict::Admit,
                    "a known machine is answered during the flood"
                );
            }
        }
        // The burst, plus 500 a second for as long as the loop runs (well under ten seconds).
        assert!(
            unknown_admitted < 1_000 + 5_000,
            "the unknown budget holds: {unknown_admitted}"
        );
        assert!(g.tracked() <= 2 * GENERATION, "bounded: {}", g.tracked());
        // Another interface or relay has its own budget.
        assert_eq!(
            g.admit(
                mac(9_999_999),
                Source::Relay(Ipv4Addr::new(10, 9, 0, 1)),
                false
            ),
            Verdict::Admit
        );
    }
}
