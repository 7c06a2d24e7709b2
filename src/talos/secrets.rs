//! A Talos secrets bundle generated natively, in the shape `talosctl gen secrets` writes, so a site
//! needs no Go tooling to start a cluster: the Talos OS CA (Ed25519), the Kubernetes, aggregator and
//! etcd CAs (ECDSA P-256), the service-account key (ECDSA P-256), the bootstrap and trustd tokens
//! (`[a-z0-9]{6}.[a-z0-9]{16}`), and 32-byte random cluster id, cluster secret and secretbox key.
//!
//! CA certificates follow Talos's own: subject `O=<name>`, ten years, key usage (critical) digital
//! signature and certificate signing, extended key usage server and client auth, `CA:TRUE`.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use p256::pkcs8::EncodePrivateKey;
use rand::{Rng, RngCore};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use serde::{Deserialize, Serialize};

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

/// `secrets:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSecrets {
    /// Kubernetes bootstrap token.
    pub bootstraptoken: String,
    /// Key of secretbox encryption at rest in Kubernetes.
    pub secretboxencryptionsecret: String,
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
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(3650);
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
    /// Generate a new bundle.
    pub fn generate() -> Result<SecretsBundle, SecretsError> {
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
        let (sa_key, _) = p256_key("service-account key")?;
        Ok(SecretsBundle {
            cluster: ClusterIdentity {
                id: random_b64(32),
                secret: random_b64(32),
            },
            secrets: ClusterSecrets {
                bootstraptoken: token(),
                secretboxencryptionsecret: random_b64(32),
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

    /// Read a bundle (as written by `talosctl gen secrets` or by `generate`).
    pub fn parse(text: &str) -> Result<SecretsBundle, SecretsError> {
        serde_yaml_ng::from_str(text).map_err(|e| SecretsError::Parse(e.to_string()))
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
        assert_eq!(B64.decode(&b.cluster.id).expect("b64").len(), 32);
        assert_eq!(
            B64.decode(&b.secrets.secretboxencryptionsecret)
                .expect("b64")
                .len(),
            32
        );
        let y = b.to_yaml().expect("yaml");
        assert_eq!(SecretsBundle::parse(&y).expect("parse"), b);
        assert!(!format!("{b:?}").contains(&b.cluster.secret));
        let os_key = String::from_utf8(B64.decode(&b.certs.os.key).expect("b64")).expect("utf8");
        assert!(os_key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----"));
        let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/talos/configs/secrets.yaml");
        if let Ok(text) = std::fs::read_to_string(shared) {
            let s = SecretsBundle::parse(&text).expect("shared bundle parses");
            assert_eq!(s.trustdinfo.token, "oamejv.9tk1nhuwnlc2nghf");
        }
    }
}
