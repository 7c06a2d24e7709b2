//! What a network-booting machine should do now (`BootPlan`), and the iPXE scripts and Talos kernel
//! command line that carry it out. One decision serves BIOS, UEFI and UEFI HTTP boot, x86-64 and
//! ARM64: the firmware only changes which iPXE binary got the machine here.

use std::fmt::Write as _;

use super::dhcp::Arch;
use super::{LifecycleState, Machine};

/// Where the kernel and initramfs of an install come from, and where the config is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallAssets {
    /// Kernel URL.
    pub kernel_url: String,
    /// Initramfs URL.
    pub initramfs_url: String,
    /// The machine config URL; `${uuid}` and friends may appear in its query string only (Talos
    /// substitutes them there and nowhere else).
    pub config_url: String,
    /// The arguments of Image Factory's PXE line for this release, architecture and schematic:
    /// `talos.platform=metal`, the console, Talos' own defaults (its `DefaultArgs`), then the
    /// schematic's `extraKernelArgs`.
    pub talos_args: Vec<String>,
    /// Extra kernel arguments of the inventory (cluster, site, rack, profile, machine), in that
    /// order, after Image Factory's.
    pub extra_args: Vec<String>,
    /// Wipe the system disk on this boot (`talos.experimental.wipe=system`).
    pub wipe: bool,
    /// The code an operator matches to approve this boot's config release (`delivery:
    /// approve`), shown on the console.
    pub approval_code: Option<String>,
}

/// The decision for one boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootPlan {
    /// Boot the Talos installer.
    Install(InstallAssets),
    /// Boot from the local disk (`exit` back to the firmware, or `sanboot` where the vendor needs it).
    LocalDisk {
        /// Use `sanboot --no-describe --drive 0x80` instead of `exit`.
        sanboot: bool,
    },
    /// An unknown machine: registered as discovered; wait for an operator.
    Discovery,
    /// Poll again later without rebooting.
    Hold {
        /// Why, shown on the console and in the timeline.
        reason: String,
        /// Seconds between polls.
        retry_secs: u32,
    },
}

impl BootPlan {
    /// Short name for logs and events.
    pub fn name(&self) -> &'static str {
        match self {
            BootPlan::Install(_) => "install",
            BootPlan::LocalDisk { .. } => "local-disk",
            BootPlan::Discovery => "discovery",
            BootPlan::Hold { .. } => "hold",
        }
    }
}

/// Decide from the machine's state. `install` is what an install would use, when it can be had.
pub fn decide(machine: &Machine, install: Option<InstallAssets>) -> BootPlan {
    match machine.state {
        LifecycleState::Provisioning => match install {
            Some(a) => BootPlan::Install(a),
            None => BootPlan::Hold {
                reason: "provisioning, but no Talos image and machine config are ready for this machine yet".into(),
                retry_secs: 30,
            },
        },
        // An installed machine that network-boots never reinstalls by accident.
        LifecycleState::Installed => BootPlan::LocalDisk { sanboot: false },
        LifecycleState::Discovered => BootPlan::Discovery,
        other => BootPlan::Hold { reason: format!("machine is {other}: waiting for an operator"), retry_secs: 60 },
    }
}

/// The Talos kernel command line: `initrd=`, Image Factory's PXE arguments, the one-shot wipe,
/// the inventory's arguments, and `talos.config=` last.
pub fn kernel_cmdline(assets: &InstallAssets, initrd_name: &str) -> String {
    let mut args: Vec<String> = vec![
        // Debian's older iPXE needs initrd=<name> on the kernel line under UEFI.
        format!("initrd={initrd_name}"),
    ];
    args.extend(assets.talos_args.iter().cloned());
    if assets.wipe {
        args.push("talos.experimental.wipe=system".into());
    }
    args.extend(assets.extra_args.iter().cloned());
    args.push(format!("talos.config={}", assets.config_url));
    args.join(" ")
}

/// The generic first script: chain to this machine's own script with iPXE's identity variables,
/// retrying forever without ever stopping at a prompt.
pub fn generic_script(base: &str) -> String {
    let base = base.trim_end_matches('/');
    format!(
        "#!ipxe\n\
         # Plinth: hand over to this machine's own script.\n\
         :retry\n\
         chain --autofree --replace {base}/boot/machine.ipxe?mac=${{mac:hexhyp}}&uuid=${{uuid}}&serial=${{serial:uristring}}&manufacturer=${{manufacturer:uristring}}&product=${{product:uristring}}&asset=${{asset:uristring}}&buildarch=${{buildarch}}&platform=${{platform}} || goto failed\n\
         :failed\n\
         echo Plinth could not be reached; retrying in 10 seconds\n\
         sleep 10\n\
         goto retry\n"
    )
}

/// A script that only says why Plinth cannot answer (and waits `sleep` seconds, when given), for
/// requests that get no plan: iPXE shows it on the console; the generic script then retries.
pub fn error_script(message: &str, sleep: Option<u32>) -> String {
    let mut s = format!(
        "#!ipxe\necho Plinth: {}\n",
        message.replace(['\n', '\r'], " ")
    );
    if let Some(secs) = sleep {
        let _ = writeln!(s, "sleep {secs}");
    }
    s
}

/// The per-machine script for a plan.
pub fn machine_script(plan: &BootPlan, self_url: &str) -> String {
    let mut s = String::from("#!ipxe\n");
    match plan {
        BootPlan::Install(a) => {
            let initrd_name = a
                .initramfs_url
                .rsplit('/')
                .next()
                .unwrap_or("initramfs.xz")
                .to_string();
            let _ = writeln!(s, "echo Plinth: installing Talos");
            if let Some(code) = &a.approval_code {
                let _ = writeln!(s, "echo Plinth: approval code {code}");
                let _ = writeln!(
                    s,
                    "echo The config is released after an operator approves this code: plinth machine approve NAME {code}"
                );
                let _ = writeln!(s, "sleep 20");
            }
            let _ = writeln!(s, ":retry");
            let _ = writeln!(
                s,
                "kernel {} {} || goto failed",
                a.kernel_url,
                kernel_cmdline(a, &initrd_name)
            );
            let _ = writeln!(
                s,
                "initrd --name {initrd_name} {} || goto failed",
                a.initramfs_url
            );
            let _ = writeln!(s, "boot || goto failed");
            let _ = writeln!(s, ":failed");
            let _ = writeln!(s, "echo Plinth: download failed; retrying in 10 seconds");
            let _ = writeln!(s, "sleep 10");
            let _ = writeln!(s, "goto retry");
        }
        BootPlan::LocalDisk { sanboot: false } => {
            let _ = writeln!(s, "echo Plinth: booting from the local disk");
            let _ = writeln!(s, "exit");
        }
        BootPlan::LocalDisk { sanboot: true } => {
            let _ = writeln!(s, "echo Plinth: booting from the local disk");
            let _ = writeln!(s, "sanboot --no-describe --drive 0x80 || exit");
        }
        BootPlan::Discovery => {
            let _ = writeln!(
                s,
                "echo Plinth: this machine is new and has been registered as discovered."
            );
            let _ = writeln!(
                s,
                "echo Accept it in the inventory; this console polls every 30 seconds."
            );
            let _ = writeln!(s, "sleep 30");
            let _ = writeln!(s, "chain --autofree --replace {self_url}");
        }
        BootPlan::Hold { reason, retry_secs } => {
            let _ = writeln!(s, "echo Plinth: {}", reason.replace(['\n', '\r'], " "));
            let _ = writeln!(s, "sleep {retry_secs}");
            let _ = writeln!(s, "chain --autofree --replace {self_url}");
        }
    }
    s
}

/// iPXE's `${buildarch}` to an architecture: `i386` and `x86_64` are amd64 machines.
pub fn arch_of_buildarch(buildarch: &str) -> Option<Arch> {
    match buildarch {
        "i386" | "x86_64" | "x86-64" | "amd64" => Some(Arch::Amd64),
        "arm64" | "aarch64" => Some(Arch::Arm64),
        _ => None,
    }
}

/// Values firmware vendors put where a serial, asset tag or product should be, meaning "none".
pub fn is_placeholder(v: &str) -> bool {
    let t = v.trim().to_ascii_lowercase();
    t.is_empty()
        || t.chars()
            .all(|c| c == '0' || c == ' ' || c == '-' || c == '.' || c == 'x' || c == 'f')
        || [
            "to be filled by o.e.m.",
            "default string",
            "not specified",
            "none",
            "n/a",
            "system serial number",
            "chassis serial number",
            "0123456789",
            "123456789",
            "system product name",
            "system manufacturer",
            "asset-1234567890",
            "no asset tag",
            "unknown",
            "invalid",
            "empty",
        ]
        .contains(&t.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assets() -> InstallAssets {
        InstallAssets {
            kernel_url: "http://p:8080/images/s/v1.11.6/kernel-amd64".into(),
            initramfs_url: "http://p:8080/images/s/v1.11.6/initramfs-amd64.xz".into(),
            config_url: "http://p:8080/config/TOKEN?uuid=${uuid}".into(),
            talos_args: vec![
                "talos.platform=metal".into(),
                "console=tty0".into(),
                "slab_nomerge".into(),
                "pti=on".into(),
            ],
            extra_args: vec!["net.ifnames=0".into()],
            wipe: false,
            approval_code: None,
        }
    }

    #[test]
    fn cmdline_is_image_factory_then_wipe_then_inventory_then_config() {
        let c = kernel_cmdline(&assets(), "initramfs-amd64.xz");
        assert_eq!(
            c,
            "initrd=initramfs-amd64.xz talos.platform=metal console=tty0 slab_nomerge pti=on net.ifnames=0 talos.config=http://p:8080/config/TOKEN?uuid=${uuid}"
        );
        let mut w = assets();
        w.wipe = true;
        assert!(kernel_cmdline(&w, "i")
            .contains("pti=on talos.experimental.wipe=system net.ifnames=0 talos.config="));
    }

    #[test]
    fn scripts_never_prompt_and_always_retry() {
        let g = generic_script("http://p:8080/");
        assert!(g.starts_with("#!ipxe\n"));
        assert!(g.contains("http://p:8080/boot/machine.ipxe?mac=${mac:hexhyp}&uuid=${uuid}"));
        assert!(g.contains("goto retry"));
        assert!(!g.contains("prompt") && !g.contains("shell"));
        let s = machine_script(&BootPlan::Install(assets()), "http://p:8080/boot/x");
        assert!(s.contains(
            "initrd --name initramfs-amd64.xz http://p:8080/images/s/v1.11.6/initramfs-amd64.xz"
        ));
        assert!(s.contains(
            "kernel http://p:8080/images/s/v1.11.6/kernel-amd64 initrd=initramfs-amd64.xz"
        ));
        assert!(s.contains("boot || goto failed"));
        let l = machine_script(&BootPlan::LocalDisk { sanboot: false }, "u");
        assert!(l.contains("\nexit\n"));
        let h = machine_script(
            &BootPlan::Hold {
                reason: "wait\nnow".into(),
                retry_secs: 7,
            },
            "http://u",
        );
        assert!(h.contains("echo Plinth: wait now\nsleep 7\nchain --autofree --replace http://u"));
    }

    #[test]
    fn placeholders() {
        for p in [
            "To Be Filled By O.E.M.",
            "Default string",
            "0000000",
            "",
            "  ",
            "Not Specified",
            "FFFFFFFF",
        ] {
            assert!(is_placeholder(p), "{p}");
        }
        for real in ["7XQ1ZZ3", "CZ2D1F0ABC", "J30012345"] {
            assert!(!is_placeholder(real), "{real}");
        }
        assert_eq!(arch_of_buildarch("i386"), Some(Arch::Amd64));
        assert_eq!(arch_of_buildarch("arm64"), Some(Arch::Arm64));
    }
}
