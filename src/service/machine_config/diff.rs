//! Config diffs that show a secret changed without showing it: `redact` replaces secret values
//! by a short fingerprint, `config_diff` is a unified diff of two redacted configs.

use super::sha256_hex;

/// Replace secret values in a rendered config (every key `talos::secret_fields` names: the
/// cluster's keys and tokens, and the credentials patches bring, such as a WireGuard `privateKey`
/// or a registry `password`) by a short fingerprint, so a diff shows that a secret changed
/// without showing it.
pub fn redact(yaml: &str) -> String {
    crate::talos::secret_fields::mask_lines(yaml, |v| {
        format!("<redacted sha256:{}>", &sha256_hex(v.as_bytes())[..12])
    })
}

/// A unified diff of two configs, secrets redacted; empty when they are equal.
pub fn config_diff(before: Option<&str>, after: Option<&str>, label: &str) -> String {
    let a = before.map(redact).unwrap_or_default();
    let b = after.map(redact).unwrap_or_default();
    if a == b {
        return String::new();
    }
    similar::TextDiff::from_lines(&a, &b)
        .unified_diff()
        .context_radius(3)
        .header(&format!("{label} (before)"), &format!("{label} (after)"))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_values_but_shows_changes() {
        let a = "machine:\n    token: abc.def\n    ca:\n        crt: CERT\n        key: SECRET1\n";
        let b = "machine:\n    token: abc.def\n    ca:\n        crt: CERT\n        key: SECRET2\n";
        let ra = redact(a);
        assert!(!ra.contains("SECRET1") && !ra.contains("abc.def"), "{ra}");
        assert!(ra.contains("crt: CERT"));
        let d = config_diff(Some(a), Some(b), "m1");
        assert!(d.contains("-        key: <redacted sha256:"), "{d}");
        assert!(!d.contains("SECRET"), "{d}");
        assert_eq!(config_diff(Some(a), Some(a), "m1"), "");
        let wg = "kind: WireguardConfig\nprivateKey: WGSECRET\n---\nmachine:\n  registries:\n    config:\n      r:\n        auth:\n          password: REGSECRET\n";
        let r = redact(wg);
        assert!(!r.contains("WGSECRET") && !r.contains("REGSECRET"), "{r}");
    }
}
