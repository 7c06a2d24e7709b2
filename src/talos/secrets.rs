//! A Talos secrets bundle generated natively, in the shape `talosctl gen secrets` of the target
//! release writes, so a site needs no Go tooling to start a cluster. Read from Talos'
//! `pkg/machinery/config/generate/secrets` (`bundle.go`, `ca.go`) and the x509 package of
//! siderolabs/crypto it calls, at v1.11.6, v1.12.11, v1.13.9 and v1.14.0-rc.1:
//!
//! - Talos OS CA: Ed25519, subject `O=talos`, key as PKCS#8 under the `ED25519 PRIVATE KEY` label;
//! - etcd CA (`O=etcd`), Kubernetes CA (`O=kubernetes`) and aggregator (front-proxy) CA: ECDSA
//!   P-256 signed with SHA-256, keys as SEC1 `EC PRIVATE KEY`. Talos asks for `CN=front-proxy` on
//!   the aggregator CA, but the self-signed CA constructor it calls writes only the Organization,
//!   so the aggregator CA `talosctl gen secrets` writes has an empty subject (as the bundles in
//!   Talos' test data show); Plinth writes the same;
//! - every CA: valid from now for 87600 hours (`CAValidityTime`), key usage (critical) digital
//!   signature and certificate signing, extended key usage server and client auth, `CA:TRUE`;
//! - service-account key: RSA 4096 as PKCS#1 `RSA PRIVATE KEY` for Talos 1.7 and later
//!   (`UseRSAServiceAccountKey` of the version contract), ECDSA P-256 before;
//! - bootstrap and trustd tokens `[a-z0-9]{6}.[a-z0-9]{16}`; secretbox key: 32 random bytes,
//!   standard base64 (Talos <= 1.2 wrote an `aescbcencryptionsecret` instead; such bundles load);
//! - cluster id: 32 random bytes, URL-safe base64 up to Talos 1.13, standard base64 from 1.14
//!   (`ClusterIDEncoding`); cluster secret: 32 random bytes, standard base64.
//!
//! Bundles stored before any of these changes (an ECDSA service-account key, a standard-base64
//! cluster id) keep loading and rendering: Talos itself accepts both.

use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE};
use base64::Engine;
use p256::pkcs8::EncodePrivateKey;
use rand::{Rng, RngCore};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use serde::{Deserialize, Serialize};

use super::TalosVersion;

/// Validity of every CA (`CAValidityTime` of Talos' secrets package: 87600 hours).
const CA_VALIDITY: time::Duration = time::Duration::hours(87_600);

/// Bits of the RSA service-account key (the default size of siderolabs/crypto's `NewRSAKey`).
pub const SERVICE_ACCOUNT_RSA_BITS: usize = 4096;

/// The release whose `talosctl gen secrets` [`SecretsBundle::generate`] writes like when no
/// release is named: the newest final release Plinth supports.
pub const DEFAULT_CONTRACT: TalosVersion = TalosVersion::new(1, 13, 0);

/// Why a bundle could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// Certificate or key generation failed.
    #[error("generating {what}: {detail}")]
    Generate {
        /// Which part.
        what: &'static str,
        /// The library's words.
        detail: String,
    },
    /// Not a secrets bundle.
    #[error("not a Talos secrets bundle: {0}")]
    Parse(String),
}

/// A certificate and key, base64 of PEM, as the bundle stores them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertAndKey {
    /// Certificate (base64 of PEM).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub crt: Option<String>,
    /// Private key (base64 of PEM).
    pub key: String,
}

/// `cluster:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIdentity {
    /// Cluster id.
    pub id: String,
    /// Cluster secret (discovery).
    pub secret: String,
}

/// `secrets:`. Exactly one of the two encryption keys is set (Talos' `Validate` of a bundle):
/// secretbox from Talos 1.3, AES-CBC before; an unset one is omitted from the YAML.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSecrets {
    /// Kubernetes bootstrap token.
    pub bootstraptoken: String,
    /// Key of secretbox encryption at rest in Kubernetes (empty when the bundle has the AES-CBC
    /// key instead).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secretboxencryptionsecret: String,
    /// Key of AES-CBC encryption at rest in Kubernetes, as bundles of Talos 1.2 and earlier
    /// hold it (empty otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub aescbcencryptionsecret: String,
}

/// `trustdinfo:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustdInfo {
    /// trustd token.
    pub token: String,
}

/// `certs:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certs {
    /// etcd CA.
    pub etcd: CertAndKey,
    /// Kubernetes CA.
    pub k8s: CertAndKey,
    /// Kubernetes aggregator CA.
    pub k8saggregator: CertAndKey,
    /// Service-account signing key.
    pub k8sserviceaccount: CertAndKey,
    /// Talos OS CA.
    pub os: CertAndKey,
}

/// A secrets bundle.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretsBundle {
    /// Cluster identity.
    pub cluster: ClusterIdentity,
    /// Tokens and keys.
    pub secrets: ClusterSecrets,
    /// trustd token.
    pub trustdinfo: TrustdInfo,
    /// CAs and keys.
    pub certs: Certs,
}

impl std::fmt::Debug for SecretsBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsBundle(<redacted>)")
    }
}

fn random_b64(n: usize) -> String {
    let mut b = vec![0u8; n];
    rand::rngs::OsRng.fill_bytes(&mut b);
    B64.encode(b)
}

/// A new cluster id: 32 random bytes in the base64 alphabet of `version`'s `ClusterIDEncoding`
/// (URL-safe until Talos 1.13, standard from 1.14; both padded).
fn cluster_id(version: TalosVersion) -> String {
    let mut id = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut id);
    if version >= TalosVersion::new(1, 14, 0) {
        B64.encode(id)
    } else {
        URL_SAFE.encode(id)
    }
}

/// A token of the form `[a-z0-9]{6}.[a-z0-9]{16}` (Kubernetes bootstrap token format).
pub fn token() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rngs::OsRng;
    let mut pick = |n: usize| -> String {
        (0..n)
            .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
            .collect()
    };
    format!("{}.{}", pick(6), pick(16))
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = B64.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// A self-signed CA like Talos's.
fn ca(org: Option<&str>, key: &KeyPair, what: &'static str) -> Result<String, SecretsError> {
    let err = |e: rcgen::Error| SecretsError::Generate {
        what,
        detail: e.to_string(),
    };
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    let mut dn = DistinguishedName::new();
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now;
    params.not_after = now + CA_VALIDITY;
    let mut serial = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut serial);
    serial[0] &= 0x7f;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    Ok(params.self_signed(key).map_err(err)?.pem())
}

/// An ECDSA P-256 key: (SEC1 "EC PRIVATE KEY" PEM as Go's x509 writes it, rcgen key pair).
fn p256_key(what: &'static str) -> Result<(String, KeyPair), SecretsError> {
    let err = |d: String| SecretsError::Generate { what, detail: d };
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    let sk = p256::SecretKey::random(&mut rand::rngs::OsRng);
    // SEC1 ECPrivateKey (RFC 5915) with the named curve in [0], as Go's x509.MarshalECPrivateKey
    // writes it (Talos reads it with x509.ParseECPrivateKey, which needs the curve there):
    // SEQUENCE { INTEGER 1, OCTET STRING d, [0] { OID prime256v1 }, [1] { BIT STRING point } }.
    let point = sk.public_key().to_encoded_point(false);
    let mut sec1 = vec![0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20];
    sec1.extend_from_slice(&sk.to_bytes());
    sec1.extend_from_slice(&[
        0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ]);
    sec1.extend_from_slice(&[0xa1, 0x44, 0x03, 0x42, 0x00]);
    sec1.extend_from_slice(point.as_bytes());
    if sec1.len() != 0x79 {
        return Err(err(format!("unexpected SEC1 length {}", sec1.len())));
    }
    let pkcs8 = sk.to_pkcs8_der().map_err(|e| err(e.to_string()))?;
    let kp = KeyPair::try_from(pkcs8.as_bytes()).map_err(|e| err(e.to_string()))?;
    Ok((pem("EC PRIVATE KEY", &sec1), kp))
}

/// An RSA key of `bits` as PKCS#1 `RSA PRIVATE KEY` PEM, as Go's `x509.MarshalPKCS1PrivateKey`
/// and siderolabs/crypto's `NewRSAKey` write it.
fn rsa_key(bits: usize, what: &'static str) -> Result<String, SecretsError> {
    use rsa::pkcs1::EncodeRsaPrivateKey;
    let err = |d: String| SecretsError::Generate { what, detail: d };
    let key =
        rsa::RsaPrivateKey::new(&mut rand::rngs::OsRng, bits).map_err(|e| err(e.to_string()))?;
    let pem = key
        .to_pkcs1_pem(rsa::pkcs1::LineEnding::LF)
        .map_err(|e| err(e.to_string()))?;
    Ok(pem.to_string())
}

/// An Ed25519 key: (PKCS#8 v1 under Talos's "ED25519 PRIVATE KEY" label, rcgen key pair).
fn ed25519_key() -> Result<(String, KeyPair), SecretsError> {
    // PKCS#8 v1 (RFC 8410 section 7): SEQUENCE { INTEGER 0, SEQUENCE { OID 1.3.101.112 }, OCTET
    // STRING { OCTET STRING seed } }: a fixed 16-byte prefix and the 32-byte seed.
    let mut der = hex::decode("302e020100300506032b657004220420").unwrap_or_default();
    let mut seed = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    der.extend_from_slice(&seed);
    let kp = KeyPair::try_from(der.as_slice()).map_err(|e| SecretsError::Generate {
        what: "Talos OS CA key",
        detail: e.to_string(),
    })?;
    Ok((pem("ED25519 PRIVATE KEY", &der), kp))
}

impl SecretsBundle {
    /// Generate a new bundle as `talosctl gen secrets` of [`DEFAULT_CONTRACT`] writes it.
    pub fn generate() -> Result<SecretsBundle, SecretsError> {
        Self::generate_for(DEFAULT_CONTRACT)
    }

    /// Generate a new bundle as `talosctl gen secrets --talos-version <version>` writes it.
    pub fn generate_for(version: TalosVersion) -> Result<SecretsBundle, SecretsError> {
        let b64 = |s: &str| B64.encode(s.as_bytes());
        let (os_key, os_kp) = ed25519_key()?;
        let os_crt = ca(Some("talos"), &os_kp, "Talos OS CA")?;
        let ec_ca = |org: Option<&str>, what: &'static str| -> Result<CertAndKey, SecretsError> {
            let (key, kp) = p256_key(what)?;
            let crt = ca(org, &kp, what)?;
            Ok(CertAndKey {
                crt: Some(b64(&crt)),
                key: b64(&key),
            })
        };
        let etcd = ec_ca(Some("etcd"), "etcd CA")?;
        let k8s = ec_ca(Some("kubernetes"), "Kubernetes CA")?;
        let k8saggregator = ec_ca(None, "aggregator CA")?;
        // `UseRSAServiceAccountKey`: releases after 1.6.
        let sa_key = if version >= TalosVersion::new(1, 7, 0) {
            rsa_key(SERVICE_ACCOUNT_RSA_BITS, "service-account key")?
        } else {
            p256_key("service-account key")?.0
        };
        Ok(SecretsBundle {
            cluster: ClusterIdentity {
                id: cluster_id(version),
                secret: random_b64(32),
            },
            secrets: if version >= TalosVersion::new(1, 3, 0) {
                ClusterSecrets {
                    bootstraptoken: token(),
                    secretboxencryptionsecret: random_b64(32),
                    aescbcencryptionsecret: String::new(),
                }
            } else {
                ClusterSecrets {
                    bootstraptoken: token(),
                    secretboxencryptionsecret: String::new(),
                    aescbcencryptionsecret: random_b64(32),
                }
            },
            trustdinfo: TrustdInfo { token: token() },
            certs: Certs {
                etcd,
                k8s,
                k8saggregator,
                k8sserviceaccount: CertAndKey {
                    crt: None,
                    key: b64(&sa_key),
                },
                os: CertAndKey {
                    crt: Some(b64(&os_crt)),
                    key: b64(&os_key),
                },
            },
        })
    }

    /// YAML as `talosctl gen secrets` writes it (4-space indentation).
    pub fn to_yaml(&self) -> Result<String, SecretsError> {
        let v = serde_json::to_value(self).map_err(|e| SecretsError::Parse(e.to_string()))?;
        let doc: serde_yaml_ng::Value =
            serde_json::from_value(v).map_err(|e| SecretsError::Parse(e.to_string()))?;
        serde_yaml_ng::to_string(&doc).map_err(|e| SecretsError::Parse(e.to_string()))
    }

    /// Read a bundle (as written by `talosctl gen secrets` of any release since 1.0, or by
    /// `generate`). Like Talos' `Validate`, exactly one encryption key must be set.
    pub fn parse(text: &str) -> Result<SecretsBundle, SecretsError> {
        let b: SecretsBundle =
            serde_yaml_ng::from_str(text).map_err(|e| SecretsError::Parse(e.to_string()))?;
        let s = &b.secrets;
        match (
            s.secretboxencryptionsecret.is_empty(),
            s.aescbcencryptionsecret.is_empty(),
        ) {
            (true, true) => Err(SecretsError::Parse(
                "one of secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret is required"
                    .into(),
            )),
            (false, false) => Err(SecretsError::Parse(
                "only one of secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret is allowed"
                    .into(),
            )),
            _ => Ok(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_the_kubernetes_shape() {
        for _ in 0..100 {
            let t = token();
            let (a, b) = t.split_once('.').expect("dot");
            assert_eq!((a.len(), b.len()), (6, 16));
            assert!(t
                .chars()
                .all(|c| c == '.' || c.is_ascii_lowercase() || c.is_ascii_digit()));
        }
    }

    #[test]
    fn generated_bundle_round_trips_and_reads_the_shared_one() {
        let b = SecretsBundle::generate().expect("generate");
        assert_eq!(URL_SAFE.decode(&b.cluster.id).expect("b64").len(), 32);
        assert_eq!(B64.decode(&b.cluster.secret).expect("b64").len(), 32);
        assert_eq!(
            B64.decode(&b.secrets.secretboxencryptionsecret)
                .expect("b64")
                .len(),
            32
        );
        let y = b.to_yaml().expect("yaml");
        assert!(!y.contains("aescbcencryptionsecret"), "{y}");
        assert_eq!(SecretsBundle::parse(&y).expect("parse"), b);
        assert!(!format!("{b:?}").contains(&b.cluster.secret));
        let pem_of = |k: &str| String::from_utf8(B64.decode(k).expect("b64")).expect("utf8");
        assert!(pem_of(&b.certs.os.key).starts_with("-----BEGIN ED25519 PRIVATE KEY-----"));
        assert!(
            pem_of(&b.certs.k8sserviceaccount.key).starts_with("-----BEGIN RSA PRIVATE KEY-----")
        );
        let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/talos/configs/secrets.yaml");
        if let Ok(text) = std::fs::read_to_string(shared) {
            let s = SecretsBundle::parse(&text).expect("shared bundle parses");
            assert_eq!(s.trustdinfo.token, "oamejv.9tk1nhuwnlc2nghf");
        }
    }

    #[test]
    fn the_release_decides_id_encoding_and_encryption_key() {
        // Over 64 ids each alphabet shows its own characters (`-_` or `+/`) with certainty
        // short of 2^-100.
        let ids = |minor| {
            (0..64)
                .map(|_| cluster_id(TalosVersion::new(1, minor, 0)))
                .collect::<String>()
        };
        for minor in [11, 13] {
            let all = ids(minor);
            assert!(
                all.contains(['-', '_']) && !all.contains(['+', '/']),
                "1.{minor}: URL-safe"
            );
        }
        let all = ids(14);
        assert!(
            all.contains(['+', '/']) && !all.contains(['-', '_']),
            "1.14: standard"
        );
        for id in [
            cluster_id(TalosVersion::new(1, 13, 0)),
            cluster_id(TalosVersion::new(1, 14, 0)),
        ] {
            assert_eq!(id.len(), 44, "32 bytes, padded");
        }
        let old = SecretsBundle::generate_for(TalosVersion::new(1, 2, 0)).expect("1.2");
        assert!(old.secrets.secretboxencryptionsecret.is_empty());
        assert_eq!(
            B64.decode(&old.secrets.aescbcencryptionsecret)
                .expect("b64")
                .len(),
            32
        );
        let sa = String::from_utf8(B64.decode(&old.certs.k8sserviceaccount.key).expect("b64"))
            .expect("utf8");
        assert!(
            sa.starts_with("-----BEGIN EC PRIVATE KEY-----"),
            "1.2: ECDSA"
        );
        let y = old.to_yaml().expect("yaml");
        assert!(!y.contains("secretboxencryptionsecret"), "{y}");
        assert_eq!(SecretsBundle::parse(&y).expect("parse"), old);
    }

    #[test]
    fn a_bundle_needs_exactly_one_encryption_key() {
        let b = SecretsBundle::generate().expect("generate");
        let mut both = b.clone();
        both.secrets.aescbcencryptionsecret = both.secrets.secretboxencryptionsecret.clone();
        let err = SecretsBundle::parse(&both.to_yaml().expect("yaml")).expect_err("both");
        assert!(err.to_string().contains("only one of"), "{err}");
        let mut none = b;
        none.secrets.secretboxencryptionsecret.clear();
        let err = SecretsBundle::parse(&none.to_yaml().expect("yaml")).expect_err("none");
        assert!(err.to_string().contains("one of"), "{err}");
    }
}
