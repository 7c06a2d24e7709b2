//! Config diffs that show a secret changed without showing it: `redact` replaces secret values
//! by a short fingerprint, `config_diff` is a unified diff of two redacted configs.

use super::sha256_hex;

/// Replace secret values in a rendered config by a short fingerprint, so a diff shows that a
/// secret changed without showing it.
pub fn redact(yaml: &str) -> String {
    const SECRET_KEYS: &[&str] = &[
        "key",
        "token",
        "secret",
        "secretboxEncryptionSecret",
        "aescbcEncryptionSecret",
        "bootstrapToken",
    ];
    let mut out = String::with_capacity(yaml.len());
    for line in yaml.lines() {
        let trimmed = line.trim_start();
        let redacted = SECRET_KEYS.iter().find_map(|k| {
            let rest = trimmed.strip_prefix(k)?.strip_prefix(':')?;
            let v = rest.trim();
            (!v.is_empty() && v != "\"\"" && v != "''").then(|| {
                let indent = &line[..line.len() - trimmed.len()];
                format!(
                    "{indent}{k}: <redacted sha256:{}>",
                    &sha256_hex(v.as_bytes())[..12]
                )
            })
        });
        out.push_str(redacted.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
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
    }
}
