//! Talos' own kernel arguments for a release, as Talos builds them for its boot assets
//! (`DefaultArgs` in `pkg/machinery/kernel/kernel.go` and the version quirks of
//! `pkg/machinery/imager/quirks/quirks.go`, read at v1.11.6, v1.12.11, v1.13.9 and
//! v1.14.0-rc.1), and the PXE kernel line Image Factory serves for a schematic ([`pxe_args`]):
//! the PXE kernel line Plinth writes starts with it. Pure data; imports nothing outside
//! `crate::talos` and `crate::domain`.

use super::TalosVersion;
use crate::domain::dhcp::Arch;

/// A kernel command line as Talos' imager keeps it while building one (`procfs.Cmdline` of
/// siderolabs/go-procfs): each key once, in the order first seen, with all its values; a key
/// seen again gains a value in its first place.
#[derive(Debug, Default)]
struct Cmdline(Vec<(String, Vec<String>)>);

impl Cmdline {
    /// Words as the kernel splits them, grouped by key (`a=1 b a=2` -> `a: [1, 2], b: [""]`).
    fn parse(args: &[String]) -> Vec<(String, Vec<String>)> {
        let mut out = Cmdline::default();
        for word in args.iter().flat_map(|a| a.split_whitespace()) {
            let (k, v) = word.split_once('=').unwrap_or((word, ""));
            out.append(k, v);
        }
        out.0
    }

    fn append(&mut self, key: &str, value: &str) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, values)) => values.push(value.to_string()),
            None => self.0.push((key.to_string(), vec![value.to_string()])),
        }
    }

    /// Replace the key's values where it stands, or add it at the end.
    fn set(&mut self, key: String, values: Vec<String>) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, old)) => *old = values,
            None => self.0.push((key, values)),
        }
    }

    /// `AppendAll`: each key of `args` adds its values, except keys in `overwrite`, which replace
    /// the key's values; with `delete_negated`, `-key` removes the key and `-key=value` that value.
    fn append_all(&mut self, args: &[String], overwrite: &[&str], delete_negated: bool) {
        for (key, values) in Cmdline::parse(args) {
            if delete_negated && key.len() > 1 && key.starts_with('-') {
                let target = &key[1..];
                match values.first().map(String::as_str) {
                    Some("") | None => self.0.retain(|(k, _)| k != target),
                    Some(_) => {
                        if let Some((_, old)) = self.0.iter_mut().find(|(k, _)| k == target) {
                            old.retain(|v| !values.contains(v));
                        }
                    }
                }
                continue;
            }
            if overwrite.contains(&key.as_str()) {
                self.set(key, values);
                continue;
            }
            for v in &values {
                self.append(&key, v);
            }
        }
    }

    /// One word per value: `key=value`, or the bare key for an empty value.
    fn words(&self) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|(k, values)| {
                values.iter().map(move |v| {
                    if v.is_empty() {
                        k.clone()
                    } else {
                        format!("{k}={v}")
                    }
                })
            })
            .collect()
    }
}

/// The console the metal platform puts on the kernel line (`KernelArgs` of Talos' metal platform,
/// `internal/app/machined/pkg/runtime/v1alpha1/platform/metal/metal.go`): `tty0` on x86-64
/// (`ttyS0 tty0` only before 1.8), `ttyAMA0 tty0` on ARM64.
fn metal_console(version: TalosVersion, arch: Arch) -> Vec<&'static str> {
    match arch {
        Arch::Amd64 if version < TalosVersion::new(1, 8, 0) => vec!["ttyS0", "tty0"],
        Arch::Amd64 => vec!["tty0"],
        Arch::Arm64 => vec!["ttyAMA0", "tty0"],
    }
}

/// The kernel arguments of the PXE line Image Factory serves for Talos `version` on `arch`
/// with a schematic whose `customization.extraKernelArgs` are `schematic_args`, as Talos'
/// imager builds a `cmdline-metal-<arch>` asset (`buildCmdline` in `pkg/imager/imager.go`, the
/// same from v1.11.6 to v1.14.0-rc.1): `talos.platform=metal`, the platform's console, Talos'
/// default arguments ([`default_args`]), then the schematic's arguments, where a `console` or
/// `talos.platform` argument replaces the earlier ones and `-key` / `-key=value` removes them.
/// Pass the schematic's part as [`schematic_line_args`] gives it: its META values as Image
/// Factory writes them (one `talos.environment` argument, added before the extra arguments),
/// then its extra arguments.
pub fn pxe_args(version: TalosVersion, arch: Arch, schematic_args: &[String]) -> Vec<String> {
    let mut line = Cmdline::default();
    line.append("talos.platform", "metal");
    line.set(
        "console".into(),
        metal_console(version, arch)
            .into_iter()
            .map(str::to_string)
            .collect(),
    );
    let defaults: Vec<String> = default_args(version)
        .into_iter()
        .map(str::to_string)
        .collect();
    line.append_all(&defaults, &[], false);
    line.append_all(schematic_args, &["console", "talos.platform"], true);
    line.words()
}

/// The schematic's arguments of the PXE line, in the order Talos' imager adds them after its
/// defaults (`buildCmdline` in `pkg/imager/imager.go`): the META values as one
/// `talos.environment=INSTALLER_META_BASE64=<value>` ([`meta_environment`]), which Talos'
/// installer writes to the META partition, then `customization.extraKernelArgs`. Image Factory
/// puts both on every `cmdline-<platform>-<arch>` asset, which is what its PXE script boots
/// (`setKernelArgsAndMeta` in image-factory's `internal/profile/profile.go`). Given to
/// [`pxe_args`] as one list this is the same line: the META argument is neither negated nor
/// one that overwrites.
pub fn schematic_line_args(
    version: TalosVersion,
    meta: &[super::schematic::MetaValue],
    extra_kernel_args: &[String],
) -> Vec<String> {
    let mut out = Vec::with_capacity(extra_kernel_args.len() + 1);
    if !meta.is_empty() {
        out.push(format!(
            "talos.environment=INSTALLER_META_BASE64={}",
            meta_environment(version, meta)
        ));
    }
    out.extend(extra_kernel_args.iter().cloned());
    out
}

/// META values encoded for the installer's environment as Talos does (`Values.Encode` in
/// `pkg/machinery/meta/meta.go`): `0x<key in hex>=<value>` joined by `;`, gzip-compressed at the
/// best level when that text is longer than 256 bytes and the release reads compressed META
/// (`SupportsCompressedEncodedMETA`: 1.6.3 and later), then standard base64. The gzip stream is
/// flate2's, not Go's: the bytes differ from Image Factory's, what they decode to does not (the
/// installer only looks for the gzip magic and inflates).
pub fn meta_environment(version: TalosVersion, meta: &[super::schematic::MetaValue]) -> String {
    use base64::Engine;
    use std::io::Write;
    let raw = meta
        .iter()
        .map(|m| format!("0x{:x}={}", m.key, m.value))
        .collect::<Vec<_>>()
        .join(";")
        .into_bytes();
    let gzip_ok = version >= TalosVersion::new(1, 6, 3);
    let bytes = if gzip_ok && raw.len() > 256 {
        // Go's gzip writer: no name, no modification time, XFL 2 (best), OS 255 (unknown).
        let mut gz = flate2::GzBuilder::new()
            .operating_system(255)
            .write(Vec::new(), flate2::Compression::best());
        // Writing to a Vec cannot fail.
        match gz.write_all(&raw).and_then(|()| gz.finish()) {
            Ok(compressed) => compressed,
            Err(_) => raw,
        }
    } else {
        raw
    };
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The default kernel arguments of Talos `version` on bare metal, in Talos' order. An argument
/// Talos writes with an empty value (`slab_nomerge=`) is written bare, as the kernel reads it.
///
/// - `init_on_alloc=1`: up to 1.13 (dropped from the arguments in 1.14);
/// - `slab_nomerge`, `pti=on`, `consoleblank=0`, `printk.devkmsg=on`: every release;
/// - `nvme_core.io_timeout=4294967295`: up to 1.13 (AWS only from 1.14, so not on metal);
/// - IMA arguments: up to 1.10 only, so never here;
/// - `selinux=1`: 1.10 and later;
/// - `module.sig_enforce=1`: 1.12 and later;
/// - `proc_mem.force_override=never`: 1.13 and later.
pub fn default_args(version: TalosVersion) -> Vec<&'static str> {
    let at_least = |minor: u32| version >= TalosVersion::new(1, minor, 0);
    let mut args = Vec::new();
    if !at_least(14) {
        args.push("init_on_alloc=1");
    }
    args.extend(["slab_nomerge", "pti=on", "consoleblank=0"]);
    if !at_least(14) {
        args.push("nvme_core.io_timeout=4294967295");
    }
    args.push("printk.devkmsg=on");
    if at_least(10) {
        args.push("selinux=1");
    }
    if at_least(12) {
        args.push("module.sig_enforce=1");
    }
    if at_least(13) {
        args.push("proc_mem.force_override=never");
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(s: &str) -> Vec<String> {
        s.split(' ')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    }

    fn meta(key: u8, value: &str) -> crate::talos::schematic::MetaValue {
        crate::talos::schematic::MetaValue {
            key,
            value: value.to_string(),
        }
    }

    #[test]
    fn meta_values_as_talos_encodes_them() {
        use base64::Engine;
        use std::io::Read;
        let v = TalosVersion::new(1, 13, 9);
        // Talos' own test vector (`pkg/machinery/meta/meta_test.go`, "simple"): 20 characters.
        let simple = meta_environment(v, &[meta(10, "foo"), meta(0xb, "bar")]);
        assert_eq!(simple, "MHhhPWZvbzsweGI9YmFy");
        // "huge": 3084 characters uncompressed, gzip when the text passes 256 bytes.
        let huge = [
            meta(10, &"foobar".repeat(256)),
            meta(0xb, &"baz".repeat(256)),
        ];
        let raw = format!("0xa={};0xb={}", "foobar".repeat(256), "baz".repeat(256));
        let old = meta_environment(TalosVersion::new(1, 6, 2), &huge);
        assert_eq!(old.len(), 3084);
        let encoded = meta_environment(v, &huge);
        assert!(encoded.len() < 200, "{}", encoded.len());
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&encoded)
            .expect("base64");
        // Go's gzip header: no flags, no time, best compression, unknown OS.
        assert_eq!(bytes[..10], [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 255]);
        let mut text = String::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_string(&mut text)
            .expect("gunzip");
        assert_eq!(text, raw);
        // Exactly 256 bytes stays plain.
        let edge = [meta(1, &"x".repeat(256 - 4))];
        let plain = base64::engine::general_purpose::STANDARD
            .decode(meta_environment(v, &edge))
            .expect("base64");
        assert_eq!(plain.len(), 256);
        assert_eq!(plain[0], b'0');
    }

    #[test]
    fn pxe_line_with_meta_values() {
        let v = TalosVersion::new(1, 14, 0);
        let args = schematic_line_args(v, &[meta(10, "foo")], &strings("net.ifnames=0"));
        assert_eq!(
            pxe_args(v, Arch::Amd64, &args).join(" "),
            format!(
                "talos.platform=metal console=tty0 {} talos.environment=INSTALLER_META_BASE64=MHhhPWZvbw== net.ifnames=0",
                default_args(v).join(" ")
            )
        );
        assert_eq!(schematic_line_args(v, &[], &strings("a=1")), ["a=1"]);
    }

    #[test]
    fn pxe_line_as_image_factory_builds_it() {
        let v13 = TalosVersion::new(1, 13, 9);
        let v14 = TalosVersion::new(1, 14, 0);
        let defaults13 = default_args(v13).join(" ");
        let defaults14 = default_args(v14).join(" ");
        let cases: Vec<(TalosVersion, Arch, &str, String)> = vec![
            (
                v13,
                Arch::Amd64,
                "",
                format!("talos.platform=metal console=tty0 {defaults13}"),
            ),
            (
                v13,
                Arch::Arm64,
                "",
                format!("talos.platform=metal console=ttyAMA0 console=tty0 {defaults13}"),
            ),
            (
                TalosVersion::new(1, 7, 0),
                Arch::Amd64,
                "",
                format!(
                    "talos.platform=metal console=ttyS0 console=tty0 {}",
                    default_args(TalosVersion::new(1, 7, 0)).join(" ")
                ),
            ),
            // Schematic arguments come after the defaults...
            (
                v14,
                Arch::Amd64,
                "net.ifnames=0 ip=dhcp",
                format!("talos.platform=metal console=tty0 {defaults14} net.ifnames=0 ip=dhcp"),
            ),
            // ...except a console, which replaces the platform's where it stands...
            (
                v14,
                Arch::Amd64,
                "console=ttyS0,115200 console=tty1 foo",
                format!("talos.platform=metal console=ttyS0,115200 console=tty1 {defaults14} foo"),
            ),
            // ...a negated argument, which removes one (or one value of one)...
            (
                v14,
                Arch::Arm64,
                "-pti -console=ttyAMA0 -nothing",
                format!(
                    "talos.platform=metal console=tty0 {}",
                    defaults14.replace("pti=on ", "")
                ),
            ),
            // ...and a repeated key, which joins the key's first place.
            (
                v13,
                Arch::Amd64,
                "pti=off slab_nomerge=0",
                format!(
                    "talos.platform=metal console=tty0 {}",
                    defaults13
                        .replace("pti=on", "pti=on pti=off")
                        .replace("slab_nomerge", "slab_nomerge slab_nomerge=0")
                ),
            ),
            (
                v13,
                Arch::Amd64,
                "talos.platform=equinixMetal",
                format!("talos.platform=equinixMetal console=tty0 {defaults13}"),
            ),
        ];
        for (version, arch, schematic, want) in cases {
            assert_eq!(
                pxe_args(version, arch, &strings(schematic)).join(" "),
                want,
                "{version} {arch:?} `{schematic}`"
            );
        }
    }

    #[test]
    fn default_args_per_release() {
        let v = |minor| TalosVersion::new(1, minor, 3);
        let cases: &[(u32, &str)] = &[
            (11, "init_on_alloc=1 slab_nomerge pti=on consoleblank=0 nvme_core.io_timeout=4294967295 printk.devkmsg=on selinux=1"),
            (12, "init_on_alloc=1 slab_nomerge pti=on consoleblank=0 nvme_core.io_timeout=4294967295 printk.devkmsg=on selinux=1 module.sig_enforce=1"),
            (13, "init_on_alloc=1 slab_nomerge pti=on consoleblank=0 nvme_core.io_timeout=4294967295 printk.devkmsg=on selinux=1 module.sig_enforce=1 proc_mem.force_override=never"),
            (14, "slab_nomerge pti=on consoleblank=0 printk.devkmsg=on selinux=1 module.sig_enforce=1 proc_mem.force_override=never"),
        ];
        for (minor, want) in cases {
            assert_eq!(default_args(v(*minor)).join(" "), *want, "1.{minor}");
        }
    }
}
