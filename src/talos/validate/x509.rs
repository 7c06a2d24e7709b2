//! Certificates and keys in config fields, read the way Talos reads them: Go's `encoding/pem`
//! `Decode`, `crypto/x509` parsing (certificates, PKCS#1 RSA, PKCS#8 and SEC1 EC private keys),
//! the helpers of `github.com/siderolabs/crypto/x509` Talos calls (`GetCert`, `GetKey`,
//! `GetPrivateKey`), `meta.AssertValidPEM` (`pkg/machinery/config/types/meta/certificate_key.go`),
//! and the base64 that the v1alpha1 decoder requires of its certificate fields
//! (`PEMEncodedCertificateAndKey`, `PEMEncodedCertificate`, `PEMEncodedKey` decode `crt`/`key`
//! with Go's `base64.StdEncoding`). Certificates are parsed with the `x509-parser` crate, keys
//! with the RustCrypto `pkcs1`/`pkcs8`/`sec1` decoders; the errors say what Talos would refuse,
//! in Talos' words where they are Talos' own. Imports nothing outside `crate::talos`.

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs8::der::Decode;
use serde_yaml_ng::Value;

use super::rules::{at, Findings};

/// One PEM block: its type, whether it had headers, and its bytes.
#[derive(Debug)]
pub(super) struct PemBlock {
    pub label: String,
    pub headers: bool,
    pub der: Vec<u8>,
}

/// Go's `base64.StdEncoding`: padding required, trailing bits allowed, `\r` and `\n` skipped.
pub(super) fn go_std_base64(s: &str) -> Result<Vec<u8>, String> {
    const GO_STD: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let clean: String = s.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    GO_STD.decode(clean.as_bytes()).map_err(|e| match e {
        base64::DecodeError::InvalidByte(at, _) | base64::DecodeError::InvalidLastSymbol(at, _) => {
            format!("illegal base64 data at input byte {at}")
        }
        _ => format!("illegal base64 data at input byte {}", clean.len()),
    })
}

/// The line at the start of `data` without trailing spaces, tabs and `\r`, and what follows it.
fn get_line(data: &[u8]) -> (&[u8], &[u8]) {
    let (line, rest) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    let end = line
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t' | b'\r'))
        .map_or(0, |i| i + 1);
    (&line[..end], rest)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Go's `pem.Decode`: the first well-formed block (candidates that are not are skipped) and the
/// bytes after it.
pub(super) fn pem_decode(data: &[u8]) -> (Option<PemBlock>, &[u8]) {
    let mut rest = data;
    loop {
        if let Some(after) = rest.strip_prefix(b"-----BEGIN ".as_slice()) {
            rest = after;
        } else if let Some(i) = find(rest, b"\n-----BEGIN ") {
            rest = &rest[i + 12..];
        } else {
            return (None, data);
        }
        let (type_line, after_type) = get_line(rest);
        rest = after_type;
        let Some(label) = type_line.strip_suffix(b"-----".as_slice()) else {
            continue;
        };
        let mut headers = false;
        let mut body = rest;
        loop {
            if body.is_empty() {
                return (None, data);
            }
            let (line, next) = get_line(body);
            if !line.contains(&b':') {
                break;
            }
            headers = true;
            body = next;
        }
        let (end_index, trailer_index) = if !headers && body.starts_with(b"-----END ") {
            (0, 9)
        } else {
            match find(body, b"\n-----END ") {
                Some(i) => (i, i + 10),
                None => continue,
            }
        };
        let trailer = &body[trailer_index..];
        let trailer_len = label.len() + 5;
        if trailer.len() < trailer_len {
            continue;
        }
        let (end_line, rest_of_end) = trailer.split_at(trailer_len);
        if !end_line.starts_with(label) || !end_line.ends_with(b"-----") {
            continue;
        }
        if !get_line(rest_of_end).0.is_empty() {
            continue;
        }
        let b64: String = body[..end_index]
            .iter()
            .filter(|b| !matches!(b, b' ' | b'\t'))
            .map(|&b| char::from(b))
            .collect();
        let Ok(der) = go_std_base64(&b64) else {
            continue;
        };
        let (_, after) = get_line(&body[end_index + 9..]);
        return (
            Some(PemBlock {
                label: String::from_utf8_lossy(label).into_owned(),
                headers,
                der,
            }),
            after,
        );
    }
}

/// `meta.AssertValidPEM`: at least one block, each of one of `expected` (any when empty).
pub(super) fn assert_valid_pem(data: &str, expected: &[&str]) -> Result<(), String> {
    let mut rest = data.as_bytes();
    let mut n = 0;
    while let (Some(block), after) = pem_decode(rest) {
        if !expected.is_empty() && !expected.contains(&block.label.as_str()) {
            let quoted: Vec<String> = expected.iter().map(|e| format!("{e:?}")).collect();
            return Err(format!(
                "unexpected PEM block type {:?}, expected one of [{}]",
                block.label,
                quoted.join(" ")
            ));
        }
        n += 1;
        rest = after;
    }
    if n == 0 {
        return Err("no PEM blocks found".into());
    }
    Ok(())
}

/// `x509.ParseCertificate` of DER bytes.
pub(super) fn parse_certificate(der: &[u8]) -> Result<(), String> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], _)) => Ok(()),
        Ok(_) => Err("x509: trailing data".into()),
        Err(e) => Err(format!("x509: malformed certificate ({e})")),
    }
}

/// `CertPool.AppendCertsFromPEM`: whether at least one `CERTIFICATE` block without headers
/// parses.
pub(super) fn append_certs_from_pem(data: &str) -> bool {
    let mut rest = data.as_bytes();
    let mut ok = false;
    while let (Some(block), after) = pem_decode(rest) {
        if block.label == "CERTIFICATE" && !block.headers && parse_certificate(&block.der).is_ok() {
            ok = true;
        }
        rest = after;
    }
    ok
}

/// siderolabs/crypto `GetCert`: the first PEM block parses as a certificate.
pub(super) fn get_cert(pem: &str) -> Result<(), String> {
    let (Some(block), _) = pem_decode(pem.as_bytes()) else {
        return Err("failed to parse PEM block".into());
    };
    parse_certificate(&block.der).map_err(|e| format!("failed to parse certificate: {e}"))
}

/// What kind of private key a DER structure holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyKind {
    Rsa,
    Ecdsa,
    Ed25519,
    X25519,
}

/// `x509.ParsePKCS1PrivateKey`, with the key's own consistency check.
pub(super) fn parse_pkcs1(der: &[u8]) -> Result<(), String> {
    let key = rsa::RsaPrivateKey::from_pkcs1_der(der).map_err(|e| {
        if parse_pkcs8(der).is_ok() {
            "x509: failed to parse private key (use ParsePKCS8PrivateKey instead for this key format)".to_string()
        } else if parse_sec1(der, None).is_ok() {
            "x509: failed to parse private key (use ParseECPrivateKey instead for this key format)".to_string()
        } else {
            format!("x509: malformed PKCS#1 private key ({e})")
        }
    })?;
    key.validate()
        .map_err(|e| format!("x509: invalid RSA private key ({e})"))
}

const OID_RSA: &str = "1.2.840.113549.1.1.1";
const OID_EC: &str = "1.2.840.10045.2.1";
const OID_ED25519: &str = "1.3.101.112";
const OID_X25519: &str = "1.3.101.110";

/// The byte size of the order of the named curves Go knows (P-224, P-256, P-384, P-521).
fn curve_size(oid: &str) -> Option<usize> {
    match oid {
        "1.3.132.0.33" => Some(28),
        "1.2.840.10045.3.1.7" => Some(32),
        "1.3.132.0.34" => Some(48),
        "1.3.132.0.35" => Some(66),
        _ => None,
    }
}

/// `x509.ParseECPrivateKey` (SEC1), with the curve the PKCS#8 wrapper names when there is one.
pub(super) fn parse_sec1(der: &[u8], curve: Option<&str>) -> Result<(), String> {
    let key = sec1::EcPrivateKey::try_from(der)
        .map_err(|e| format!("x509: failed to parse EC private key ({e})"))?;
    let named = key
        .parameters
        .and_then(|p| p.named_curve())
        .map(|o| o.to_string());
    let Some(oid) = curve.map(str::to_string).or(named) else {
        return Err("x509: unknown elliptic curve".into());
    };
    let Some(size) = curve_size(&oid) else {
        return Err("x509: unknown elliptic curve".into());
    };
    let k = key.private_key;
    if k.len() > size {
        return Err("x509: invalid private key length".into());
    }
    if k.iter().all(|&b| b == 0) {
        return Err("x509: invalid elliptic curve private key value".into());
    }
    if oid == "1.2.840.10045.3.1.7" {
        let mut padded = [0u8; 32];
        padded[32 - k.len()..].copy_from_slice(k);
        if p256::SecretKey::from_slice(&padded).is_err() {
            return Err("x509: invalid elliptic curve private key value".into());
        }
    }
    Ok(())
}

/// `x509.ParsePKCS8PrivateKey`: which key it holds.
pub(super) fn parse_pkcs8(der: &[u8]) -> Result<KeyKind, String> {
    let info = rsa::pkcs8::PrivateKeyInfo::try_from(der)
        .map_err(|e| format!("x509: failed to parse private key ({e})"))?;
    let oid = info.algorithm.oid.to_string();
    match oid.as_str() {
        OID_RSA => {
            rsa::RsaPrivateKey::from_pkcs1_der(info.private_key)
                .map_err(|e| {
                    format!("x509: failed to parse RSA private key embedded in PKCS#8: {e}")
                })?
                .validate()
                .map_err(|e| {
                    format!("x509: failed to parse RSA private key embedded in PKCS#8: {e}")
                })?;
            Ok(KeyKind::Rsa)
        }
        OID_EC => {
            let curve = info.algorithm.parameters_oid().map(|o| o.to_string()).ok();
            parse_sec1(info.private_key, curve.as_deref()).map_err(|e| {
                format!("x509: failed to parse EC private key embedded in PKCS#8: {e}")
            })?;
            Ok(KeyKind::Ecdsa)
        }
        OID_ED25519 | OID_X25519 => {
            let what = if oid == OID_ED25519 {
                "Ed25519"
            } else {
                "X25519"
            };
            let inner = rsa::pkcs8::der::asn1::OctetStringRef::from_der(info.private_key)
                .map_err(|e| format!("x509: invalid {what} private key: {e}"))?;
            if inner.as_bytes().len() != 32 {
                return Err(format!(
                    "x509: invalid {what} private key length: {}",
                    inner.as_bytes().len()
                ));
            }
            Ok(if oid == OID_ED25519 {
                KeyKind::Ed25519
            } else {
                KeyKind::X25519
            })
        }
        other => Err(format!(
            "x509: PKCS#8 wrapping contained private key with unknown algorithm: {other}"
        )),
    }
}

/// Which siderolabs/crypto reader reads a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyReader {
    /// `PEMEncodedCertificateAndKey.GetKey`: by PEM type, PKCS#8 of any kind.
    CertificateAndKey,
    /// `PEMEncodedKey.GetKey`: by PEM type; PKCS#8 of RSA, ECDSA or Ed25519 only.
    Key,
    /// `PEMEncodedCertificateAndKey.GetPrivateKey`: PKCS#8 only, whatever the PEM type.
    Pkcs8,
}

/// Read the private key in `pem` as `reader` does.
pub(super) fn get_key(pem: &str, reader: KeyReader) -> Result<(), String> {
    let (Some(block), _) = pem_decode(pem.as_bytes()) else {
        return Err("failed to parse PEM block".into());
    };
    let der = &block.der;
    if reader == KeyReader::Pkcs8 {
        return parse_pkcs8(der)
            .map(|_| ())
            .map_err(|e| format!("failed to parse key: {e}"));
    }
    match block.label.as_str() {
        "RSA PRIVATE KEY" => parse_pkcs1(der).map_err(|e| format!("failed to parse RSA key: {e}")),
        "EC PRIVATE KEY" => {
            parse_sec1(der, None).map_err(|e| format!("failed to parse ECDSA key: {e}"))
        }
        "ED25519 PRIVATE KEY" => match parse_pkcs8(der) {
            Ok(KeyKind::Ed25519) => Ok(()),
            Ok(_) => Err("failed parsing Ed25519 key, got wrong key type".into()),
            Err(e) => Err(format!("failed to parse Ed25519 key: {e}")),
        },
        "PRIVATE KEY" => match (parse_pkcs8(der), reader) {
            (Ok(KeyKind::X25519), KeyReader::Key) => {
                Err("unsupported key type *ecdh.PrivateKey".into())
            }
            (Ok(_), _) => Ok(()),
            (Err(e), _) => Err(format!("failed to parse key: {e}")),
        },
        other => Err(match reader {
            KeyReader::Key => format!("unsupported key type {other:?}"),
            _ => format!("unsupported key type: {other:?}"),
        }),
    }
}

/// siderolabs/crypto's placeholder for a redacted key, which its decoder keeps as is.
const REDACTED: &str = "******";

/// The v1alpha1 certificate and key fields whose text the decoder base64-decodes: a value that
/// is not standard padded base64 fails to decode (`PEMEncodedCertificateAndKey`,
/// `PEMEncodedCertificate`, `PEMEncodedKey` in siderolabs/crypto `x509`, `Base64Bytes` in
/// `v1alpha1_types.go`). `rule` names the decoder.
pub(super) fn check_v1alpha1_base64(doc: &Value, f: &mut Findings<'_>, rule: &'static str) {
    let mut fields: Vec<(String, bool)> = Vec::new();
    for base in [
        "machine.ca",
        "cluster.ca",
        "cluster.aggregatorCA",
        "cluster.etcd.ca",
    ] {
        fields.push((format!("{base}.crt"), false));
        fields.push((format!("{base}.key"), true));
    }
    fields.push(("cluster.serviceAccount.key".into(), true));
    for list in ["machine.acceptedCAs", "cluster.acceptedCAs"] {
        let n = at(doc, list)
            .and_then(Value::as_sequence)
            .map_or(0, Vec::len);
        for i in 0..n {
            fields.push((format!("{list}.{i}.crt"), false));
        }
    }
    for (path, is_key) in fields {
        let value = lookup(doc, &path);
        let Some(text) = value.and_then(Value::as_str) else {
            continue;
        };
        if is_key && text == REDACTED {
            continue;
        }
        if let Err(e) = go_std_base64(text) {
            f.error(
                &dotted_to_path(&path),
                rule,
                format!("{e} (the decoder reads this field as standard base64 of PEM)"),
            );
        }
    }
    // Registry names hold dots (`ghcr.io`): walk the mapping directly.
    if let Some(regs) = at(doc, "machine.registries.config").and_then(Value::as_mapping) {
        for (k, v) in regs {
            let k = crate::talos::scalar_text(k).unwrap_or_default();
            for (sub, is_key) in [
                ("tls.clientIdentity.crt", false),
                ("tls.clientIdentity.key", true),
                ("tls.ca", false),
            ] {
                let Some(text) = at(v, sub).and_then(Value::as_str) else {
                    continue;
                };
                if is_key && text == REDACTED {
                    continue;
                }
                if let Err(e) = go_std_base64(text) {
                    f.error(
                        &format!("machine.registries.config.{k}.{sub}"),
                        rule,
                        format!("{e} (the decoder reads this field as standard base64 of PEM)"),
                    );
                }
            }
        }
    }
}

/// `at` that reads numeric segments as list indexes.
fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut node = v;
    for k in path.split('.') {
        node = match (k.parse::<usize>(), node) {
            (Ok(i), Value::Sequence(s)) => s.get(i)?,
            _ => node.get(k)?,
        };
    }
    (!node.is_null()).then_some(node)
}

/// `machine.acceptedCAs.0.crt` -> `machine.acceptedCAs[0].crt`.
fn dotted_to_path(p: &str) -> String {
    let mut out = String::new();
    for seg in p.split('.') {
        if seg.parse::<usize>().is_ok() {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(seg);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(label: &str, der: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        format!("-----BEGIN {label}-----\n{b64}\n-----END {label}-----\n")
    }

    #[test]
    fn go_base64() {
        assert_eq!(go_std_base64("aGk=").as_deref(), Ok(b"hi".as_slice()));
        assert!(go_std_base64("aGk").is_err());
        assert_eq!(go_std_base64("aG\nk=").as_deref(), Ok(b"hi".as_slice()));
        assert!(go_std_base64("not base64!").is_err());
    }

    #[test]
    fn pem_blocks_as_go_decodes_them() {
        let text = format!("junk\n{}", pem("CERTIFICATE", b"abc"));
        let (b, _) = pem_decode(text.as_bytes());
        let b = b.expect("block");
        assert_eq!(b.label, "CERTIFICATE");
        assert_eq!(b.der, b"abc");
        assert!(pem_decode(b"-----BEGIN X-----\nAAA\n-----END Y-----\n")
            .0
            .is_none());
        assert_eq!(
            assert_valid_pem(&pem("CERTIFICATE", b"x"), &["CERTIFICATE"]),
            Ok(())
        );
        assert!(assert_valid_pem(&pem("PRIVATE KEY", b"x"), &["CERTIFICATE"]).is_err());
        assert!(assert_valid_pem("nothing", &[]).is_err());
    }

    #[test]
    fn certificates_and_keys() {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["x".into()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        assert_eq!(get_cert(&cert.pem()), Ok(()));
        assert!(append_certs_from_pem(&cert.pem()));
        assert!(!append_certs_from_pem(&pem("CERTIFICATE", b"not der")));
        assert!(get_cert(&pem("CERTIFICATE", b"not der")).is_err());
        // rcgen writes a PKCS#8 "PRIVATE KEY" (ECDSA P-256).
        let k = key.serialize_pem();
        assert_eq!(get_key(&k, KeyReader::CertificateAndKey), Ok(()));
        assert_eq!(get_key(&k, KeyReader::Key), Ok(()));
        assert_eq!(get_key(&k, KeyReader::Pkcs8), Ok(()));
        // The same bytes under the PKCS#1 label are not an RSA key.
        let der = key.serialize_der();
        assert!(get_key(&pem("RSA PRIVATE KEY", &der), KeyReader::Key).is_err());
        assert!(get_key(&pem("DSA PRIVATE KEY", &der), KeyReader::Key).is_err());
        assert!(get_key("no pem", KeyReader::Key).is_err());
    }
}
