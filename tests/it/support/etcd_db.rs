//! An etcd snapshot as the Talos API stand-in streams it: a bbolt database laid out as etcd's
//! (meta pages, a root bucket naming the `key` bucket, a B+tree of leaves keyed by revision under
//! branch pages), of a chosen size and newest revision, followed by etcd's SHA-256 trailer.
//! Generated page by page, deterministically (the same size and revision give the same bytes),
//! without ever holding the database: a 1 GiB snapshot costs a few pages of memory.
//!
//! Written from bbolt's documented page layout (see `plinth::talos::etcd_db`), which Plinth
//! reads back independently; the values are pseudo-random so that nothing compresses them.
#![allow(dead_code)]

use sha2::{Digest, Sha256};

pub const PAGE: usize = 4096;
const HEADER: usize = 16;
const ELEMENT: usize = 16;
/// Entries per leaf page and the size of each value (a leaf fills its page).
const PER_LEAF: usize = 4;
const VALUE: usize = (PAGE - HEADER - PER_LEAF * ELEMENT) / PER_LEAF - 17;
/// Children per branch page.
const FANOUT: u64 = 100;
const MAGIC: u32 = 0xED0C_DAED;

fn fnv1a64(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// 1 MiB of pseudo-random bytes the values are cut from.
fn noise() -> &'static [u8] {
    static NOISE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    NOISE.get_or_init(|| {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..(1 << 20) / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect()
    })
}

/// The layout of one generated database.
#[derive(Clone, Debug)]
pub struct EtcdDb {
    /// Pages of the database (the trailer follows).
    pub pages: u64,
    leaves: u64,
    /// (first page, count) of each branch level, bottom up.
    levels: Vec<(u64, u64)>,
    /// The `key` bucket's root page.
    key_root: u64,
    /// The newest revision.
    pub revision: u64,
}

impl EtcdDb {
    /// A database of about `bytes` (at least 8 pages) whose newest revision is `revision`.
    pub fn new(bytes: u64, revision: u64) -> EtcdDb {
        let pages = (bytes / PAGE as u64).max(8);
        let layout = |leaves: u64| {
            let mut levels = Vec::new();
            let mut next = 4 + leaves;
            let mut count = leaves;
            while count > 1 {
                let up = count.div_ceil(FANOUT);
                levels.push((next, up));
                next += up;
                count = up;
            }
            (levels, next)
        };
        let mut leaves = (pages - 4) * FANOUT / (FANOUT + 1);
        while layout(leaves).1 > pages {
            leaves -= 1;
        }
        let (levels, _) = layout(leaves);
        let key_root = levels.last().map_or(4, |(first, _)| *first);
        let entries = leaves * PER_LEAF as u64;
        assert!(
            revision >= entries,
            "revision {revision} is below the {entries} entries of a {bytes}-byte database"
        );
        EtcdDb {
            pages,
            leaves,
            levels,
            key_root,
            revision,
        }
    }

    /// Bytes of the snapshot, trailer included.
    pub fn size(&self) -> u64 {
        self.pages * PAGE as u64 + 32
    }

    fn key(&self, entry: u64) -> [u8; 17] {
        let entries = self.leaves * PER_LEAF as u64;
        let main = self.revision - (entries - 1 - entry);
        let mut k = [0u8; 17];
        k[..8].copy_from_slice(&main.to_be_bytes());
        k[8] = b'_';
        k
    }

    fn header(p: &mut [u8], id: u64, flags: u16, count: u16) {
        p[0..8].copy_from_slice(&id.to_le_bytes());
        p[8..10].copy_from_slice(&flags.to_le_bytes());
        p[10..12].copy_from_slice(&count.to_le_bytes());
    }

    /// Page `n` into `p` (PAGE bytes, zeroed by the caller).
    pub fn page(&self, n: u64, p: &mut [u8]) {
        match n {
            0 | 1 => {
                Self::header(p, n, 0x04, 0);
                let m = HEADER;
                p[m..m + 4].copy_from_slice(&MAGIC.to_le_bytes());
                p[m + 4..m + 8].copy_from_slice(&2u32.to_le_bytes());
                p[m + 8..m + 12].copy_from_slice(&(PAGE as u32).to_le_bytes());
                p[m + 16..m + 24].copy_from_slice(&3u64.to_le_bytes()); // root bucket
                p[m + 32..m + 40].copy_from_slice(&2u64.to_le_bytes()); // freelist
                p[m + 40..m + 48].copy_from_slice(&self.pages.to_le_bytes()); // high water
                p[m + 48..m + 56].copy_from_slice(&(n + 1).to_le_bytes()); // txid
                let sum = fnv1a64(&p[m..m + 56]);
                p[m + 56..m + 64].copy_from_slice(&sum.to_le_bytes());
            }
            2 => Self::header(p, 2, 0x10, 0),
            3 => {
                // The root bucket: one entry, the `key` bucket.
                Self::header(p, 3, 0x02, 1);
                let e = HEADER;
                let data = HEADER + ELEMENT;
                p[e..e + 4].copy_from_slice(&1u32.to_le_bytes());
                p[e + 4..e + 8].copy_from_slice(&((data - e) as u32).to_le_bytes());
                p[e + 8..e + 12].copy_from_slice(&3u32.to_le_bytes());
                p[e + 12..e + 16].copy_from_slice(&16u32.to_le_bytes());
                p[data..data + 3].copy_from_slice(b"key");
                p[data + 3..data + 11].copy_from_slice(&self.key_root.to_le_bytes());
            }
            n if n < 4 + self.leaves => {
                let leaf = n - 4;
                Self::header(p, n, 0x02, PER_LEAF as u16);
                let mut data = HEADER + PER_LEAF * ELEMENT;
                let noise = noise();
                for i in 0..PER_LEAF {
                    let entry = leaf * PER_LEAF as u64 + i as u64;
                    let e = HEADER + i * ELEMENT;
                    p[e + 4..e + 8].copy_from_slice(&((data - e) as u32).to_le_bytes());
                    p[e + 8..e + 12].copy_from_slice(&17u32.to_le_bytes());
                    p[e + 12..e + 16].copy_from_slice(&(VALUE as u32).to_le_bytes());
                    p[data..data + 17].copy_from_slice(&self.key(entry));
                    let off = (entry.wrapping_mul(7919) % (noise.len() - VALUE) as u64) as usize;
                    p[data + 17..data + 17 + VALUE].copy_from_slice(&noise[off..off + VALUE]);
                    data += 17 + VALUE;
                }
            }
            n => {
                let Some((level, (first, count))) = self
                    .levels
                    .iter()
                    .enumerate()
                    .find(|(_, (f, c))| n >= *f && n < f + c)
                else {
                    return; // padding: a free page
                };
                let index = n - first;
                let (below_first, below_count) = if level == 0 {
                    (4, self.leaves)
                } else {
                    self.levels[level - 1]
                };
                let lo = index * FANOUT;
                let hi = ((index + 1) * FANOUT).min(below_count);
                let _ = count;
                Self::header(p, n, 0x01, (hi - lo) as u16);
                let mut data = HEADER + (hi - lo) as usize * ELEMENT;
                // A child's first key: the first entry of its first leaf.
                let span = FANOUT.pow(level as u32);
                for (i, child) in (lo..hi).enumerate() {
                    let e = HEADER + i * ELEMENT;
                    let first_entry = child * span * PER_LEAF as u64;
                    p[e..e + 4].copy_from_slice(&((data - e) as u32).to_le_bytes());
                    p[e + 4..e + 8].copy_from_slice(&17u32.to_le_bytes());
                    p[e + 8..e + 16].copy_from_slice(&(below_first + child).to_le_bytes());
                    p[data..data + 17].copy_from_slice(&self.key(first_entry));
                    data += 17;
                }
            }
        }
    }

    /// The snapshot as a sequence of chunks of about `chunk` bytes (whole pages; the trailer
    /// last).
    pub fn chunks(&self, chunk: usize) -> DbChunks {
        DbChunks {
            db: self.clone(),
            next: 0,
            per: (chunk / PAGE).max(1),
            hash: Sha256::new(),
            done: false,
        }
    }
}

/// The chunks of a snapshot, generated as they are asked for.
pub struct DbChunks {
    db: EtcdDb,
    next: u64,
    per: usize,
    hash: Sha256,
    done: bool,
}

impl Iterator for DbChunks {
    type Item = Vec<u8>;
    fn next(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        if self.next >= self.db.pages {
            self.done = true;
            return Some(self.hash.clone().finalize().to_vec());
        }
        let n = (self.db.pages - self.next).min(self.per as u64) as usize;
        let mut out = vec![0u8; n * PAGE];
        for (i, p) in out.chunks_mut(PAGE).enumerate() {
            self.db.page(self.next + i as u64, p);
        }
        self.next += n as u64;
        self.hash.update(&out);
        Some(out)
    }
}

#[test]
fn plinth_reads_the_generated_revision_and_trailer() {
    for (bytes, revision) in [(8 * 4096, 100), (3 << 20, 5_000), (50 << 20, 1_000_000)] {
        let db = EtcdDb::new(bytes, revision);
        let mut check = plinth::talos::etcd_db::SnapshotCheck::new();
        let mut all = Sha256::new();
        for c in db.chunks(256 << 10) {
            all.update(&c);
            check.update(&c);
        }
        let facts = check.finish().expect("a valid snapshot");
        assert_eq!(facts.revision, revision as i64, "{bytes}");
        assert_eq!(facts.size, db.size());
        assert_eq!(facts.sha256, hex::encode(all.finalize()));
    }
}
