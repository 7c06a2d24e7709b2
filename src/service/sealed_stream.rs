//! Streaming authenticated encryption of etcd snapshots, chunk by chunk, so that a snapshot of any
//! size is encrypted and decrypted in constant memory: XChaCha20-Poly1305 in the STREAM
//! construction (Hoang, Reyhanitabar, Rogaway, Vizár: "Online Authenticated-Encryption and its
//! Nonce-Reuse Misuse-Resistance", 2015) as the `aead` crate's `stream` module implements it
//! (`EncryptorBE32`: a 19-byte random nonce prefix, a 32-bit big-endian chunk counter, and a flag
//! on the last chunk). Reordered, dropped, repeated or truncated chunks fail authentication, and
//! so does a stream cut at a chunk boundary (its last chunk was not sealed as the last).
//!
//! Every chunk is bound (associated data) to its purpose, e.g. `etcd-snapshot:<cluster>:<id>`,
//! so an object copied under another cluster's or snapshot's name does not open.
//!
//! Format: `PLNSNAP1` (8 bytes) || nonce prefix (19 bytes) || chunk size (u32, big-endian) ||
//! chunks of `chunk size + 16` bytes || a last chunk of at most that (at least 16: the tag).
//!
//! Pure: no I/O. Imports the `chacha20poly1305` crate (with its `stream` feature), rand, bytes.

use bytes::Bytes;
use chacha20poly1305::aead::generic_array::GenericArray;
use chacha20poly1305::aead::stream::{DecryptorBE32, EncryptorBE32};
use chacha20poly1305::aead::{KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use rand::RngCore;

const MAGIC: &[u8; 8] = b"PLNSNAP1";
const NONCE: usize = 19;
const TAG: usize = 16;
/// Bytes of the header.
pub const HEADER: usize = MAGIC.len() + NONCE + 4;
/// Plaintext bytes per chunk.
pub const CHUNK: usize = 64 * 1024;

/// Why a sealed stream does not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Not our format.
    #[error("not a sealed Plinth snapshot (bad header)")]
    Header,
    /// Authentication failed: wrong key, another cluster's or snapshot's object, corrupted,
    /// reordered or truncated.
    #[error("cannot decrypt chunk {0}: wrong key, another cluster's snapshot, or a corrupted or truncated object")]
    Chunk(u64),
    /// More chunks than the counter allows (over 256 TiB).
    #[error("the stream is longer than STREAM's chunk counter allows")]
    TooLong,
}

/// Encrypts a stream: `push` the plaintext as it comes, then `finish`.
pub struct Sealer {
    enc: EncryptorBE32<XChaCha20Poly1305>,
    aad: Vec<u8>,
    buf: Vec<u8>,
}

impl Sealer {
    /// A sealer under `key` for `purpose`, and the header to write first.
    pub fn new(key: &[u8; 32], purpose: &str) -> (Sealer, Bytes) {
        let mut nonce = [0u8; NONCE];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let cipher = XChaCha20Poly1305::new(GenericArray::from_slice(key));
        let enc = EncryptorBE32::from_aead(cipher, GenericArray::from_slice(&nonce));
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&nonce);
        header.extend_from_slice(&(CHUNK as u32).to_be_bytes());
        (
            Sealer {
                enc,
                aad: purpose.as_bytes().to_vec(),
                buf: Vec::with_capacity(CHUNK),
            },
            Bytes::from(header),
        )
    }

    fn seal_next(&mut self, msg: &[u8]) -> Result<Bytes, SealError> {
        self.enc
            .encrypt_next(Payload {
                msg,
                aad: &self.aad,
            })
            .map(Bytes::from)
            .map_err(|_| SealError::TooLong)
    }

    /// Encrypt the next plaintext; appends whole sealed chunks to `out`. The last chunk is held
    /// back until `finish` (it is sealed as the last).
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<Bytes>) -> Result<(), SealError> {
        // Fill the held chunk first; seal it only once more data follows it.
        while !data.is_empty() {
            if self.buf.len() == CHUNK {
                let chunk = std::mem::take(&mut self.buf);
                out.push(self.seal_next(&chunk)?);
                self.buf = chunk;
                self.buf.clear();
            }
            if self.buf.is_empty() && data.len() > CHUNK {
                // Whole chunks straight from the input, keeping at least one byte back.
                let whole = (data.len() - 1) / CHUNK * CHUNK;
                for c in data[..whole].chunks(CHUNK) {
                    out.push(self.seal_next(c)?);
                }
                data = &data[whole..];
                continue;
            }
            let take = (CHUNK - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        Ok(())
    }

    /// Seal what is held as the last chunk (possibly empty).
    pub fn finish(self) -> Result<Bytes, SealError> {
        let Sealer { enc, aad, buf } = self;
        enc.encrypt_last(Payload {
            msg: &buf,
            aad: &aad,
        })
        .map(Bytes::from)
        .map_err(|_| SealError::TooLong)
    }
}

/// Decrypts a stream sealed by [`Sealer`]: `push` the sealed bytes as they come, then `finish`.
pub struct Opener {
    key: [u8; 32],
    aad: Vec<u8>,
    dec: Option<DecryptorBE32<XChaCha20Poly1305>>,
    chunk: usize,
    buf: Vec<u8>,
    index: u64,
}

impl Opener {
    /// An opener under `key` for `purpose`.
    pub fn new(key: &[u8; 32], purpose: &str) -> Opener {
        Opener {
            key: *key,
            aad: purpose.as_bytes().to_vec(),
            dec: None,
            chunk: 0,
            buf: Vec::new(),
            index: 0,
        }
    }

    fn open_next(&mut self, sealed: &[u8]) -> Result<Bytes, SealError> {
        let index = self.index;
        let dec = self.dec.as_mut().ok_or(SealError::Header)?;
        let plain = dec
            .decrypt_next(Payload {
                msg: sealed,
                aad: &self.aad,
            })
            .map_err(|_| SealError::Chunk(index))?;
        self.index += 1;
        Ok(Bytes::from(plain))
    }

    /// Decrypt the next sealed bytes; appends whole plaintext chunks to `out`.
    pub fn push(&mut self, mut data: &[u8], out: &mut Vec<Bytes>) -> Result<(), SealError> {
        if self.dec.is_none() {
            let take = (HEADER - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buf.len() < HEADER {
                return Ok(());
            }
            if &self.buf[..MAGIC.len()] != MAGIC {
                return Err(SealError::Header);
            }
            let nonce: [u8; NONCE] = self.buf[MAGIC.len()..MAGIC.len() + NONCE]
                .try_into()
                .map_err(|_| SealError::Header)?;
            let size: [u8; 4] = self.buf[MAGIC.len() + NONCE..HEADER]
                .try_into()
                .map_err(|_| SealError::Header)?;
            let chunk = u32::from_be_bytes(size) as usize;
            if !(1..=(16 << 20)).contains(&chunk) {
                return Err(SealError::Header);
            }
            let cipher = XChaCha20Poly1305::new(GenericArray::from_slice(&self.key));
            self.dec = Some(DecryptorBE32::from_aead(
                cipher,
                GenericArray::from_slice(&nonce),
            ));
            self.chunk = chunk + TAG;
            self.buf.clear();
        }
        let sealed = self.chunk;
        while !data.is_empty() {
            if self.buf.len() == sealed {
                let chunk = std::mem::take(&mut self.buf);
                let plain = self.open_next(&chunk)?;
                out.push(plain);
                self.buf = chunk;
                self.buf.clear();
            }
            if self.buf.is_empty() && data.len() > sealed {
                let whole = (data.len() - 1) / sealed * sealed;
                for c in data[..whole].chunks(sealed) {
                    let plain = self.open_next(c)?;
                    out.push(plain);
                }
                data = &data[whole..];
                continue;
            }
            let take = (sealed - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        Ok(())
    }

    /// Open what is held as the last chunk: the stream must end exactly there.
    pub fn finish(mut self) -> Result<Bytes, SealError> {
        let index = self.index;
        let dec = self.dec.take().ok_or(SealError::Header)?;
        dec.decrypt_last(Payload {
            msg: &self.buf,
            aad: &self.aad,
        })
        .map(Bytes::from)
        .map_err(|_| SealError::Chunk(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal(key: &[u8; 32], purpose: &str, plain: &[u8], step: usize) -> Vec<u8> {
        let (mut s, header) = Sealer::new(key, purpose);
        let mut out = vec![header];
        for part in plain.chunks(step.max(1)) {
            s.push(part, &mut out).expect("seal");
        }
        out.push(s.finish().expect("last"));
        out.concat()
    }

    fn open(
        key: &[u8; 32],
        purpose: &str,
        sealed: &[u8],
        step: usize,
    ) -> Result<Vec<u8>, SealError> {
        let mut o = Opener::new(key, purpose);
        let mut out = Vec::new();
        for part in sealed.chunks(step.max(1)) {
            o.push(part, &mut out)?;
        }
        out.push(o.finish()?);
        Ok(out.concat())
    }

    #[test]
    fn round_trips_every_length_and_chunking() {
        let key = [9u8; 32];
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 17] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            for (a, b) in [(1 << 20, 1 << 20), (4093, 65_600), (CHUNK, 7)] {
                let sealed = seal(&key, "etcd-snapshot:lab:1", &plain, a);
                let chunks = if len == 0 { 1 } else { len.div_ceil(CHUNK) };
                assert_eq!(sealed.len(), HEADER + len + chunks * TAG, "len {len}");
                let back = open(&key, "etcd-snapshot:lab:1", &sealed, b).expect("open");
                assert_eq!(back, plain, "len {len}");
            }
        }
    }

    #[test]
    fn refuses_another_key_purpose_truncation_and_tampering() {
        let key = [1u8; 32];
        let plain = vec![7u8; 2 * CHUNK + 5];
        let sealed = seal(&key, "etcd-snapshot:a:1", &plain, 1000);
        assert!(
            open(&[2u8; 32], "etcd-snapshot:a:1", &sealed, 999).is_err(),
            "key"
        );
        assert!(
            open(&key, "etcd-snapshot:b:1", &sealed, 999).is_err(),
            "cluster"
        );
        // Cut at a chunk boundary: the last whole chunk was not sealed as the last.
        let cut = HEADER + 2 * (CHUNK + TAG);
        assert!(
            open(&key, "etcd-snapshot:a:1", &sealed[..cut], 999).is_err(),
            "cut"
        );
        assert!(open(&key, "etcd-snapshot:a:1", &sealed[..sealed.len() - 1], 999).is_err());
        let mut bad = sealed.clone();
        bad[HEADER + 10] ^= 1;
        assert_eq!(
            open(&key, "etcd-snapshot:a:1", &bad, 999),
            Err(SealError::Chunk(0))
        );
        assert_eq!(
            open(
                &key,
                "etcd-snapshot:a:1",
                b"not sealed at all, no header here",
                5
            ),
            Err(SealError::Header)
        );
    }
}
