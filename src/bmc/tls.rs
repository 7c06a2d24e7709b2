//! TLS for BMC connections: verify against the system's root certificates, or against a pinned
//! SHA-256 fingerprint of the BMC's certificate (BMCs ship self-signed certificates), or not at all
//! when an operator set that explicitly for this BMC. `PlainHttp` is the explicit consent to an
//! `http://` BMC, whose password crosses the network in clear; it has no TLS configuration.
//!
//! A pinned certificate is the BMC's identity: its host name is not checked (BMC certificates name
//! whatever the factory put there), but the handshake signature still is, so only the holder of the
//! pinned certificate's key can answer.

use std::fmt;
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

use super::BmcError;
use crate::domain::{normalise_fingerprint, TlsMode};

/// SHA-256 fingerprint of a DER certificate.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertFingerprint(pub [u8; 32]);

impl CertFingerprint {
    /// Parse 64 hex digits, colons and a `sha256:` prefix allowed.
    pub fn parse(s: &str) -> Result<Self, BmcError> {
        let hex_digits = normalise_fingerprint(s).map_err(BmcError::Config)?;
        let bytes = hex::decode(hex_digits).map_err(|e| BmcError::Config(e.to_string()))?;
        let arr: [u8; 32] = bytes
            .try_into()
            .map_err(|_| BmcError::Config("fingerprint must be 32 bytes".into()))?;
        Ok(CertFingerprint(arr))
    }

    /// Fingerprint of a DER-encoded certificate.
    pub fn of_der(der: &[u8]) -> Self {
        CertFingerprint(Sha256::digest(der).into())
    }
}

impl fmt::Display for CertFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for CertFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{self}")
    }
}

/// How the certificate of one BMC is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsPolicy {
    /// Against the system's root certificates, with host name checking.
    Verify,
    /// Against this certificate fingerprint only.
    Pinned(CertFingerprint),
    /// Not at all. Only when set explicitly for this BMC.
    Insecure,
    /// No TLS: an `http://` BMC, set explicitly (`insecure-http`). Without it, the client refuses
    /// to send a password to an `http://` URL.
    PlainHttp,
}

impl TlsPolicy {
    /// From the inventory's TLS mode and fingerprint.
    pub fn from_inventory(mode: TlsMode, fingerprint: Option<&str>) -> Result<Self, BmcError> {
        match (mode, fingerprint) {
            (TlsMode::Verify, _) => Ok(TlsPolicy::Verify),
            (TlsMode::Insecure, _) => Ok(TlsPolicy::Insecure),
            (TlsMode::InsecureHttp, _) => Ok(TlsPolicy::PlainHttp),
            (TlsMode::Pinned, Some(fp)) => Ok(TlsPolicy::Pinned(CertFingerprint::parse(fp)?)),
            (TlsMode::Pinned, None) => Err(BmcError::Config(
                "TLS mode `pinned` needs the SHA-256 fingerprint of the BMC certificate".into(),
            )),
        }
    }

    /// The inventory's name for this policy.
    pub fn mode(&self) -> TlsMode {
        match self {
            TlsPolicy::Verify => TlsMode::Verify,
            TlsPolicy::Pinned(_) => TlsMode::Pinned,
            TlsPolicy::Insecure => TlsMode::Insecure,
            TlsPolicy::PlainHttp => TlsMode::InsecureHttp,
        }
    }

    /// The rustls client configuration for this policy.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, BmcError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| BmcError::Config(format!("TLS protocol versions: {e}")))?;
        let config =
            match self {
                TlsPolicy::Verify => builder
                    .with_root_certificates(system_roots()?)
                    .with_no_client_auth(),
                TlsPolicy::Pinned(fp) => builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                        pin: Some(*fp),
                        provider,
                    }))
                    .with_no_client_auth(),
                TlsPolicy::Insecure => builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                        pin: None,
                        provider,
                    }))
                    .with_no_client_auth(),
                TlsPolicy::PlainHttp => return Err(BmcError::Config(
                    "bmc.tls `insecure-http` is only for http:// BMC URLs; an https:// BMC takes \
                     verify, pinned or insecure"
                        .into(),
                )),
            };
        Ok(config)
    }
}

/// The system's root certificates, loaded once per process.
fn system_roots() -> Result<Arc<RootCertStore>, BmcError> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A single unparsable system certificate must not take the others down.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                Err(format!(
                    "no usable system root certificates ({} errors loading them); pin the BMC \
                     certificate fingerprint instead",
                    found.errors.len()
                ))
            } else {
                Ok(Arc::new(roots))
            }
        })
        .clone()
        .map_err(BmcError::Config)
}

/// Accepts exactly the pinned certificate (or, with no pin, any certificate), and checks the
/// handshake signatures against it.
#[derive(Debug)]
struct PinnedVerifier {
    pin: Option<CertFingerprint>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.pin {
            None => Ok(ServerCertVerified::assertion()),
            Some(pin) => {
                let seen = CertFingerprint::of_der(end_entity.as_ref());
                if seen == pin {
                    Ok(ServerCertVerified::assertion())
                } else {
                    Err(rustls::Error::General(format!(
                        "BMC certificate fingerprint is sha256:{seen}, pinned sha256:{pin}"
                    )))
                }
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_forms() {
        let hex64 = "AB".repeat(32);
        let colons = vec!["ab"; 32].join(":");
        let a = CertFingerprint::parse(&hex64).expect("hex");
        let b = CertFingerprint::parse(&format!("sha256:{colons}")).expect("colons");
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "ab".repeat(32));
        assert!(CertFingerprint::parse("abcd").is_err());
    }

    #[test]
    fn policy_from_inventory() {
        assert_eq!(
            TlsPolicy::from_inventory(TlsMode::Verify, None).expect("verify"),
            TlsPolicy::Verify
        );
        assert!(TlsPolicy::from_inventory(TlsMode::Pinned, None).is_err());
        let p = TlsPolicy::from_inventory(TlsMode::Pinned, Some(&"00".repeat(32))).expect("pin");
        assert_eq!(p.mode(), TlsMode::Pinned);
        assert!(TlsPolicy::Insecure.client_config().is_ok());
        assert!(p.client_config().is_ok());
        let plain = TlsPolicy::from_inventory(TlsMode::InsecureHttp, None).expect("plain");
        assert_eq!(plain, TlsPolicy::PlainHttp);
        assert_eq!(plain.mode(), TlsMode::InsecureHttp);
        assert!(
            plain.client_config().is_err(),
            "no TLS for a plain-HTTP BMC"
        );
    }
}
