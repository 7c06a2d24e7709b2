//! Bounds on what anonymous requests can write: an event of a kind, for a machine, caused by one
//! source address, is written at most once per interval; the ones in between are counted and the
//! count rides on the next event written (`"suppressed": n`), so a flood of refused config fetches
//! or foreign script requests cannot bury a machine's timeline, and nothing is silently lost.
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn memory_is_bounded() {
        let t = Throttle::new(Duration::from_secs(60));
        for n in 0..(3 * GENERATION as u64) {
            t.admit(&n);
        }
        let (young, old) = &*t.slots.lock().expect("lock");
        assert!(young.len() + old.len() <= 2 * GENERATION);
    }
}
