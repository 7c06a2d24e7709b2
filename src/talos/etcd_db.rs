//! Checking an etcd snapshot as it streams past, without holding it: its size, its SHA-256, the
//! SHA-256 etcd appends to every snapshot it writes, and the etcd revision it holds.
//!
//! An etcd snapshot (what `MachineService.EtcdSnapshot` streams, what etcd's snapshot API writes)
//! is etcd's bbolt database file followed by the SHA-256 of that file: its size is 32 more than a
//! multiple of 512, which is how etcd and talosctl recognise the trailer. The revision is the
//! largest key of the database's `key` bucket (each key is the revision, 8 bytes big-endian, `_`,
//! the sub-revision, and `t` for a deletion), read by walking bbolt's tree from the newest valid
//! meta page to the rightmost leaf of that bucket, as etcd's own snapshot status does. Pages go
//! past one at a time; what is kept of each is a few bytes (a branch's children, a leaf's last
//! revision and any `key` bucket it names): well under a hundredth of the database.
//!
//! bbolt's on-disk layout (little-endian on the platforms etcd runs on): every page starts with a
//! 16-byte header (id u64, flags u16, count u16, overflow u32); flags 0x01 branch, 0x02 leaf,
//! 0x04 meta, 0x10 freelist. A meta page holds magic 0xED0CDAED, version 2, the page size, the
//! root bucket's page, the transaction id, and an FNV-1a 64 checksum of the fields before it.
//! Leaf elements are (flags u32, pos u32, ksize u32, vsize u32), branch elements (pos u32,
//! ksize u32, child u64), `pos` counted from the element itself; a leaf element with flag 0x01 is
//! a bucket whose value is (root u64, sequence u64), followed by the bucket's page when the root
//! is 0 (an inline bucket). Written from that description and etcd's documented snapshot format.
//!
//! Pure: no I/O. Imports sha2 and hex only.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const META: u16 = 0x04;
const BUCKET_LEAF: u32 = 0x01;
const MAGIC: u32 = 0xED0C_DAED;
/// A page with more overflow than this is not kept for parsing (its contents are still hashed).
const MAX_PAGE_SPAN: usize = 64 << 20;
/// Deeper than any real bbolt tree: a loop in a broken file ends here.
const MAX_DEPTH: usize = 64;

/// What a checked snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFacts {
    /// Bytes, trailer included.
    pub size: u64,
    /// SHA-256 of every byte (hex).
    pub sha256: String,
    /// etcd's revision in it.
    pub revision: i64,
}

/// Why a stream is not a usable etcd snapshot.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a usable etcd snapshot: {0}")]
pub struct SnapshotDefect(pub String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyBucket {
    /// Its tree starts at this page.
    Root(u64),
    /// Inline: the largest revision of its one page.
    Inline(Option<u64>),
}

#[derive(Debug)]
enum Page {
    Branch(Vec<u64>),
    Leaf {
        last_revision: Option<u64>,
        key_bucket: Option<KeyBucket>,
    },
}

/// Walks bbolt pages as they stream past.
#[derive(Debug, Default)]
struct BoltScan {
    page_size: Option<usize>,
    /// The bytes of the page (span) being collected.
    buf: Vec<u8>,
    /// Bytes of an oversized span still to pass over.
    skip: usize,
    /// Index of the next page in the file.
    next_page: u64,
    pages: HashMap<u64, Page>,
    /// Valid metas: (txid, root page).
    metas: Vec<(u64, u64)>,
    defect: Option<String>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// FNV-1a, 64 bits.
fn fnv1a64(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= u64::from(x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The main revision of an etcd `key` bucket key (`<8 bytes BE>_<8 bytes BE>[t]`).
fn revision_of(key: &[u8]) -> Option<u64> {
    if (key.len() == 17 || key.len() == 18) && key[8] == b'_' {
        Some(u64::from_be_bytes(key[..8].try_into().ok()?))
    } else {
        None
    }
}

/// One element of a leaf page: (flags, key, value).
type LeafElement<'a> = (u32, &'a [u8], &'a [u8]);

/// The elements of a leaf page `p` (header included).
fn leaf_elements(p: &[u8]) -> Option<Vec<LeafElement<'_>>> {
    let count = usize::from(u16_at(p, 10)?);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let e = PAGE_HEADER + i * ELEMENT;
        let flags = u32_at(p, e)?;
        let pos = u32_at(p, e + 4)? as usize;
        let ksize = u32_at(p, e + 8)? as usize;
        let vsize = u32_at(p, e + 12)? as usize;
        let k = e.checked_add(pos)?;
        let key = p.get(k..k.checked_add(ksize)?)?;
        let v = k + ksize;
        let value = p.get(v..v.checked_add(vsize)?)?;
        out.push((flags, key, value));
    }
    Some(out)
}

impl BoltScan {
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() && self.defect.is_none() {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            let Some(ps) = self.page_size else {
                // The first meta page names the page size: its first 28 bytes.
                let take = (PAGE_HEADER + 12 - self.buf.len()).min(data.len());
                self.buf.extend_from_slice(&data[..take]);
                data = &data[take..];
                if self.buf.len() == PAGE_HEADER + 12 {
                    let ps = u32_at(&self.buf, PAGE_HEADER + 8).unwrap_or(0) as usize;
                    if u32_at(&self.buf, PAGE_HEADER) != Some(MAGIC)
                        || !(512..=(1 << 20)).contains(&ps)
                        || !ps.is_power_of_two()
                    {
                        self.defect = Some(
                            "it does not start with a bbolt meta page (etcd's database)".into(),
                        );
                        return;
                    }
                    self.page_size = Some(ps);
                }
                continue;
            };
            let want = if self.buf.len() < PAGE_HEADER {
                PAGE_HEADER
            } else {
                let overflow = u32_at(&self.buf, 12).unwrap_or(0) as usize;
                let span = (overflow + 1).saturating_mul(ps);
                if span > MAX_PAGE_SPAN {
                    // Not kept: pass over the rest of it.
                    self.skip = span - self.buf.len();
                    self.buf.clear();
                    self.next_page += overflow as u64 + 1;
                    continue;
                }
                span
            };
            let take = (want - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if want > PAGE_HEADER && self.buf.len() == want {
                let span = std::mem::take(&mut self.buf);
                let overflow = u32_at(&span, 12).unwrap_or(0);
                self.page(&span);
                self.next_page += u64::from(overflow) + 1;
                self.buf = span;
                self.buf.clear();
            }
        }
    }

    fn page(&mut self, p: &[u8]) {
        let id = self.next_page;
        let flags = u16_at(p, 8).unwrap_or(0);
        let count = usize::from(u16_at(p, 10).unwrap_or(0));
        if u64_at(p, 0) != Some(id) {
            // Pages of no tree (freed) may hold anything; only tree pages are read.
            return;
        }
        match flags {
            META => {
                let m = PAGE_HEADER;
                let ok = u32_at(p, m) == Some(MAGIC)
                    && u32_at(p, m + 4) == Some(2)
                    && p.get(m..m + 56).map(fnv1a64) == u64_at(p, m + 56);
                if ok {
                    if let (Some(root), Some(txid)) = (u64_at(p, m + 16), u64_at(p, m + 48)) {
                        self.metas.push((txid, root));
                    }
                }
            }
            BRANCH => {
                let mut children = Vec::with_capacity(count);
                for i in 0..count {
                    match u64_at(p, PAGE_HEADER + i * ELEMENT + 8) {
                        Some(c) => children.push(c),
                        None => return,
                    }
                }
                self.pages.insert(id, Page::Branch(children));
            }
            LEAF => {
                let Some(elements) = leaf_elements(p) else {
                    return;
                };
                let last_revision = elements.last().and_then(|(_, k, _)| revision_of(k));
                let key_bucket = elements
                    .iter()
                    .find(|(f, k, _)| f & BUCKET_LEAF != 0 && *k == b"key")
                    .and_then(|(_, _, v)| {
                        let root = u64_at(v, 0)?;
                        if root != 0 {
                            return Some(KeyBucket::Root(root));
                        }
                        let inline = v.get(16..)?;
                        Some(KeyBucket::Inline(
                            leaf_elements(inline)?
                                .last()
                                .and_then(|(_, k, _)| revision_of(k)),
                        ))
                    });
                self.pages.insert(
                    id,
                    Page::Leaf {
                        last_revision,
                        key_bucket,
                    },
                );
            }
            _ => {}
        }
    }

    fn find_key_bucket(&self, page: u64, depth: usize) -> Option<KeyBucket> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.pages.get(&page)? {
            Page::Leaf { key_bucket, .. } => *key_bucket,
            Page::Branch(children) => children
                .iter()
                .find_map(|c| self.find_key_bucket(*c, depth + 1)),
        }
    }

    fn revision(&self) -> Result<u64, String> {
        if let Some(d) = &self.defect {
            return Err(d.clone());
        }
        let (_, root) = self
            .metas
            .iter()
            .max()
            .copied()
            .ok_or("no valid bbolt meta page")?;
        let bucket = self
            .find_key_bucket(root, 0)
            .ok_or("the database has no `key` bucket (not etcd's)")?;
        let mut page = match bucket {
            KeyBucket::Inline(rev) => return rev.ok_or_else(|| "the `key` bucket is empty".into()),
            KeyBucket::Root(p) => p,
        };
        for _ in 0..MAX_DEPTH {
            match self.pages.get(&page) {
                Some(Page::Branch(children)) => {
                    page = *children.last().ok_or("an empty branch page")?;
                }
                Some(Page::Leaf { last_revision, .. }) => {
                    return last_revision
                        .ok_or_else(|| "the `key` bucket's last key is not a revision".to_string())
                }
                None => return Err(format!("page {page} of the `key` bucket is missing")),
            }
        }
        Err("the `key` bucket's tree is deeper than any bbolt tree".into())
    }
}

/// Checks a snapshot as its bytes stream past: feed every chunk with [`update`](Self::update),
/// then [`finish`](Self::finish).
#[derive(Debug, Default)]
pub struct SnapshotCheck {
    size: u64,
    all: Sha256,
    /// Of everything but the last 32 bytes seen so far.
    body: Sha256,
    /// The last (up to) 32 bytes: etcd's trailer, once the stream ends.
    tail: Vec<u8>,
    scan: BoltScan,
}

impl SnapshotCheck {
    /// A new check.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes seen so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn body(&mut self, b: &[u8]) {
        self.body.update(b);
        self.scan.feed(b);
    }

    /// The next bytes of the snapshot.
    pub fn update(&mut self, data: &[u8]) {
        self.size += data.len() as u64;
        self.all.update(data);
        if data.len() >= 32 {
            let (head, tail) = data.split_at(data.len() - 32);
            let held = std::mem::take(&mut self.tail);
            self.body(&held);
            self.body(head);
            self.tail = held;
            self.tail.clear();
            self.tail.extend_from_slice(tail);
        } else {
            self.tail.extend_from_slice(data);
            if self.tail.len() > 32 {
                let n = self.tail.len() - 32;
                let out: Vec<u8> = self.tail.drain(..n).collect();
                self.body(&out);
            }
        }
    }

    /// The facts, or why this is not a usable snapshot.
    pub fn finish(self) -> Result<SnapshotFacts, SnapshotDefect> {
        if self.size % 512 != 32 {
            return Err(SnapshotDefect(format!(
                "{} bytes: etcd's SHA-256 trailer is missing (a snapshot is 32 bytes more than a multiple of 512)",
                self.size
            )));
        }
        if self.body.finalize().as_slice() != self.tail.as_slice() {
            return Err(SnapshotDefect(
                "etcd's SHA-256 trailer does not match the database (corrupted or truncated)"
                    .into(),
            ));
        }
        let revision = self.scan.revision().map_err(SnapshotDefect)?;
        Ok(SnapshotFacts {
            size: self.size,
            sha256: hex::encode(self.all.finalize()),
            revision: i64::try_from(revision)
                .map_err(|_| SnapshotDefect(format!("revision {revision} is out of range")))?,
        })
    }
}

/// The SHA-256 and size of a stream, for a snapshot read back.
#[derive(Debug, Default)]
pub struct StreamDigest {
    size: u64,
    hash: Sha256,
}

impl StreamDigest {
    /// The next bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.size += data.len() as u64;
        self.hash.update(data);
    }

    /// (size, SHA-256 hex).
    pub fn finish(self) -> (u64, String) {
        (self.size, hex::encode(self.hash.finalize()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: usize = 4096;

    fn header(p: &mut [u8], id: u64, flags: u16, count: u16) {
        p[0..8].copy_from_slice(&id.to_le_bytes());
        p[8..10].copy_from_slice(&flags.to_le_bytes());
        p[10..12].copy_from_slice(&count.to_le_bytes());
    }

    fn meta(id: u64, root: u64, txid: u64) -> Vec<u8> {
        let mut p = vec![0u8; PS];
        header(&mut p, id, META, 0);
        let m = PAGE_HEADER;
        p[m..m + 4].copy_from_slice(&MAGIC.to_le_bytes());
        p[m + 4..m + 8].copy_from_slice(&2u32.to_le_bytes());
        p[m + 8..m + 12].copy_from_slice(&(PS as u32).to_le_bytes());
        p[m + 16..m + 24].copy_from_slice(&root.to_le_bytes());
        p[m + 48..m + 56].copy_from_slice(&txid.to_le_bytes());
        let sum = fnv1a64(&p[m..m + 56]);
        p[m + 56..m + 64].copy_from_slice(&sum.to_le_bytes());
        p
    }

    fn leaf(id: u64, items: &[(u32, Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut p = vec![0u8; PS];
        header(&mut p, id, LEAF, items.len() as u16);
        let mut data = PAGE_HEADER + items.len() * ELEMENT;
        for (i, (flags, k, v)) in items.iter().enumerate() {
            let e = PAGE_HEADER + i * ELEMENT;
            p[e..e + 4].copy_from_slice(&flags.to_le_bytes());
            p[e + 4..e + 8].copy_from_slice(&((data - e) as u32).to_le_bytes());
            p[e + 8..e + 12].copy_from_slice(&(k.len() as u32).to_le_bytes());
            p[e + 12..e + 16].copy_from_slice(&(v.len() as u32).to_le_bytes());
            p[data..data + k.len()].copy_from_slice(k);
            p[data + k.len()..data + k.len() + v.len()].copy_from_slice(v);
            data += k.len() + v.len();
        }
        p
    }

    fn rev(main: u64) -> Vec<u8> {
        let mut k = main.to_be_bytes().to_vec();
        k.push(b'_');
        k.extend_from_slice(&0u64.to_be_bytes());
        k
    }

    fn bucket(root: u64) -> Vec<u8> {
        let mut v = root.to_le_bytes().to_vec();
        v.extend_from_slice(&0u64.to_le_bytes());
        v
    }

    /// Metas, a root leaf naming the `key` bucket at page 3, a branch, two leaves; padded and
    /// with etcd's trailer.
    fn db(revision: u64, stale_meta_root: u64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(meta(0, stale_meta_root, 1));
        out.extend(meta(1, 2, 2));
        out.extend(leaf(2, &[(BUCKET_LEAF, b"key".to_vec(), bucket(3))]));
        let mut branch = vec![0u8; PS];
        header(&mut branch, 3, BRANCH, 2);
        branch[PAGE_HEADER + 8..PAGE_HEADER + 16].copy_from_slice(&4u64.to_le_bytes());
        branch[PAGE_HEADER + ELEMENT + 8..PAGE_HEADER + ELEMENT + 16]
            .copy_from_slice(&5u64.to_le_bytes());
        out.extend(branch);
        out.extend(leaf(
            4,
            &[(0, rev(1), b"a".to_vec()), (0, rev(2), b"b".to_vec())],
        ));
        out.extend(leaf(
            5,
            &[(0, rev(3), vec![]), (0, rev(revision), b"z".to_vec())],
        ));
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    fn check(bytes: &[u8], chunk: usize) -> Result<SnapshotFacts, SnapshotDefect> {
        let mut c = SnapshotCheck::new();
        for part in bytes.chunks(chunk) {
            c.update(part);
        }
        c.finish()
    }

    #[test]
    fn reads_the_revision_and_checks_the_trailer_whatever_the_chunking() {
        let bytes = db(4242, 2);
        for chunk in [1, 7, 31, 32, 33, 4096, 5000, 1 << 20] {
            let f = check(&bytes, chunk).expect("valid");
            assert_eq!(f.revision, 4242, "chunk {chunk}");
            assert_eq!(f.size, bytes.len() as u64);
            assert_eq!(f.sha256, hex::encode(Sha256::digest(&bytes)));
        }
    }

    #[test]
    fn the_newest_valid_meta_wins() {
        // The older meta (txid 1) points at a page that is no tree; the newer one is used.
        assert_eq!(check(&db(7, 99), 4096).expect("valid").revision, 7);
        // A newer meta with a broken checksum is passed over.
        let mut bytes = db(7, 2);
        bytes[PS + PAGE_HEADER + 56] ^= 1;
        let n = bytes.len() - 32;
        let sum = Sha256::digest(&bytes[..n]);
        bytes[n..].copy_from_slice(&sum);
        assert_eq!(check(&bytes, 4096).expect("older meta").revision, 7);
    }

    #[test]
    fn refuses_truncated_corrupted_or_foreign_streams() {
        let bytes = db(5, 2);
        let e = check(&bytes[..bytes.len() - 512], 4096).expect_err("truncated");
        assert!(e.0.contains("SHA-256"), "{e}");
        let mut bad = bytes.clone();
        bad[5 * PS + 100] ^= 0xff;
        let e = check(&bad, 4096).expect_err("corrupted");
        assert!(e.0.contains("does not match"), "{e}");
        let mut foreign = vec![0u8; 512];
        let sum = Sha256::digest(&foreign);
        foreign.extend_from_slice(&sum);
        let e = check(&foreign, 100).expect_err("not bbolt");
        assert!(e.0.contains("bbolt"), "{e}");
        assert!(check(&[], 1).is_err());
    }
}
