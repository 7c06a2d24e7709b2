//! Which values of a Talos machine config are secret, wherever they sit (the v1alpha1 document or
//! a document of its own such as `WireguardConfig`): the keys Talos itself redacts (the machine
//! token and CA key, the cluster secret, bootstrap token, encryption secrets, service-account and
//! CA keys) and the credentials of its other settings (registry auth `password`, `auth` and
//! `identityToken`, a TLS client identity's `key`, WireGuard `privateKey` and peers'
//! `presharedKey`, VIP providers' `apiToken`, disk encryption `passphrase`). A secret is a scalar
//! under one of these keys; a mapping under `auth` (registry auth) is a parent, not a value.
//!
//! Pure data; imports nothing of the crate.

/// Mapping keys whose scalar values are secret.
pub const SECRET_KEYS: &[&str] = &[
    "key",
    "token",
    "secret",
    "bootstrapToken",
    "aescbcEncryptionSecret",
    "secretboxEncryptionSecret",
    "privateKey",
    "presharedKey",
    "password",
    "auth",
    "identityToken",
    "apiToken",
    "passphrase",
];

/// Is a scalar under mapping key `key` secret?
pub fn is_secret_key(key: &str) -> bool {
    SECRET_KEYS.contains(&key)
}

/// Does an RFC 6902 operation's `path` (`/machine/network/...`) end at a secret key?
pub fn is_secret_pointer(path: &str) -> bool {
    path.rsplit('/').next().is_some_and(is_secret_key)
}

/// Replace every secret scalar of a block-style YAML text (the configs Plinth renders) by
/// `mask(value)`, line by line (`key: value` and `- key: value`). Empty values and parents
/// (`auth:` with nothing after it) are left alone. Patches are never shown this way: they are
/// sealed whole at rest, and only rendered configs are diffed.
pub fn mask_lines(text: &str, mask: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let trimmed = line.trim_start();
        let body = trimmed.strip_prefix("- ").unwrap_or(trimmed);
        let masked = SECRET_KEYS.iter().find_map(|k| {
            let rest = body.strip_prefix(k)?.strip_prefix(':')?;
            let v = rest.trim();
            let empty =
                v.is_empty() || v == "\"\"" || v == "''" || v == "{}" || v == "|" || v == ">";
            (!empty && !v.starts_with('#')).then(|| {
                let prefix = &line[..line.len() - body.len()];
                format!("{prefix}{k}: {}", mask(v))
            })
        });
        out.push_str(masked.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_scalars_are_masked_parents_are_not() {
        let text = "apiVersion: v1alpha1\nkind: WireguardConfig\nprivateKey: c2VjcmV0\npeers:\n  - publicKey: pub\n    presharedKey: psk\nmachine:\n  registries:\n    config:\n      r.example:\n        auth:\n          username: u\n          password: hunter2\n";
        let m = mask_lines(text, |_| "<x>".into());
        assert!(m.contains("privateKey: <x>"), "{m}");
        assert!(m.contains("    presharedKey: <x>"), "{m}");
        assert!(m.contains("password: <x>") && !m.contains("hunter2"), "{m}");
        assert!(m.contains("        auth:\n"), "a parent stays: {m}");
        assert!(
            m.contains("publicKey: pub") && m.contains("username: u"),
            "{m}"
        );
        assert!(is_secret_pointer(
            "/machine/registries/config/r/auth/password"
        ));
        assert!(!is_secret_pointer("/machine/network/hostname"));
    }
}
