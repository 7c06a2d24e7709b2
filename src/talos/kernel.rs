//! Talos' own kernel arguments for a release, as Talos builds them for its boot assets
//! (`DefaultArgs` in `pkg/machinery/kernel/kernel.go` and the version quirks of
//! `pkg/machinery/imager/quirks/quirks.go`, read at v1.11.6, v1.12.11, v1.13.9 and
//! v1.14.0-rc.1): the PXE kernel line Plinth writes starts with these, as Image Factory's does.
//! Pure data; imports nothing outside `crate::talos`.

use super::TalosVersion;

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
