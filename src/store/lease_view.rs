//! A store's committed DHCP leases, in memory: read once when the store opens, then changed by the
//! group commit, with the rows its statements returned, after their transaction committed. DHCP's
//! look-ups (by address, a MAC's newest lease, the busy addresses of a subnet) read it instead of
//! a reader connection. Durability is unchanged: a claim is answered (and an ACK sent) only after
//! its transaction committed, and the view learns a row only then.
//!
//! On SQLite one process owns the file and every lease write goes through that group commit, so
//! the view is what the table holds, and the writer skips statements it shows to be no-ops. On
//! PostgreSQL other instances write the shared table too: the store also applies the rows they
//! wrote, read every 100 ms (`postgres::follow_leases`), and the view is only a guide there (the
//! conditional upsert in the database decides every claim). Imports the leases port's types only.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::RwLock;

use crate::domain::MacAddr;
use crate::service::ports::{Lease, LeaseState};

/// Rows by address, and each MAC's addresses.
#[derive(Default)]
struct Rows {
    by_ip: HashMap<Ipv4Addr, Lease>,
    by_mac: HashMap<MacAddr, Vec<Ipv4Addr>>,
}

impl Rows {
    fn put(&mut self, row: Lease) {
        let (ip, mac) = (row.ip, row.mac);
        if let Some(old) = self.by_ip.insert(ip, row) {
            if old.mac == mac {
                return;
            }
            if let Some(ips) = self.by_mac.get_mut(&old.mac) {
                ips.retain(|i| *i != ip);
                if ips.is_empty() {
                    self.by_mac.remove(&old.mac);
                }
            }
        }
        self.by_mac.entry(mac).or_default().push(ip);
    }

    fn of_mac(&self, mac: MacAddr) -> impl Iterator<Item = &Lease> {
        self.by_mac
            .get(&mac)
            .into_iter()
            .flatten()
            .filter_map(|ip| self.by_ip.get(ip))
    }
}

/// The committed lease rows (see the module's paragraph).
#[derive(Default)]
pub(crate) struct LeaseView {
    rows: RwLock<Rows>,
}

impl std::fmt::Debug for LeaseView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseView").finish_non_exhaustive()
    }
}

/// Live for the lease look-ups: offered or bound (expired or not).
fn live(l: &Lease) -> bool {
    matches!(l.state, LeaseState::Offered | LeaseState::Bound)
}

impl LeaseView {
    /// A view of `rows` (the whole table).
    pub(crate) fn load(rows: impl IntoIterator<Item = Lease>) -> Self {
        let mut r = Rows::default();
        for row in rows {
            r.put(row);
        }
        LeaseView {
            rows: RwLock::new(r),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Rows> {
        self.rows.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Rows a committed transaction wrote (each as it is now in the table), in order.
    pub(crate) fn apply(&self, rows: impl IntoIterator<Item = Lease>) {
        let mut r = self.rows.write().unwrap_or_else(|e| e.into_inner());
        for row in rows {
            r.put(row);
        }
    }

    /// The row of `ip`.
    pub(crate) fn by_ip(&self, ip: Ipv4Addr) -> Option<Lease> {
        self.read().by_ip.get(&ip).cloned()
    }

    /// `mac`'s newest offered or bound lease in `subnet` (the latest change; the higher address
    /// of two changed in the same millisecond).
    pub(crate) fn newest(&self, subnet: &str, mac: MacAddr) -> Option<Lease> {
        self.read()
            .of_mac(mac)
            .filter(|l| live(l) && l.subnet == subnet)
            .max_by_key(|l| (l.updated_ms, l.ip))
            .cloned()
    }

    /// Addresses of `subnet` not reusable at `now_ms`: offered, bound or declined, unexpired.
    pub(crate) fn busy(&self, subnet: &str, now_ms: i64) -> Vec<Ipv4Addr> {
        self.read()
            .by_ip
            .values()
            .filter(|l| {
                l.subnet == subnet
                    && l.expires_ms >= now_ms
                    && matches!(
                        l.state,
                        LeaseState::Offered | LeaseState::Bound | LeaseState::Declined
                    )
            })
            .map(|l| l.ip)
            .collect()
    }

    /// Would a claim of `keep` by `mac` in `subnet` expire any of the MAC's other rows there (its
    /// other offers; and when `binds`, its other bound leases)? False lets the writer skip that
    /// statement.
    pub(crate) fn has_others(
        &self,
        subnet: &str,
        mac: MacAddr,
        keep: Ipv4Addr,
        binds: bool,
    ) -> bool {
        self.read().of_mac(mac).any(|l| {
            l.ip != keep
                && l.subnet == subnet
                && (l.state == LeaseState::Offered || (binds && l.state == LeaseState::Bound))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ip: u8, mac: u8, state: LeaseState, updated: i64) -> Lease {
        Lease {
            ip: Ipv4Addr::new(10, 0, 0, ip),
            subnet: "10.0.0.0/24".into(),
            mac: MacAddr([2, 0, 0, 0, 0, mac]),
            state,
            expires_ms: updated + 1000,
            hostname: None,
            relay_circuit_id: None,
            relay_remote_id: None,
            giaddr: None,
            updated_ms: updated,
        }
    }

    #[test]
    fn a_row_moving_to_another_mac_leaves_the_first_macs_index() {
        let v = LeaseView::load([
            row(1, 1, LeaseState::Bound, 10),
            row(2, 1, LeaseState::Offered, 20),
        ]);
        let (net, m1, m2) = (
            "10.0.0.0/24",
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
        );
        assert_eq!(
            v.newest(net, m1).map(|l| l.ip),
            Some(Ipv4Addr::new(10, 0, 0, 2))
        );
        assert!(v.has_others(net, m1, Ipv4Addr::new(10, 0, 0, 1), false));
        assert!(!v.has_others(net, m1, Ipv4Addr::new(10, 0, 0, 2), false));
        assert!(v.has_others(net, m1, Ipv4Addr::new(10, 0, 0, 2), true));
        v.apply([row(2, 2, LeaseState::Bound, 30)]);
        assert_eq!(
            v.newest(net, m1).map(|l| l.ip),
            Some(Ipv4Addr::new(10, 0, 0, 1))
        );
        assert_eq!(v.read().of_mac(m1).count(), 1);
        assert_eq!(v.newest(net, m2).map(|l| l.updated_ms), Some(30));
        assert_eq!(v.newest("10.1.0.0/24", m2), None);
        v.apply([row(1, 1, LeaseState::Released, 40)]);
        assert_eq!(v.newest(net, m1), None);
        let mut busy = v.busy(net, 0);
        busy.sort();
        assert_eq!(busy, vec![Ipv4Addr::new(10, 0, 0, 2)]);
        assert!(v.busy(net, 2000).is_empty(), "expired");
    }
}
