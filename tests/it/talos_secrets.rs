//! `plinth cluster init` output parsed back and its certificates checked with openssl: key types, CA
//! flags, key usage, validity, and that every key belongs to its certificate.

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
        &bundle.cluster.id,
        &bundle.cluster.secret,
        &bundle.secrets.secretboxencryptionsecret,
    ] {
        assert_eq!(b64.decode(v).expect("b64").len(), 32);
    }
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
    let sa = dir.path().join("sa.key");
    std::fs::write(&sa, b64.decode(&c.k8sserviceaccount.key).expect("b64")).expect("w");
    let text = openssl(&["ec", "-noout", "-text"], &sa);
    assert!(
        text.contains("NIST CURVE: P-256") || text.contains("prime256v1"),
        "{text}"
    );
}
