//! `plinth cluster init` output parsed back and its certificates checked with openssl: key types, CA
//! flags, key usage, validity, and that every key belongs to its certificate; and compared with the
//! bundle `talosctl gen secrets` writes (Talos' own test data when /work/shared has it, and always
//! with the expectations read from Talos' generator).

use std::process::Command;

use base64::Engine;

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

fn openssl(args: &[&str], input: &std::path::Path) -> String {
    let out = Command::new("openssl")
        .args(args)
        .arg("-in")
        .arg(input)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn cluster_init_writes_a_bundle_openssl_accepts() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("secrets.yaml");
    let st = Command::new(BIN)
        .args([
            "cluster",
            "init",
            "prod",
            "--endpoint",
            "https://10.0.0.10:6443",
            "--out",
            out.to_str().expect("p"),
        ])
        .output()
        .expect("run");
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&out).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    // It refuses to overwrite an existing bundle.
    let again = Command::new(BIN)
        .args([
            "cluster",
            "init",
            "prod",
            "--endpoint",
            "https://10.0.0.10:6443",
            "--out",
            out.to_str().expect("p"),
        ])
        .output()
        .expect("run");
    assert!(!again.status.success());
    let bad = Command::new(BIN)
        .args([
            "cluster",
            "init",
            "prod",
            "--endpoint",
            "10.0.0.10:6443",
            "--out",
            dir.path().join("x").to_str().expect("p"),
        ])
        .output()
        .expect("run");
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--endpoint"));

    let bundle =
        plinth::talos::secrets::SecretsBundle::parse(&std::fs::read_to_string(&out).expect("read"))
            .expect("parses");
    let b64 = base64::engine::general_purpose::STANDARD;
    let token_ok = |t: &str| {
        let (a, b) = t.split_once('.').expect("dot");
        a.len() == 6
            && b.len() == 16
            && t.chars()
                .all(|c| c == '.' || c.is_ascii_lowercase() || c.is_ascii_digit())
    };
    assert!(token_ok(&bundle.secrets.bootstraptoken) && token_ok(&bundle.trustdinfo.token));
    for v in [
        &bundle.cluster.secret,
        &bundle.secrets.secretboxencryptionsecret,
    ] {
        assert_eq!(b64.decode(v).expect("b64").len(), 32);
    }
    // The default release (1.13) writes the cluster id URL-safe.
    let url = base64::engine::general_purpose::URL_SAFE;
    assert_eq!(url.decode(&bundle.cluster.id).expect("id").len(), 32);
    let c = &bundle.certs;
    for (name, ck, org, algo) in [
        ("os", &c.os, Some("O = talos"), "ED25519"),
        ("etcd", &c.etcd, Some("O = etcd"), "id-ecPublicKey"),
        ("k8s", &c.k8s, Some("O = kubernetes"), "id-ecPublicKey"),
        ("k8saggregator", &c.k8saggregator, None, "id-ecPublicKey"),
    ] {
        let crt = dir.path().join(format!("{name}.crt"));
        std::fs::write(
            &crt,
            b64.decode(ck.crt.as_ref().expect("crt")).expect("b64"),
        )
        .expect("w");
        let text = openssl(&["x509", "-noout", "-text"], &crt);
        assert!(
            text.contains(&format!("Public Key Algorithm: {algo}")),
            "{name}: {text}"
        );
        if algo == "id-ecPublicKey" {
            assert!(text.contains("NIST CURVE: P-256"), "{name}");
        }
        assert!(text.contains("CA:TRUE"), "{name}");
        assert!(
            text.contains("X509v3 Key Usage: critical"),
            "{name}: {text}"
        );
        assert!(
            text.contains("Digital Signature, Certificate Sign"),
            "{name}"
        );
        assert!(
            text.contains("TLS Web Server Authentication, TLS Web Client Authentication"),
            "{name}"
        );
        if let Some(o) = org {
            assert!(text.contains(&format!("Subject: {o}")), "{name}: {text}");
        }
        // About ten years of validity.
        let end = openssl(
            &[
                "x509",
                "-noout",
                "-checkend",
                &(9 * 365 * 86400).to_string(),
            ],
            &crt,
        );
        assert!(end.contains("will not expire"), "{name}: {end}");
        // The key belongs to the certificate (openssl reads Talos's ED25519 label as PKCS#8).
        let key_pem = String::from_utf8(b64.decode(&ck.key).expect("b64")).expect("utf8");
        let key = dir.path().join(format!("{name}.key"));
        std::fs::write(&key, key_pem.replace("ED25519 PRIVATE KEY", "PRIVATE KEY")).expect("w");
        let from_key = openssl(&["pkey", "-pubout"], &key);
        let from_crt = openssl(&["x509", "-noout", "-pubkey"], &crt);
        assert_eq!(from_key, from_crt, "{name}: key and certificate match");
        if algo == "id-ecPublicKey" {
            assert!(
                key_pem.starts_with("-----BEGIN EC PRIVATE KEY-----"),
                "{name}: SEC1 as Go writes it"
            );
        }
    }
    // Talos 1.7 and later: an RSA 4096 service-account key, PKCS#1.
    let sa = dir.path().join("sa.key");
    let sa_pem = b64.decode(&c.k8sserviceaccount.key).expect("b64");
    assert!(sa_pem.starts_with(b"-----BEGIN RSA PRIVATE KEY-----"));
    std::fs::write(&sa, &sa_pem).expect("w");
    let text = openssl(&["rsa", "-noout", "-text"], &sa);
    assert!(text.contains("Private-Key: (4096 bit"), "{text}");
    let check = openssl(&["rsa", "-noout", "-check"], &sa);
    assert!(check.contains("RSA key ok"), "{check}");
}

/// What `talosctl gen secrets` decides about one CA of the bundle: everything but the random parts.
#[derive(Debug, PartialEq, Eq)]
struct CaShape {
    /// Subject, RFC 4514 (`O=etcd`; empty for the aggregator CA).
    subject: String,
    /// Self-signed: issuer bytes equal subject bytes.
    self_issued: bool,
    /// Public key algorithm and curve (`1.2.840.10045.2.1/1.2.840.10045.3.1.7` = EC P-256).
    key: String,
    /// Signature algorithm OID.
    signature: String,
    /// Basic constraints CA:TRUE (critical or not, as Go writes it).
    ca: (bool, bool),
    /// Key usage: (critical, digital signature, certificate sign, any other bit).
    key_usage: (bool, bool, bool, bool),
    /// Extended key usage: (server auth, client auth, any other).
    eku: (bool, bool, bool),
    /// Validity in hours.
    hours: i64,
    /// A subject key identifier is present.
    ski: bool,
    /// PEM label of the private key.
    key_label: String,
}

fn ca_shape(crt_b64: &str, key_b64: &str) -> CaShape {
    use x509_parser::prelude::*;
    let b64 = base64::engine::general_purpose::STANDARD;
    let crt_pem = b64.decode(crt_b64).expect("crt b64");
    let (_, pem) = parse_x509_pem(&crt_pem).expect("crt pem");
    let (_, x) = parse_x509_certificate(&pem.contents).expect("x509");
    let spki = &x.tbs_certificate.subject_pki;
    let curve = spki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|o| format!("/{o}"))
        .unwrap_or_default();
    let bc = x
        .basic_constraints()
        .expect("bc")
        .expect("basic constraints");
    let ku = x.key_usage().expect("ku").expect("key usage");
    let other_ku = ku.value.flags & !(0x01 | 0x20) != 0;
    let eku = x.extended_key_usage().expect("eku").expect("eku").value;
    let key_pem = String::from_utf8(b64.decode(key_b64).expect("key b64")).expect("utf8");
    let key_label = key_pem
        .lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("-----BEGIN ")
        .trim_end_matches("-----")
        .to_string();
    let v = x.validity();
    CaShape {
        subject: x.subject().to_string(),
        self_issued: x.issuer().as_raw() == x.subject().as_raw(),
        key: format!("{}{curve}", spki.algorithm.algorithm),
        signature: x.signature_algorithm.algorithm.to_string(),
        ca: (bc.value.ca, bc.critical),
        key_usage: (
            ku.critical,
            ku.value.digital_signature(),
            ku.value.key_cert_sign(),
            other_ku,
        ),
        eku: (
            eku.server_auth,
            eku.client_auth,
            eku.any
                || eku.code_signing
                || eku.email_protection
                || eku.ocsp_signing
                || !eku.other.is_empty(),
        ),
        hours: (v.not_after.timestamp() - v.not_before.timestamp()) / 3600,
        ski: x
            .extensions()
            .iter()
            .any(|e| e.oid == x509_parser::oid_registry::OID_X509_EXT_SUBJECT_KEY_IDENTIFIER),
        key_label,
    }
}

const EC_P256: &str = "1.2.840.10045.2.1/1.2.840.10045.3.1.7";
const ED25519: &str = "1.3.101.112";
const ECDSA_SHA256: &str = "1.2.840.10045.4.3.2";

/// Each CA as Talos' generator makes it, read from `pkg/machinery/config/generate/secrets/ca.go`
/// and siderolabs/crypto `x509.NewSelfSignedCertificateAuthority` (v1.11.6 to v1.14.0-rc.1):
/// (bundle field, subject, key algorithm, signature algorithm, key PEM label). `ca.go` passes
/// `CommonName("front-proxy")` for the aggregator CA, but the self-signed constructor writes only
/// the Organization into the subject, so the aggregator CA's subject is empty.
const TALOS_CAS: &[(&str, &str, &str, &str, &str)] = &[
    ("etcd", "O=etcd", EC_P256, ECDSA_SHA256, "EC PRIVATE KEY"),
    (
        "k8s",
        "O=kubernetes",
        EC_P256,
        ECDSA_SHA256,
        "EC PRIVATE KEY",
    ),
    ("k8saggregator", "", EC_P256, ECDSA_SHA256, "EC PRIVATE KEY"),
    ("os", "O=talos", ED25519, ED25519, "ED25519 PRIVATE KEY"),
];

fn expected_shape(subject: &str, key: &str, signature: &str, label: &str) -> CaShape {
    CaShape {
        subject: subject.into(),
        self_issued: true,
        key: key.into(),
        signature: signature.into(),
        // Go writes basic constraints critical for a CA.
        ca: (true, true),
        key_usage: (true, true, true, false),
        eku: (true, true, false),
        // CAValidityTime: 87600 hours.
        hours: 87_600,
        ski: true,
        key_label: label.into(),
    }
}

fn bundle_cas(
    b: &plinth::talos::secrets::SecretsBundle,
) -> Vec<(&'static str, &plinth::talos::secrets::CertAndKey)> {
    let c = &b.certs;
    vec![
        ("etcd", &c.etcd),
        ("k8s", &c.k8s),
        ("k8saggregator", &c.k8saggregator),
        ("os", &c.os),
    ]
}

fn init_bundle(dir: &std::path::Path, version: &str) -> plinth::talos::secrets::SecretsBundle {
    let out = dir.join(format!("secrets-{version}.yaml"));
    let st = Command::new(BIN)
        .args([
            "cluster",
            "init",
            "prod",
            "--endpoint",
            "https://10.0.0.10:6443",
        ])
        .args(["--talos-version", version, "--out"])
        .arg(&out)
        .output()
        .expect("run");
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    plinth::talos::secrets::SecretsBundle::parse(&std::fs::read_to_string(&out).expect("read"))
        .expect("parses")
}

#[test]
fn bundle_matches_what_talosctl_gen_secrets_writes() {
    let dir = tempfile::tempdir().expect("tmp");
    let b64 = base64::engine::general_purpose::STANDARD;
    let url = base64::engine::general_purpose::URL_SAFE;
    let talos_data = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/talos/configs/secrets.yaml");
    let talos = std::fs::read_to_string(&talos_data)
        .ok()
        .map(|t| plinth::talos::secrets::SecretsBundle::parse(&t).expect("Talos' bundle loads"));

    for version in ["v1.11.6", "v1.13.9", "v1.14.0-rc.1"] {
        let b = init_bundle(dir.path(), version);
        for (name, ck) in bundle_cas(&b) {
            let (_, subject, key, sig, label) =
                TALOS_CAS.iter().find(|c| c.0 == name).expect("listed");
            let got = ca_shape(ck.crt.as_deref().expect("crt"), &ck.key);
            assert_eq!(
                got,
                expected_shape(subject, key, sig, label),
                "{version} {name}"
            );
        }
        // UseRSAServiceAccountKey (Talos > 1.6): RSA, 4096 bits (siderolabs/crypto's default),
        // PKCS#1.
        let sa = String::from_utf8(b64.decode(&b.certs.k8sserviceaccount.key).expect("b64"))
            .expect("utf8");
        assert!(
            sa.starts_with("-----BEGIN RSA PRIVATE KEY-----"),
            "{version}"
        );
        use rsa::pkcs1::DecodeRsaPrivateKey;
        use rsa::traits::PublicKeyParts;
        let key = rsa::RsaPrivateKey::from_pkcs1_pem(&sa).expect("PKCS#1");
        assert_eq!(key.size() * 8, 4096, "{version}");
        assert!(b.certs.k8sserviceaccount.crt.is_none());
        // ClusterIDEncoding: URL-safe base64 before 1.14, standard from 1.14; 32 bytes.
        let id_engine = if version.starts_with("v1.14") {
            &b64
        } else {
            &url
        };
        assert_eq!(
            id_engine.decode(&b.cluster.id).expect("id").len(),
            32,
            "{version}"
        );
        assert_eq!(b64.decode(&b.cluster.secret).expect("secret").len(), 32);
        assert_eq!(
            b64.decode(&b.secrets.secretboxencryptionsecret)
                .expect("sb")
                .len(),
            32
        );
        assert!(b.secrets.aescbcencryptionsecret.is_empty());

        if let Some(t) = &talos {
            // Talos' own bundle: every CA has the shape Plinth's has.
            for ((name, theirs), (_, ours)) in bundle_cas(t).into_iter().zip(bundle_cas(&b)) {
                assert_eq!(
                    ca_shape(ours.crt.as_deref().expect("crt"), &ours.key),
                    ca_shape(theirs.crt.as_deref().expect("crt"), &theirs.key),
                    "{version} {name} against Talos' test data"
                );
            }
            // Its cluster id is URL-safe base64 (written before 1.14).
            assert_eq!(url.decode(&t.cluster.id).expect("id").len(), 32);
        }
    }

    // Before 1.7 the service-account key was ECDSA P-256 (SEC1), as in Talos' test data, which
    // was generated then; Plinth writes the same for such a release.
    let b16 = init_bundle(dir.path(), "v1.6.7");
    let sa16 = String::from_utf8(b64.decode(&b16.certs.k8sserviceaccount.key).expect("b64"))
        .expect("utf8");
    assert!(sa16.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    if let Some(t) = &talos {
        let theirs = String::from_utf8(b64.decode(&t.certs.k8sserviceaccount.key).expect("b64"))
            .expect("utf8");
        assert!(theirs.starts_with("-----BEGIN EC PRIVATE KEY-----"));
        assert_eq!(theirs.len(), sa16.len(), "same SEC1 shape");
    }
}

/// Bundles stored before the service-account key became RSA (an ECDSA key, a standard-base64
/// cluster id) and Talos' own bundle still load and render configs.
#[test]
fn older_bundles_keep_loading_and_rendering() {
    use plinth::talos::generate::{generate, GenerateOptions};
    let mut bundles = Vec::new();
    // A bundle as Plinth wrote it before: ECDSA service-account key, standard-base64 id.
    let mut old = plinth::talos::secrets::SecretsBundle::generate_for("v1.6.0".parse().expect("v"))
        .expect("bundle");
    old.cluster.id = base64::engine::general_purpose::STANDARD.encode([0xfbu8; 32]);
    bundles.push(("old Plinth", old.to_yaml().expect("yaml")));
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/talos/configs/secrets.yaml");
    if let Ok(t) = std::fs::read_to_string(shared) {
        bundles.push(("Talos test data", t));
    }
    for (what, text) in bundles {
        let b = plinth::talos::secrets::SecretsBundle::parse(&text).expect(what);
        for version in ["v1.11.6", "v1.13.9"] {
            let o = GenerateOptions::new(
                "prod",
                "https://10.0.0.10:6443",
                version.parse().expect("v"),
            );
            let cp = generate(&b, plinth::domain::Role::ControlPlane, &o).expect(what);
            let doc = cp.v1alpha1().expect("v1alpha1");
            assert_eq!(
                doc["cluster"]["serviceAccount"]["key"].as_str(),
                Some(b.certs.k8sserviceaccount.key.as_str()),
                "{what} {version}"
            );
            assert_eq!(doc["cluster"]["id"].as_str(), Some(b.cluster.id.as_str()));
        }
    }
}
