//! Short-lived credentials signed from a cluster's CAs, as data: Talos API client certificates
//! from the Talos OS CA (Ed25519 keys, the role in the subject's Organization, client-auth usage
//! only, as `talosctl gen config` and apid expect), the `talosconfig` that carries one, and an
//! admin `kubeconfig` from the Kubernetes CA (CN `admin`, O `system:masters`, as Talos' own
//! `talosctl kubeconfig` issues).
//!
//! The CA's subject is copied byte for byte from its certificate (its string types included), so
//! issued certificates chain to the CA whoever generated it (Plinth, `talosctl gen secrets`).
//! Nothing here writes a file or logs: keys live in memory and leave only inside the returned
//! document. Imports no tokio, sqlx, axum or front door.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chrono::{DateTime, Duration, Utc};
use rand::RngCore;
use rcgen::{
    Certificate, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The Talos roles Plinth signs (the Organization of a client certificate).
pub const TALOS_ROLES: &[&str] = &["os:admin", "os:operator", "os:reader", "os:etcd:backup"];

/// How far before "now" an issued certificate starts, for nodes whose clocks run a little behind.
const CLOCK_SKEW: Duration = Duration::seconds(60);

/// Why a credential could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// The CA certificate or key is not usable.
    #[error("{what}: {detail}")]
    Ca {
        /// Which CA.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A role Talos does not know.
    #[error("`{0}` is not a Talos role: one of {roles}", roles = TALOS_ROLES.join(", "))]
    Role(String),
    /// Signing failed.
    #[error("signing: {0}")]
    Sign(String),
}

/// A CA certificate and its private key, both PEM, as the secrets bundle holds them (decoded
/// from base64). The key never appears in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct CaPem {
    /// The certificate, PEM.
    pub crt: String,
    /// The private key, PEM (PKCS#8 under any label, or SEC1 `EC PRIVATE KEY`).
    pub key: String,
}

impl std::fmt::Debug for CaPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CaPem(<redacted>)")
    }
}

impl CaPem {
    /// From the bundle's base64-of-PEM fields.
    pub fn from_base64(crt: &str, key: &str, what: &'static str) -> Result<CaPem, PkiError> {
        let text = |b64: &str, part: &str| -> Result<String, PkiError> {
            let raw = B64.decode(b64.trim()).map_err(|e| PkiError::Ca {
                what,
                detail: format!("{part} is not base64: {e}"),
            })?;
            String::from_utf8(raw).map_err(|_| PkiError::Ca {
                what,
                detail: format!("{part} is not PEM text"),
            })
        };
        Ok(CaPem {
            crt: text(crt, "certificate")?,
            key: text(key, "key")?,
        })
    }
}

/// An issued client certificate with its key (PEM), and when it expires.
#[derive(Clone)]
pub struct IssuedCert {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The issuing CA's certificate, PEM (what verifies the peer).
    pub ca_pem: String,
    /// Not valid before.
    pub not_before: DateTime<Utc>,
    /// Not valid after.
    pub not_after: DateTime<Utc>,
    /// The Organization (Talos role, or `system:masters`).
    pub organization: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("organization", &self.organization)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// The body of the first PEM block of `text`, decoded, with its label.
fn pem_block(text: &str) -> Option<(String, Vec<u8>)> {
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + 11..];
    let label_end = rest.find("-----")?;
    let label = rest[..label_end].to_string();
    let body_start = label_end + 5;
    let end = rest.find(&format!("-----END {label}-----"))?;
    let body: String = rest[body_start..end]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    Some((label, B64.decode(body).ok()?))
}

/// A CA key in any of the shapes Talos writes: PKCS#8 (`PRIVATE KEY`, `ED25519 PRIVATE KEY`) or
/// SEC1 P-256 (`EC PRIVATE KEY`).
fn ca_key(pem: &str, what: &'static str) -> Result<KeyPair, PkiError> {
    let err = |detail: String| PkiError::Ca { what, detail };
    let (label, der) = pem_block(pem).ok_or_else(|| err("the key is not PEM".into()))?;
    if label == "EC PRIVATE KEY" {
        use p256::pkcs8::EncodePrivateKey;
        let sk = p256::SecretKey::from_sec1_der(&der)
            .map_err(|e| err(format!("EC key: {e} (only P-256 is supported)")))?;
        let pkcs8 = sk.to_pkcs8_der().map_err(|e| err(e.to_string()))?;
        return KeyPair::try_from(pkcs8.as_bytes()).map_err(|e| err(e.to_string()));
    }
    KeyPair::try_from(der.as_slice()).map_err(|e| err(format!("{label}: {e}")))
}

/// A CA ready to sign: its key and a certificate object carrying its exact subject.
struct Signer {
    issuer: Certificate,
    key: KeyPair,
    ca_pem: String,
}

impl Signer {
    fn new(ca: &CaPem, what: &'static str) -> Result<Signer, PkiError> {
        let key = ca_key(&ca.key, what)?;
        let params = CertificateParams::from_ca_cert_pem(&ca.crt).map_err(|e| PkiError::Ca {
            what,
            detail: format!("certificate: {e}"),
        })?;
        // Only the subject and key identifier of this object are used (as the issuer of what we
        // sign); the original certificate is what peers trust.
        let issuer = params.self_signed(&key).map_err(|e| PkiError::Ca {
            what,
            detail: format!("the key does not sign for this certificate: {e}"),
        })?;
        Ok(Signer {
            issuer,
            key,
            ca_pem: ca.crt.clone(),
        })
    }

    fn sign(
        &self,
        params: CertificateParams,
        subject_key: &KeyPair,
        organization: &str,
    ) -> Result<IssuedCert, PkiError> {
        let not_before = params.not_before;
        let not_after = params.not_after;
        let cert = params
            .signed_by(subject_key, &self.issuer, &self.key)
            .map_err(|e| PkiError::Sign(e.to_string()))?;
        let to_chrono = |t: time::OffsetDateTime| {
            DateTime::<Utc>::from_timestamp(t.unix_timestamp(), 0).unwrap_or_default()
        };
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: subject_key.serialize_pem(),
            ca_pem: self.ca_pem.clone(),
            not_before: to_chrono(not_before),
            not_after: to_chrono(not_after),
            organization: organization.to_string(),
        })
    }
}

fn random_serial() -> SerialNumber {
    let mut serial = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut serial);
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    SerialNumber::from_slice(&serial)
}

fn client_params(
    cn: Option<&str>,
    organization: &str,
    key_usages: Vec<KeyUsagePurpose>,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<CertificateParams, PkiError> {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| PkiError::Sign(e.to_string()))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, organization);
    if let Some(cn) = cn {
        dn.push(DnType::CommonName, cn);
    }
    params.distinguished_name = dn;
    params.is_ca = IsCa::NoCa;
    params.key_usages = key_usages;
    // apid accepts a client certificate whose extended key usage is client auth and nothing else.
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let at = |t: DateTime<Utc>| {
        time::OffsetDateTime::from_unix_timestamp(t.timestamp())
            .map_err(|e| PkiError::Sign(e.to_string()))
    };
    params.not_before = at(now - CLOCK_SKEW)?;
    params.not_after = at(now + ttl)?;
    params.serial_number = Some(random_serial());
    Ok(params)
}

/// A Talos API client certificate for `role`, valid for `ttl` from `now`, signed by the OS CA:
/// a fresh Ed25519 key, `O=<role>`, digital signature, client auth.
pub fn talos_client_cert(
    os_ca: &CaPem,
    role: &str,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<IssuedCert, PkiError> {
    if !TALOS_ROLES.contains(&role) {
        return Err(PkiError::Role(role.to_string()));
    }
    let signer = Signer::new(os_ca, "Talos OS CA")?;
    let key =
        KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(|e| PkiError::Sign(e.to_string()))?;
    let params = client_params(
        None,
        role,
        vec![KeyUsagePurpose::DigitalSignature],
        now,
        ttl,
    )?;
    signer.sign(params, &key, role)
}

/// A Kubernetes admin client certificate (`CN=admin`, `O=system:masters`, a fresh P-256 key),
/// valid for `ttl` from `now`, signed by the Kubernetes CA.
pub fn kubernetes_admin_cert(
    k8s_ca: &CaPem,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<IssuedCert, PkiError> {
    let signer = Signer::new(k8s_ca, "Kubernetes CA")?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| PkiError::Sign(e.to_string()))?;
    let params = client_params(
        Some("admin"),
        "system:masters",
        vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ],
        now,
        ttl,
    )?;
    signer.sign(params, &key, "system:masters")
}

/// SHA-256 of a certificate's DER (hex): how a node's certificate is recorded.
pub fn cert_fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

#[derive(Serialize)]
struct TalosContext<'a> {
    endpoints: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    nodes: &'a [String],
    ca: String,
    crt: String,
    key: String,
}

/// A `talosconfig` (talosctl's client configuration) with one context named after the cluster.
pub fn talosconfig(
    context: &str,
    endpoints: &[String],
    nodes: &[String],
    cert: &IssuedCert,
) -> Result<String, PkiError> {
    let mut contexts = std::collections::BTreeMap::new();
    contexts.insert(
        context.to_string(),
        TalosContext {
            endpoints,
            nodes,
            ca: B64.encode(cert.ca_pem.as_bytes()),
            crt: B64.encode(cert.cert_pem.as_bytes()),
            key: B64.encode(cert.key_pem.as_bytes()),
        },
    );
    let doc = serde_json::json!({ "context": context, "contexts": contexts });
    serde_yaml_ng::to_string(&doc).map_err(|e| PkiError::Sign(e.to_string()))
}

/// An admin `kubeconfig` for the cluster `name` at `server` (the control-plane endpoint), in the
/// shape Talos writes it: cluster `name`, user and context `admin@name`, namespace `default`.
pub fn kubeconfig(name: &str, server: &str, cert: &IssuedCert) -> Result<String, PkiError> {
    let user = format!("admin@{name}");
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": name,
            "cluster": {
                "server": server,
                "certificate-authority-data": B64.encode(cert.ca_pem.as_bytes()),
            },
        }],
        "users": [{
            "name": user,
            "user": {
                "client-certificate-data": B64.encode(cert.cert_pem.as_bytes()),
                "client-key-data": B64.encode(cert.key_pem.as_bytes()),
            },
        }],
        "contexts": [{
            "name": user,
            "context": { "cluster": name, "namespace": "default", "user": user },
        }],
        "current-context": user,
        "preferences": {},
    });
    serde_yaml_ng::to_string(&doc).map_err(|e| PkiError::Sign(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::talos::secrets::SecretsBundle;

    fn parse(pem: &str) -> Vec<u8> {
        pem_block(pem).expect("pem").1
    }

    #[test]
    fn client_certs_chain_to_the_os_ca_with_the_role_as_organization() {
        let bundle = SecretsBundle::generate().expect("bundle");
        let os = CaPem::from_base64(
            bundle.certs.os.crt.as_deref().expect("crt"),
            &bundle.certs.os.key,
            "os",
        )
        .expect("os ca");
        let now = Utc::now();
        let c = talos_client_cert(&os, "os:reader", now, Duration::minutes(10)).expect("issue");
        assert_eq!(
            c.not_after.timestamp(),
            (now + Duration::minutes(10)).timestamp()
        );
        let der = parse(&c.cert_pem);
        let (_, x) = x509_parser::parse_x509_certificate(&der).expect("x509");
        let orgs: Vec<&str> = x
            .subject()
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .collect();
        assert_eq!(orgs, ["os:reader"]);
        let ca_der = parse(&os.crt);
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
        assert_eq!(x.issuer().as_raw(), ca.subject().as_raw(), "issuer bytes");
        x.verify_signature(Some(ca.public_key()))
            .expect("signed by the OS CA");
        let eku = x.extended_key_usage().expect("eku").expect("present").value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(c.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(!format!("{c:?}").contains("PRIVATE"));
        assert!(matches!(
            talos_client_cert(&os, "root", now, Duration::minutes(1)),
            Err(PkiError::Role(_))
        ));
    }

    #[test]
    fn the_shared_bundle_signs_too() {
        // A bundle written by talosctl (PrintableString subject, Go's key encodings).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/talos/configs/secrets.yaml");
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        let b = SecretsBundle::parse(&text).expect("bundle");
        for (ca, what) in [(&b.certs.os, "os"), (&b.certs.k8s, "k8s")] {
            let pem =
                CaPem::from_base64(ca.crt.as_deref().expect("crt"), &ca.key, "ca").expect("ca");
            let issued = if what == "os" {
                talos_client_cert(&pem, "os:admin", Utc::now(), Duration::hours(1))
            } else {
                kubernetes_admin_cert(&pem, Utc::now(), Duration::hours(1))
            }
            .expect("issue");
            let der = parse(&issued.cert_pem);
            let (_, x) = x509_parser::parse_x509_certificate(&der).expect("x509");
            let ca_der = parse(&pem.crt);
            let (_, c) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
            assert_eq!(x.issuer().as_raw(), c.subject().as_raw(), "{what}");
            x.verify_signature(Some(c.public_key())).expect(what);
        }
    }

    #[test]
    fn configs_carry_the_credentials() {
        let bundle = SecretsBundle::generate().expect("bundle");
        let k8s = CaPem::from_base64(
            bundle.certs.k8s.crt.as_deref().expect("crt"),
            &bundle.certs.k8s.key,
            "k8s",
        )
        .expect("k8s ca");
        let c = kubernetes_admin_cert(&k8s, Utc::now(), Duration::hours(8)).expect("issue");
        let y = kubeconfig("prod", "https://10.0.0.10:6443", &c).expect("yaml");
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&y).expect("parse");
        assert_eq!(v["current-context"].as_str(), Some("admin@prod"));
        assert_eq!(
            v["clusters"][0]["cluster"]["server"].as_str(),
            Some("https://10.0.0.10:6443")
        );
        let t = talosconfig("prod", &["10.0.0.11".into()], &["10.0.0.11".into()], &c)
            .expect("talosconfig");
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&t).expect("parse");
        assert_eq!(v["context"].as_str(), Some("prod"));
        assert_eq!(
            v["contexts"]["prod"]["endpoints"][0].as_str(),
            Some("10.0.0.11")
        );
    }
}
