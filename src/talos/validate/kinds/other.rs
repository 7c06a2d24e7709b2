//! `Validate()` of the runtime, SideroLink, security and CRI documents
//! (`pkg/machinery/config/types/{runtime,siderolink,security,cri}/*.go`). Several of Talos'
//! validators here stop at their first problem; the ports do the same (`return`).

use serde_yaml_ng::Value;

use super::{go_duration, negative_duration, Ctx, Doc, KindRule, NOW};
use crate::talos::validate::cel::CelEnv;
use crate::talos::validate::x509;

pub(super) const KINDS: &[KindRule] = &[
    (
        "EventSinkConfig",
        11,
        NOW,
        "pkg/machinery/config/types/runtime/event_sink.go",
        event_sink,
    ),
    (
        "KmsgLogConfig",
        11,
        NOW,
        "pkg/machinery/config/types/runtime/kmsg_log.go",
        kmsg_log,
    ),
    (
        "WatchdogTimerConfig",
        11,
        NOW,
        "pkg/machinery/config/types/runtime/watchdog_timer.go",
        watchdog,
    ),
    (
        "ExtensionServiceConfig",
        11,
        NOW,
        "pkg/machinery/config/types/runtime/extensions/service_config.go",
        extension_service,
    ),
    (
        "OOMConfig",
        12,
        NOW,
        "pkg/machinery/config/types/runtime/oom.go",
        oom,
    ),
    (
        "EnvironmentConfig",
        13,
        NOW,
        "pkg/machinery/config/types/runtime/environment.go",
        environment,
    ),
    (
        "EtcFileConfig",
        14,
        NOW,
        "pkg/machinery/config/types/runtime/etc_file.go",
        etc_file,
    ),
    (
        "KernelModuleConfig",
        14,
        NOW,
        "pkg/machinery/config/types/runtime/kernel_module.go",
        kernel_module,
    ),
    (
        "SysctlConfig",
        14,
        NOW,
        "pkg/machinery/config/types/runtime/sysctl.go",
        sysctl,
    ),
    (
        "SysfsConfig",
        14,
        NOW,
        "pkg/machinery/config/types/runtime/sysfs.go",
        sysfs,
    ),
    (
        "UnattendedInstallConfig",
        14,
        NOW,
        "pkg/machinery/config/types/runtime/unattended_install.go",
        unattended_install,
    ),
    (
        "SideroLinkConfig",
        11,
        NOW,
        "pkg/machinery/config/types/siderolink/siderolink.go",
        siderolink,
    ),
    (
        "ImageVerificationConfig",
        13,
        NOW,
        "pkg/machinery/config/types/security/image_verification.go",
        image_verification,
    ),
    (
        "RegistryMirrorConfig",
        12,
        NOW,
        "pkg/machinery/config/types/cri/registry_mirror.go",
        registry_mirror,
    ),
    (
        "RegistryAuthConfig",
        12,
        NOW,
        "pkg/machinery/config/types/cri/registry_auth.go",
        registry_auth,
    ),
    (
        "RegistryTLSConfig",
        12,
        NOW,
        "pkg/machinery/config/types/cri/registry_tls.go",
        registry_tls,
    ),
    (
        "CRIBaseRuntimeSpecConfig",
        14,
        NOW,
        "pkg/machinery/config/types/cri/base_runtime_spec.go",
        cri_base_runtime_spec,
    ),
];

/// The overrides must decode into an OCI runtime spec as Go's `encoding/json` does.
fn cri_base_runtime_spec(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    use crate::talos::validate::oci::{decode_spec, SpecVersion};
    let Some(o) = d.at("overrides").filter(|o| o.is_mapping()) else {
        return;
    };
    if let Err(e) = decode_spec(o, SpecVersion::of(ctx.version)) {
        let what = if e.marshal { "marshal" } else { "unmarshal" };
        d.err(
            &format!("overrides.{}", e.path),
            format!(
                "failed to {what} base runtime spec overrides: {}",
                e.message
            ),
        );
    }
}

/// `host:port` as Go's `net.SplitHostPort` takes it.
fn split_host_port(s: &str) -> Result<(), &'static str> {
    if let Some(rest) = s.strip_prefix('[') {
        let (_, after) = rest.split_once(']').ok_or("missing ']' in address")?;
        return match after.strip_prefix(':') {
            Some(p) if !p.contains(':') => Ok(()),
            Some(_) => Err("too many colons in address"),
            None => Err("missing port in address"),
        };
    }
    match s.matches(':').count() {
        0 => Err("missing port in address"),
        1 => Ok(()),
        _ => Err("too many colons in address"),
    }
}

fn event_sink(d: &mut Doc<'_, '_>, _: &Ctx) {
    let ep = d.text("endpoint");
    if let Err(e) = split_host_port(ep) {
        d.err(
            "endpoint",
            format!("event sink endpoint: address {ep}: {e}"),
        );
    }
}

fn kmsg_log(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.name().is_empty() {
        return d.err("name", "name is required");
    }
    let u = d.text("url");
    if u.is_empty() {
        return d.err("url", "url is required");
    }
    let Ok(parsed) = url::Url::parse(u) else {
        return d.err("url", format!("url {u:?} does not parse"));
    };
    if !matches!(parsed.scheme(), "tcp" | "udp") {
        return d.err("url", "url scheme must be tcp:// or udp://");
    }
    if !matches!(parsed.path(), "" | "/") {
        return d.err("url", "url path must be empty");
    }
    if parsed.port().is_none() {
        d.err("url", "url port is required");
    }
}

fn watchdog(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.text("device").is_empty() {
        return d.err("device", "watchdog device: empty value");
    }
    if let Some(t) = d.at("timeout").and_then(go_duration) {
        if t != 0 && t < 10_000_000_000 {
            d.err("timeout", "watchdog timeout: minimum value is 10s");
        }
    }
}

fn extension_service(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    if name.is_empty() {
        return d.err("name", "name is required");
    }
    let files = d.items("configFiles");
    if files.is_empty() && !d.set("environment") {
        return d.err(
            "configFiles",
            format!("no config files found for extension {name:?}"),
        );
    }
    for (i, f) in files.iter().enumerate() {
        let field = |k: &str| f.get(k).and_then(Value::as_str).unwrap_or("").is_empty();
        if field("content") {
            return d.err(
                &format!("configFiles[{i}].content"),
                format!("extension content is required for extension {name:?}"),
            );
        }
        if field("mountPath") {
            return d.err(
                &format!("configFiles[{i}].mountPath"),
                format!("extension mount path is required for extension {name:?}"),
            );
        }
    }
}

fn oom(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    use crate::talos::validate::cel::{check_bool, check_double};
    let trigger = d.text("triggerExpression");
    if !trigger.is_empty() {
        if let Err(e) = check_bool(trigger, CelEnv::OomTrigger, ctx.version) {
            d.err(
                "triggerExpression",
                format!("OOM trigger expression is invalid: {e}"),
            );
        }
    }
    let rank = d.text("cgroupRankingExpression");
    if !rank.is_empty() {
        if let Err(e) = check_double(rank, CelEnv::OomScoring, ctx.version) {
            d.err(
                "cgroupRankingExpression",
                format!("OOM cgroup scoring expression is invalid: {e}"),
            );
        }
    }
    if negative_duration(d, "sampleInterval") {
        d.err(
            "sampleInterval",
            "OOM sample interval must be longer than 0",
        );
    }
}

fn environment(d: &mut Doc<'_, '_>, _: &Ctx) {
    let Some(vars) = d.at("variables").and_then(Value::as_mapping) else {
        return;
    };
    for key in vars.keys() {
        let k = crate::talos::scalar_text(key).unwrap_or_default();
        let mut chars = k.chars();
        let ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            d.err(
                &format!("variables.{k}"),
                format!("invalid environment variable name: {k:?}"),
            );
        }
    }
}

const MANAGED_ETC_FILES: &[&str] = &[
    "resolv.conf",
    "hosts",
    "machine-id",
    "extensions.yaml",
    "localtime",
    "os-release",
    "xattr.conf",
];

const MANAGED_ETC_DIRS: &[&str] = &[
    "apparmor.d/",
    "apparmor/",
    "ca-certificates/",
    "cni/",
    "cri/",
    "iscsi/",
    "kubernetes/",
    "lvm/",
    "nvme/",
    "pki/",
    "selinux/",
    "ssl/",
];

/// Go's `filepath.IsLocal` on Unix: relative, not empty, and never climbing out with `..`.
fn is_local(p: &str) -> bool {
    if p.is_empty() || p.starts_with('/') {
        return false;
    }
    let mut depth: i32 = 0;
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => depth += 1,
        }
    }
    true
}

fn etc_file(d: &mut Doc<'_, '_>, _: &Ctx) {
    let name = d.name();
    if name.is_empty() {
        return d.err("name", "user etc file name cannot be empty");
    }
    if !is_local(name) || name.starts_with('.') {
        return d.err(
            "name",
            format!("user etc file {name:?} must be a local path"),
        );
    }
    let managed = MANAGED_ETC_FILES.contains(&name)
        || MANAGED_ETC_DIRS
            .iter()
            .any(|p| name == p.trim_end_matches('/') || name.starts_with(p));
    if managed {
        d.err(
            "name",
            format!("user etc file {name:?} is managed by Talos"),
        );
    }
}

fn kernel_module(d: &mut Doc<'_, '_>, _: &Ctx) {
    if d.name().is_empty() {
        d.err("name", "name is required");
    }
}

fn params_keys(d: &mut Doc<'_, '_>, what: &str) {
    let empty = d.at("params").and_then(Value::as_mapping).is_some_and(|m| {
        m.keys()
            .any(|k| crate::talos::scalar_text(k).is_none_or(|s| s.is_empty()))
    });
    if empty {
        d.err("params", format!("{what} key cannot be empty"));
    }
}

fn sysctl(d: &mut Doc<'_, '_>, _: &Ctx) {
    params_keys(d, "sysctl");
}

fn sysfs(d: &mut Doc<'_, '_>, _: &Ctx) {
    params_keys(d, "sysfs");
}

fn unattended_install(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    if d.text("installer.image").is_empty() {
        d.warn(
            "installer.image",
            "installer.image is not set: unless Talos booted from an Image Factory asset, installation will fail",
        );
    }
    if !d.cel(
        ctx,
        "provisioning.diskSelector.match",
        CelEnv::Disk,
        "provisioning.diskSelector.match",
    ) {
        d.err(
            "provisioning.diskSelector.match",
            "provisioning.volumeSelector.match is required (an install disk selector in CEL)",
        );
    }
}

fn siderolink(d: &mut Doc<'_, '_>, _: &Ctx) {
    let u = d.text("apiUrl");
    if u.is_empty() {
        return d.err("apiUrl", "apiUrl is required");
    }
    let Ok(parsed) = url::Url::parse(u) else {
        return d.err("apiUrl", format!("apiUrl {u:?} does not parse"));
    };
    if !matches!(parsed.scheme(), "https" | "grpc") {
        return d.err("apiUrl", "apiUrl scheme must be https:// or grpc://");
    }
    if !matches!(parsed.path(), "" | "/") {
        d.err("apiUrl", "apiUrl path must be empty");
    }
}

fn image_verification(d: &mut Doc<'_, '_>, _: &Ctx) {
    for (i, rule) in d.items("rules").iter().enumerate() {
        let base = format!("rules[{i}]");
        let pattern = rule.get("image").and_then(Value::as_str).unwrap_or("");
        if pattern.is_empty() {
            d.err(
                &format!("{base}.image"),
                format!("rule {i}: imagePattern must be specified"),
            );
        }
        if pattern.contains('@') {
            d.warn(
                &format!("{base}.image"),
                format!("rule {i}: imagePattern contains '@' but matching only applies to the image registry and repository, not the tag or digest"),
            );
        }
        if pattern
            .split_once('/')
            .is_some_and(|(_, repo)| repo.contains(':'))
        {
            d.warn(
                &format!("{base}.image"),
                format!("rule {i}: imagePattern contains ':' but matching only applies to the image registry and repository, not the tag or digest"),
            );
        }
        if !pattern.contains('/') && pattern != "*" && !pattern.is_empty() {
            d.warn(
                &format!("{base}.image"),
                format!("rule {i}: imagePattern has no '/': a reference like 'nginx' is matched as 'docker.io/nginx'"),
            );
        }
        let flag = |k: &str| rule.get(k).and_then(Value::as_bool) == Some(true);
        let has = |k: &str| rule.get(k).is_some_and(|v| !v.is_null());
        let (skip, deny) = (flag("skip"), flag("deny"));
        let (keyless, public) = (has("keyless"), has("publicKey"));
        if skip && deny {
            d.err(
                &base,
                format!("rule {i}: skip and deny cannot both be true"),
            );
        }
        if (skip || deny) && (keyless || public) {
            d.err(
                &base,
                format!("rule {i}: verifiers cannot be configured if skip or deny is true"),
            );
        }
        if !skip && !deny && !keyless && !public {
            d.err(
                &base,
                format!("rule {i}: at least one verifier must be configured"),
            );
        }
        if keyless && public {
            d.err(
                &base,
                format!("rule {i}: only one of keyless or publicKey verifier can be configured"),
            );
        }
        if keyless {
            let k = |f: &str| {
                rule.get("keyless")
                    .and_then(|v| v.get(f))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
            };
            if k("issuer") {
                d.err(
                    &format!("{base}.keyless.issuer"),
                    format!("rule {i}: verifier OIDC issuer must be specified"),
                );
            }
            if k("subject") && k("subjectRegex") {
                d.err(
                    &format!("{base}.keyless"),
                    format!("rule {i}: verifier subject or subjectRegex must be specified"),
                );
            }
        }
        if public
            && rule
                .get("publicKey")
                .and_then(|v| v.get("certificate"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
        {
            d.err(
                &format!("{base}.publicKey.certificate"),
                format!("rule {i}: verifier certificates must be specified"),
            );
        }
    }
}

fn registry_mirror(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    for (i, ep) in d.items("endpoints").iter().enumerate() {
        let path = format!("endpoints[{i}].url");
        match ep.get("url").and_then(Value::as_str) {
            None | Some("") => d.err(&path, format!("endpoints[{i}].url must be specified")),
            Some(u) => {
                let scheme = u.split_once("://").map_or("", |(s, _)| s);
                if !matches!(scheme, "http" | "https") {
                    d.err(
                        &path,
                        format!("endpoints[{i}].url has unsupported scheme: {scheme:?}"),
                    );
                }
            }
        }
    }
}

fn registry_auth(d: &mut Doc<'_, '_>, _: &Ctx) {
    d.require_name("name must be specified");
    let user = d.set("username");
    let token = d.set("identityToken");
    let auth = d.set("auth");
    if user && token {
        d.err(
            "identityToken",
            "only one of username/password or identityToken authentication can be specified",
        );
    }
    if auth && (user || token) {
        d.err(
            "auth",
            "only one of auth, username/password or identityToken authentication can be specified",
        );
    }
}

fn registry_tls(d: &mut Doc<'_, '_>, ctx: &Ctx) {
    d.require_name("name must be specified");
    let ca = d.text("ca");
    if !ca.is_empty() && !x509::append_certs_from_pem(ca) {
        d.err("ca", "ca must be a valid PEM-encoded certificate");
    }
    // `clientIdentity` is a meta.CertificateAndKey (`cert` and `key`, PEM text) in every release
    // that has the document; 1.14 checks the PEM blocks (`Validate(false)`), 1.12 and 1.13 parse
    // the certificate and a PKCS#8 key (siderolabs/crypto `GetCert`, `GetPrivateKey`).
    if d.at("clientIdentity").is_none() {
        return;
    }
    let crt = d.text("clientIdentity.cert");
    let key = d.text("clientIdentity.key");
    if ctx.minor() >= 14 {
        let problem = if crt.is_empty() {
            Some(("clientIdentity.cert", "certificate is required".to_string()))
        } else if key.is_empty() {
            Some(("clientIdentity.key", "key is required".to_string()))
        } else if let Err(e) = x509::assert_valid_pem(crt, &["CERTIFICATE"]) {
            Some(("clientIdentity.cert", format!("certificate: {e}")))
        } else if let Err(e) = x509::assert_valid_pem(key, &[]) {
            Some(("clientIdentity.key", format!("key: {e}")))
        } else {
            None
        };
        if let Some((path, message)) = problem {
            d.err(path, format!("client identity: {message}"));
        }
        return;
    }
    if let Err(e) = x509::get_cert(crt) {
        d.err(
            "clientIdentity.cert",
            format!("client identity certificate is invalid: {e}"),
        );
    }
    if let Err(e) = x509::get_key(key, x509::KeyReader::Pkcs8) {
        d.err(
            "clientIdentity.key",
            format!("client identity key is invalid: {e}"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ports() {
        assert!(split_host_port("10.0.0.1:4000").is_ok());
        assert!(split_host_port("[fd00::1]:4000").is_ok());
        assert!(split_host_port("10.0.0.1").is_err());
        assert!(split_host_port("fd00::1:4000").is_err());
    }

    #[test]
    fn local_paths() {
        assert!(is_local("a/b"));
        assert!(!is_local("/a"));
        assert!(!is_local("../a"));
        assert!(!is_local(""));
    }
}
