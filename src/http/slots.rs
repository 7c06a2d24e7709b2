//! Connection slots of an HTTP listener (the main port and the image door): a global cap, taken
//! before a connection is accepted (past it, clients wait in the kernel's listen backlog and cost
//! Plinth no descriptor), and a per-client cap, checked right after accept (a client over it is
//! closed at once). The per-client map only holds clients with a connection open, so it is bounded
//! by the global cap. Imports nothing of the crate.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections open per client address.
type Open = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// The caps of one listener.
#[derive(Clone, Debug)]
pub struct Slots {
    global: Arc<Semaphore>,
    per_client: usize,
    open: Open,
    refused: Counter,
}

/// A connection's slot: released (globally and for its client) when dropped.
#[derive(Debug)]
pub struct Slot {
    _global: OwnedSemaphorePermit,
    client: Option<(IpAddr, Open)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((ip, open)) = self.client.take() {
            let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = open.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&ip);
                }
            }
        }
    }
}

/// A global slot, waiting for a client to be accepted.
#[derive(Debug)]
pub struct Free(OwnedSemaphorePermit);

impl Slots {
    /// At most `global` connections at once, `per_client` from one address; `refused` counts the
    /// connections closed for being over the per-client cap.
    pub fn new(global: usize, per_client: usize, refused: Counter) -> Self {
        Slots {
            global: Arc::new(Semaphore::new(global.max(1))),
            per_client: per_client.max(1),
            open: Arc::default(),
            refused,
        }
    }

    /// Wait for a global slot (before `accept`).
    pub async fn free(&self) -> Option<Free> {
        self.global.clone().acquire_owned().await.ok().map(Free)
    }

    /// Give the global slot `free` to a connection from `ip`; `None` (and counted) when `ip` has
    /// its per-client share open already: the caller closes the connection.
    pub fn take(&self, free: Free, ip: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.per_client {
            drop(open);
            self.refused.inc();
            return None;
        }
        *n += 1;
        Some(Slot {
            _global: free.0,
            client: Some((ip, self.open.clone())),
        })
    }

    /// Connections open now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_gets_its_share_and_the_map_empties() {
        let refused = Counter::default();
        let slots = Slots::new(3, 2, refused.clone());
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let s1 = slots
            .take(slots.free().await.expect("free"), a)
            .expect("first");
        let s2 = slots
            .take(slots.free().await.expect("free"), a)
            .expect("second");
        assert!(slots.take(slots.free().await.expect("free"), a).is_none());
        assert_eq!(refused.get(), 1);
        let s3 = slots.take(slots.free().await.expect("free"), b).expect("b");
        // Three open: the global cap is reached; a fourth waits.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), slots.free())
                .await
                .is_err()
        );
        drop((s1, s2, s3));
        assert_eq!(slots.open(), 0);
        assert!(slots.open.lock().expect("lock").is_empty());
    }
}
