//! Bounds on what anonymous requests can write: an event of a kind, for a machine, caused by one
//! source address, is written at most once per interval; the ones in between are counted and the
//! count rides on the next event written (`"suppressed": n`), so a flood of refused config fetches
//! or foreign script requests cannot bury a machine's timeline, and nothing is silently lost.
//! [`Buckets`] is the rate form of the same bound: token buckets per key (a source network, say),
//! for writes that may come in bursts, such as machines discovered when a rack powers on; and
//! [`Budget`] both at once, a burst then a rate with the refused writes counted into the next
//! one, for a machine's boot steps and boot-script requests (a boot makes a few; a flood of
//! script requests or spoofed TFTP reads makes thousands).
//! Memory is bounded: two generations of at most [`GENERATION`] keys each, O(1) per check.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Keys per generation.
pub const GENERATION: usize = 65_536;

/// When a key last wrote, and what it suppressed since.
#[derive(Clone, Copy, Debug)]
struct Slot {
    wrote: Instant,
    suppressed: u64,
}

/// A per-key "at most once per interval" gate (see the module's paragraph).
pub struct Throttle {
    every: Duration,
    slots: Mutex<(HashMap<u64, Slot>, HashMap<u64, Slot>)>,
}

impl std::fmt::Debug for Throttle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

fn key_of(key: &impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

impl Throttle {
    /// At most one write per key every `every`.
    pub fn new(every: Duration) -> Self {
        Throttle {
            every,
            slots: Mutex::default(),
        }
    }

    /// May `key` write now? `Some(n)`: yes, and `n` writes were suppressed since its last one;
    /// `None`: not now (counted).
    pub fn admit(&self, key: &impl Hash) -> Option<u64> {
        let k = key_of(key);
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let (young, old) = &mut *slots;
        let slot = match young.get(&k).copied().or_else(|| old.remove(&k)) {
            Some(mut s) if now.duration_since(s.wrote) < self.every => {
                s.suppressed += 1;
                young.insert(k, s);
                return None;
            }
            Some(s) => s.suppressed,
            None => 0,
        };
        if young.len() >= GENERATION && !young.contains_key(&k) {
            *old = std::mem::take(young);
        }
        young.insert(
            k,
            Slot {
                wrote: now,
                suppressed: 0,
            },
        );
        Some(slot)
    }
}

/// Key -> tokens left and when they were counted.
type Tokens = HashMap<u64, (f64, Instant)>;

/// Token buckets per key: `burst` at once, refilled at `per_second` (see the module's paragraph).
pub struct Buckets {
    per_second: f64,
    burst: f64,
    /// Two generations of keys.
    slots: Mutex<(Tokens, Tokens)>,
}

impl std::fmt::Debug for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buckets")
            .field("per_second", &self.per_second)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl Buckets {
    /// Buckets of `burst` tokens (at least one) refilled at `per_second`.
    pub fn new(per_second: f64, burst: f64) -> Self {
        Buckets {
            per_second: per_second.max(0.0),
            burst: burst.max(1.0),
            slots: Mutex::default(),
        }
    }

    /// Take a token of `key`'s bucket: `true` when there was one.
    pub fn take(&self, key: &impl Hash) -> bool {
        let k = key_of(key);
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let (young, old) = &mut *slots;
        let (tokens, at) = young
            .get(&k)
            .copied()
            .or_else(|| old.remove(&k))
            .unwrap_or((self.burst, now));
        let tokens =
            (tokens + now.duration_since(at).as_secs_f64() * self.per_second).min(self.burst);
        let (left, ok) = if tokens >= 1.0 {
            (tokens - 1.0, true)
        } else {
            (tokens, false)
        };
        if young.len() >= GENERATION && !young.contains_key(&k) {
            *old = std::mem::take(young);
        }
        young.insert(k, (left, now));
        ok
    }
}

/// Key -> tokens left, when they were counted, and writes refused since the key's last one.
type Counted = HashMap<u64, (f64, Instant, u64)>;

/// Token buckets per key that count what they refuse, for writes that come in bursts but must
/// not flood (a machine's boot steps, its boot-script requests): `burst` at once, then
/// `per_second`; a refused write is counted and the count rides on the key's next write.
pub struct Budget {
    per_second: f64,
    burst: f64,
    /// Two generations of keys.
    slots: Mutex<(Counted, Counted)>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("per_second", &self.per_second)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl Budget {
    /// Buckets of `burst` writes (at least one) refilled at `per_second`.
    pub fn new(per_second: f64, burst: f64) -> Self {
        Budget {
            per_second: per_second.max(0.0),
            burst: burst.max(1.0),
            slots: Mutex::default(),
        }
    }

    /// May `key` write now? `Some(n)`: yes, and `n` of its writes were refused since its last
    /// one; `None`: not now (counted).
    pub fn admit(&self, key: &impl Hash) -> Option<u64> {
        let k = key_of(key);
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let (young, old) = &mut *slots;
        let (tokens, at, refused) = young
            .get(&k)
            .copied()
            .or_else(|| old.remove(&k))
            .unwrap_or((self.burst, now, 0));
        let tokens =
            (tokens + now.duration_since(at).as_secs_f64() * self.per_second).min(self.burst);
        let (slot, answer) = if tokens >= 1.0 {
            ((tokens - 1.0, now, 0), Some(refused))
        } else {
            ((tokens, now, refused + 1), None)
        };
        if young.len() >= GENERATION && !young.contains_key(&k) {
            *old = std::mem::take(young);
        }
        young.insert(k, slot);
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_allow_a_burst_then_the_rate() {
        let b = Buckets::new(0.0, 3.0);
        assert_eq!((0..5).filter(|_| b.take(&"a")).count(), 3);
        assert!(b.take(&"b"), "another key has its own bucket");
        let b = Buckets::new(1000.0, 1.0);
        assert!(b.take(&"a"));
        std::thread::sleep(Duration::from_millis(20));
        assert!(b.take(&"a"), "refilled");
    }

    #[test]
    fn once_per_interval_with_the_count_carried_over() {
        let t = Throttle::new(Duration::from_millis(200));
        assert_eq!(t.admit(&("m1", "10.0.0.9")), Some(0));
        for _ in 0..50 {
            assert_eq!(t.admit(&("m1", "10.0.0.9")), None);
        }
        assert_eq!(t.admit(&("m1", "10.0.0.8")), Some(0), "another source");
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(t.admit(&("m1", "10.0.0.9")), Some(50));
    }

    #[test]
    fn a_budget_allows_a_burst_then_counts_what_it_refuses() {
        let b = Budget::new(0.0, 3.0);
        let answers: Vec<Option<u64>> = (0..6).map(|_| b.admit(&"m1")).collect();
        assert_eq!(answers, [Some(0), Some(0), Some(0), None, None, None]);
        assert_eq!(b.admit(&"m2"), Some(0), "another key has its own budget");
        let b = Budget::new(1000.0, 1.0);
        assert_eq!(b.admit(&"m1"), Some(0));
        assert_eq!(b.admit(&"m1"), None);
        assert_eq!(b.admit(&"m1"), None);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            b.admit(&"m1"),
            Some(2),
            "refilled, with the count of the refused"
        );
    }

    #[test]
    fn memory_is_bounded() {
        let t = Throttle::new(Duration::from_secs(60));
        for n in 0..(3 * GENERATION as u64) {
            t.admit(&n);
        }
        let (young, old) = &*t.slots.lock().expect("lock");
        assert!(young.len() + old.len() <= 2 * GENERATION);
    }
}
