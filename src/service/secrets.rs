//! `SecretBox`: authenticated encryption of secrets at rest (BMC passwords, cluster secrets, secret
//! values of patches, served configs) with XChaCha20-Poly1305, and the key's fingerprint (an HMAC of
//! a constant) that the database records. Each value is bound to its owner and purpose through the associated data,
//! so a ciphertext copied onto another machine's row does not decrypt.
//!
//! Format: `b"p1"` || 24-byte random nonce || ciphertext+tag.

use std::fmt;

use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;

const MAGIC: &[u8; 2] = b"p1";

/// Why a key or a ciphertext was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The key material is not 32 bytes of base64 or hex.
    #[error("secret key must be 32 bytes, written as 64 hex digits or base64 (generate one with `plinth secret-key`)")]
    BadKey,
    /// Wrong key, tampered value, or a value of another owner.
    #[error("cannot decrypt: wrong secret key or corrupted value")]
    Decrypt,
}

/// Encrypts and decrypts secrets with the server's key.
#[derive(Clone)]
pub struct SecretBox {
    cipher: XChaCha20Poly1305,
    fingerprint: String,
    /// HMAC-SHA256 keyed with the key: derives the keys of other purposes (`derive_key`).
    kdf: hmac::Hmac<sha2::Sha256>,
}

/// The constant the key's fingerprint is a MAC of (a new constant would be a new fingerprint).
const FINGERPRINT_INPUT: &[u8] = b"plinth secret key fingerprint v1";

impl fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretBox(<key>)")
    }
}

impl SecretBox {
    /// From raw key bytes.
    pub fn new(key: [u8; 32]) -> Self {
        // HMAC pads a key shorter than the hash's block (64 bytes) with zeros: the padded key
        // is the same key, and a block-sized key needs no fallible constructor.
        let mut block = [0u8; 64];
        block[..32].copy_from_slice(&key);
        Self {
            cipher: XChaCha20Poly1305::new(&key.into()),
            fingerprint: fingerprint(&key),
            kdf: <hmac::Hmac<sha2::Sha256> as hmac::digest::KeyInit>::new(&block.into()),
        }
    }

    /// The key's fingerprint: HMAC-SHA256 of a constant under the key, hex. It names the key (the
    /// database records it, so a different key is refused at start) and reveals nothing of it.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// A key of its own for `purpose` (e.g. `etcd-snapshot:<cluster>`): HMAC-SHA256 of a label
    /// and the purpose under this key. The same key and purpose give the same key; another
    /// purpose, or another Plinth key, gives an unrelated one.
    pub fn derive_key(&self, purpose: &str) -> [u8; 32] {
        use hmac::Mac;
        let mut mac = self.kdf.clone();
        mac.update(b"plinth derived key v1\0");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// From the text of a key file or variable: 64 hex digits or base64 of 32 bytes.
    pub fn from_text(text: &str) -> Result<Self, SecretError> {
        let t = text.trim();
        let bytes = if t.len() == 64 && t.chars().all(|c| c.is_ascii_hexdigit()) {
            hex::decode(t).map_err(|_| SecretError::BadKey)?
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(t)
                .map_err(|_| SecretError::BadKey)?
        };
        let key: [u8; 32] = bytes.try_into().map_err(|_| SecretError::BadKey)?;
        Ok(Self::new(key))
    }

    /// A fresh random key as text (base64).
    pub fn generate_key_text() -> String {
        let mut key = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut key);
        base64::engine::general_purpose::STANDARD.encode(key)
    }

    /// Encrypt `plain`, bound to `context` (e.g. `bmc-password:<machine id>`).
    pub fn seal(&self, context: &str, plain: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let ct = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: context.as_bytes(),
                },
            )
            .unwrap_or_default(); // XChaCha20-Poly1305 encryption cannot fail for in-memory sizes
        let mut out = Vec::with_capacity(2 + 24 + ct.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        out
    }

    /// Decrypt a value sealed for `context`.
    pub fn open(&self, context: &str, sealed: &[u8]) -> Result<Vec<u8>, SecretError> {
        if sealed.len() < 2 + 24 + 16 || &sealed[..2] != MAGIC {
            return Err(SecretError::Decrypt);
        }
        let (nonce, ct) = sealed[2..].split_at(24);
        self.cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: context.as_bytes(),
                },
            )
            .map_err(|_| SecretError::Decrypt)
    }
}

/// HMAC-SHA256 (RFC 2104) of `FINGERPRINT_INPUT` under `key`, hex.
fn fingerprint(key: &[u8; 32]) -> String {
    use hmac::{Hmac, Mac};
    match <Hmac<sha2::Sha256> as Mac>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(FINGERPRINT_INPUT);
            hex::encode(mac.finalize().into_bytes())
        }
        // HMAC takes keys of any length; 32 bytes always fit.
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_binding() {
        let sb = SecretBox::from_text(&SecretBox::generate_key_text()).expect("key");
        let sealed = sb.seal("bmc-password:a", b"hunter2");
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(
            sb.open("bmc-password:a", &sealed).expect("open"),
            b"hunter2"
        );
        assert!(
            sb.open("bmc-password:b", &sealed).is_err(),
            "bound to its owner"
        );
        let other = SecretBox::from_text(&SecretBox::generate_key_text()).expect("key");
        assert!(other.open("bmc-password:a", &sealed).is_err(), "wrong key");
        assert!(SecretBox::from_text("short").is_err());
        assert_eq!(sb.fingerprint().len(), 64);
        assert_ne!(sb.fingerprint(), other.fingerprint(), "names its key");
        let again = SecretBox::new([7u8; 32]);
        assert_eq!(again.fingerprint(), SecretBox::new([7u8; 32]).fingerprint());
        assert!(!again.fingerprint().contains(&hex::encode([7u8; 32])));
        assert!(SecretBox::from_text(&"ab".repeat(32)).is_ok());
    }
}
