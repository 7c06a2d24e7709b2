//! The OCI runtime spec (`github.com/opencontainers/runtime-spec/specs-go`, `Spec`) as Go's
//! `encoding/json` decodes it, for the checks where Talos turns YAML overrides into JSON and
//! unmarshals them into a `specs.Spec` to see that they fit: `machine.baseRuntimeSpecOverrides`
//! (`v1alpha1_validation.go`) and the 1.14 `CRIBaseRuntimeSpecConfig` (`cri/base_runtime_spec.go`).
//!
//! Go's decoder ignores keys no field has, matches field names exactly or else case-insensitively,
//! takes `null` for anything, and refuses a value of the wrong JSON type or a number that does not
//! fit the field's integer type (`json.Marshal` first prints YAML floats, so `2.0` fits an integer
//! and `1.5` does not). It keeps the first such error and goes on, in the order `json.Marshal`
//! writes the keys (sorted), so the error reported here is the one Talos reports.
//!
//! The field tables follow the spec's Go types at the two versions Talos builds with: v1.2.1
//! (Talos 1.11) and v1.3.0 (Talos 1.12 and later; the 1.12 machinery module still names v1.2.1,
//! but talosctl and machined are built from the root module, which requires v1.3.0).
//! Imports nothing outside `crate::talos`.

use serde_yaml_ng::Value;

use crate::talos::TalosVersion;

/// The runtime-spec release a Talos version decodes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SpecVersion {
    /// github.com/opencontainers/runtime-spec v1.2.1.
    V1_2_1,
    /// github.com/opencontainers/runtime-spec v1.3.0.
    V1_3_0,
}

impl SpecVersion {
    /// The runtime-spec of Talos `version`'s go.mod.
    pub(super) fn of(version: TalosVersion) -> Self {
        if version.major == 1 && version.minor <= 11 {
            SpecVersion::V1_2_1
        } else {
            SpecVersion::V1_3_0
        }
    }
}

/// Why Go would not decode the overrides.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct DecodeError {
    /// YAML path below the overrides (`process.user.uid`, `linux.devices[0].major`).
    pub path: String,
    /// Go's message (`json: cannot unmarshal string into Go struct field ...`), or the marshal
    /// failure for values JSON cannot hold.
    pub message: String,
    /// Whether `json.Marshal` failed (NaN, infinities) rather than `json.Unmarshal`.
    pub marshal: bool,
}

#[derive(Clone, Copy)]
enum Ty {
    /// A string kind, with its Go type name.
    Str(&'static str),
    Bool,
    /// A signed integer kind: Go type name, bits.
    Int(&'static str, u32),
    /// An unsigned integer kind: Go type name, bits.
    Uint(&'static str, u32),
    /// `interface{}`: anything.
    Any,
    List(&'static Ty),
    /// `map[string]T`.
    Map(&'static Ty),
    Struct(&'static St),
}

/// Which spec versions have a field.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Only {
    Both,
    V121,
    V130,
}

struct F(&'static str, Ty, Only);

struct St {
    name: &'static str,
    fields: &'static [F],
}

use Only::{Both, V121, V130};

const STR: Ty = Ty::Str("string");
const STRS: Ty = Ty::List(&STR);
const BOOL: Ty = Ty::Bool;
const I32: Ty = Ty::Int("int32", 32);
const I64: Ty = Ty::Int("int64", 64);
const INT: Ty = Ty::Int("int", 64);
const U16: Ty = Ty::Uint("uint16", 16);
const U32: Ty = Ty::Uint("uint32", 32);
const U64: Ty = Ty::Uint("uint64", 64);
const UINT: Ty = Ty::Uint("uint", 64);
const MODE: Ty = Ty::Uint("fs.FileMode", 32);
const STR_MAP: Ty = Ty::Map(&STR);
const fn s(name: &'static str) -> Ty {
    Ty::Str(name)
}
const fn l(t: &'static Ty) -> Ty {
    Ty::List(t)
}
const fn o(st: &'static St) -> Ty {
    Ty::Struct(st)
}

static SPEC: St = St {
    name: "Spec",
    fields: &[
        F("ociVersion", STR, Both),
        F("process", o(&PROCESS), Both),
        F("root", o(&ROOT), Both),
        F("hostname", STR, Both),
        F("domainname", STR, Both),
        F("mounts", l(&MOUNT_T), Both),
        F("hooks", o(&HOOKS), Both),
        F("annotations", STR_MAP, Both),
        F("linux", o(&LINUX), Both),
        F("solaris", o(&SOLARIS), Both),
        F("windows", o(&WINDOWS), Both),
        F("vm", o(&VM), Both),
        F("zos", o(&ZOS), Both),
        F("freebsd", o(&FREEBSD), V130),
    ],
};
static PROCESS: St = St {
    name: "Process",
    fields: &[
        F("terminal", BOOL, Both),
        F("consoleSize", o(&BOX), Both),
        F("user", o(&USER), Both),
        F("args", STRS, Both),
        F("commandLine", STR, Both),
        F("env", STRS, Both),
        F("cwd", STR, Both),
        F("capabilities", o(&CAPS), Both),
        F("rlimits", l(&RLIMIT_T), Both),
        F("noNewPrivileges", BOOL, Both),
        F("apparmorProfile", STR, Both),
        F("oomScoreAdj", INT, Both),
        F("scheduler", o(&SCHEDULER), Both),
        F("selinuxLabel", STR, Both),
        F("ioPriority", o(&IOPRIO), Both),
        F("execCPUAffinity", o(&AFFINITY), Both),
    ],
};
static SCHEDULER: St = St {
    name: "Scheduler",
    fields: &[
        F("policy", s("specs.LinuxSchedulerPolicy"), Both),
        F("nice", I32, Both),
        F("priority", I32, Both),
        F("flags", l(&SCHED_FLAG), Both),
        F("runtime", U64, Both),
        F("deadline", U64, Both),
        F("period", U64, Both),
    ],
};
const SCHED_FLAG: Ty = s("specs.LinuxSchedulerFlag");
static CAPS: St = St {
    name: "LinuxCapabilities",
    fields: &[
        F("bounding", STRS, Both),
        F("effective", STRS, Both),
        F("inheritable", STRS, Both),
        F("permitted", STRS, Both),
        F("ambient", STRS, Both),
    ],
};
static IOPRIO: St = St {
    name: "LinuxIOPriority",
    fields: &[
        F("class", s("specs.IOPriorityClass"), Both),
        F("priority", INT, Both),
    ],
};
static AFFINITY: St = St {
    name: "CPUAffinity",
    fields: &[F("initial", STR, Both), F("final", STR, Both)],
};
static BOX: St = St {
    name: "Box",
    fields: &[F("height", UINT, Both), F("width", UINT, Both)],
};
static USER: St = St {
    name: "User",
    fields: &[
        F("uid", U32, Both),
        F("gid", U32, Both),
        F("umask", U32, Both),
        F("additionalGids", l(&U32), Both),
        F("username", STR, Both),
    ],
};
static ROOT: St = St {
    name: "Root",
    fields: &[F("path", STR, Both), F("readonly", BOOL, Both)],
};
const MOUNT_T: Ty = o(&MOUNT);
static MOUNT: St = St {
    name: "Mount",
    fields: &[
        F("destination", STR, Both),
        F("type", STR, Both),
        F("source", STR, Both),
        F("options", STRS, Both),
        F("uidMappings", l(&IDMAP_T), Both),
        F("gidMappings", l(&IDMAP_T), Both),
    ],
};
const HOOK_T: Ty = o(&HOOK);
static HOOK: St = St {
    name: "Hook",
    fields: &[
        F("path", STR, Both),
        F("args", STRS, Both),
        F("env", STRS, Both),
        F("timeout", INT, Both),
    ],
};
static HOOKS: St = St {
    name: "Hooks",
    fields: &[
        F("prestart", l(&HOOK_T), Both),
        F("createRuntime", l(&HOOK_T), Both),
        F("createContainer", l(&HOOK_T), Both),
        F("startContainer", l(&HOOK_T), Both),
        F("poststart", l(&HOOK_T), Both),
        F("poststop", l(&HOOK_T), Both),
    ],
};
static LINUX: St = St {
    name: "Linux",
    fields: &[
        F("uidMappings", l(&IDMAP_T), Both),
        F("gidMappings", l(&IDMAP_T), Both),
        F("sysctl", STR_MAP, Both),
        F("resources", o(&RESOURCES), Both),
        F("cgroupsPath", STR, Both),
        F("namespaces", l(&NAMESPACE_T), Both),
        F("devices", l(&DEVICE_T), Both),
        F("netDevices", Ty::Map(&NETDEV_T), V130),
        F("seccomp", o(&SECCOMP), Both),
        F("rootfsPropagation", STR, Both),
        F("maskedPaths", STRS, Both),
        F("readonlyPaths", STRS, Both),
        F("mountLabel", STR, Both),
        F("intelRdt", o(&RDT), Both),
        F("memoryPolicy", o(&MEMPOLICY), V130),
        F("personality", o(&PERSONALITY), Both),
        F("timeOffsets", Ty::Map(&TIMEOFFSET_T), Both),
    ],
};
const NAMESPACE_T: Ty = o(&NAMESPACE);
static NAMESPACE: St = St {
    name: "LinuxNamespace",
    fields: &[
        F("type", s("specs.LinuxNamespaceType"), Both),
        F("path", STR, Both),
    ],
};
const IDMAP_T: Ty = o(&IDMAP);
static IDMAP: St = St {
    name: "LinuxIDMapping",
    fields: &[
        F("containerID", U32, Both),
        F("hostID", U32, Both),
        F("size", U32, Both),
    ],
};
const TIMEOFFSET_T: Ty = o(&TIMEOFFSET);
static TIMEOFFSET: St = St {
    name: "LinuxTimeOffset",
    fields: &[F("secs", I64, Both), F("nanosecs", U32, Both)],
};
const RLIMIT_T: Ty = o(&RLIMIT);
static RLIMIT: St = St {
    name: "POSIXRlimit",
    fields: &[
        F("type", STR, Both),
        F("hard", U64, Both),
        F("soft", U64, Both),
    ],
};
const HUGEPAGE_T: Ty = o(&HUGEPAGE);
static HUGEPAGE: St = St {
    name: "LinuxHugepageLimit",
    fields: &[F("pageSize", STR, Both), F("limit", U64, Both)],
};
const IFPRIO_T: Ty = o(&IFPRIO);
static IFPRIO: St = St {
    name: "LinuxInterfacePriority",
    fields: &[F("name", STR, Both), F("priority", U32, Both)],
};
const WEIGHTDEV_T: Ty = o(&WEIGHTDEV);
/// `LinuxWeightDevice` embeds `LinuxBlockIODevice` (major, minor), whose fields Go promotes.
static WEIGHTDEV: St = St {
    name: "LinuxWeightDevice",
    fields: &[
        F("major", I64, Both),
        F("minor", I64, Both),
        F("weight", U16, Both),
        F("leafWeight", U16, Both),
    ],
};
const THROTTLE_T: Ty = o(&THROTTLE);
static THROTTLE: St = St {
    name: "LinuxThrottleDevice",
    fields: &[
        F("major", I64, Both),
        F("minor", I64, Both),
        F("rate", U64, Both),
    ],
};
static BLOCKIO: St = St {
    name: "LinuxBlockIO",
    fields: &[
        F("weight", U16, Both),
        F("leafWeight", U16, Both),
        F("weightDevice", l(&WEIGHTDEV_T), Both),
        F("throttleReadBpsDevice", l(&THROTTLE_T), Both),
        F("throttleWriteBpsDevice", l(&THROTTLE_T), Both),
        F("throttleReadIOPSDevice", l(&THROTTLE_T), Both),
        F("throttleWriteIOPSDevice", l(&THROTTLE_T), Both),
    ],
};
static MEMORY: St = St {
    name: "LinuxMemory",
    fields: &[
        F("limit", I64, Both),
        F("reservation", I64, Both),
        F("swap", I64, Both),
        F("kernel", I64, Both),
        F("kernelTCP", I64, Both),
        F("swappiness", U64, Both),
        F("disableOOMKiller", BOOL, Both),
        F("useHierarchy", BOOL, Both),
        F("checkBeforeUpdate", BOOL, Both),
    ],
};
static CPU: St = St {
    name: "LinuxCPU",
    fields: &[
        F("shares", U64, Both),
        F("quota", I64, Both),
        F("burst", U64, Both),
        F("period", U64, Both),
        F("realtimeRuntime", I64, Both),
        F("realtimePeriod", U64, Both),
        F("cpus", STR, Both),
        F("mems", STR, Both),
        F("idle", I64, Both),
    ],
};
static PIDS: St = St {
    name: "LinuxPids",
    fields: &[F("limit", I64, Both)],
};
static NETWORK: St = St {
    name: "LinuxNetwork",
    fields: &[F("classID", U32, Both), F("priorities", l(&IFPRIO_T), Both)],
};
const RDMA_T: Ty = o(&RDMA);
static RDMA: St = St {
    name: "LinuxRdma",
    fields: &[F("hcaHandles", U32, Both), F("hcaObjects", U32, Both)],
};
static RESOURCES: St = St {
    name: "LinuxResources",
    fields: &[
        F("devices", l(&DEVCGROUP_T), Both),
        F("memory", o(&MEMORY), Both),
        F("cpu", o(&CPU), Both),
        F("pids", o(&PIDS), Both),
        F("blockIO", o(&BLOCKIO), Both),
        F("hugepageLimits", l(&HUGEPAGE_T), Both),
        F("network", o(&NETWORK), Both),
        F("rdma", Ty::Map(&RDMA_T), Both),
        F("unified", STR_MAP, Both),
    ],
};
const DEVICE_T: Ty = o(&DEVICE);
static DEVICE: St = St {
    name: "LinuxDevice",
    fields: &[
        F("path", STR, Both),
        F("type", STR, Both),
        F("major", I64, Both),
        F("minor", I64, Both),
        F("fileMode", MODE, Both),
        F("uid", U32, Both),
        F("gid", U32, Both),
    ],
};
const NETDEV_T: Ty = o(&NETDEV);
static NETDEV: St = St {
    name: "LinuxNetDevice",
    fields: &[F("name", STR, Both)],
};
const DEVCGROUP_T: Ty = o(&DEVCGROUP);
static DEVCGROUP: St = St {
    name: "LinuxDeviceCgroup",
    fields: &[
        F("allow", BOOL, Both),
        F("type", STR, Both),
        F("major", I64, Both),
        F("minor", I64, Both),
        F("access", STR, Both),
    ],
};
const PERSONALITY_FLAG: Ty = s("specs.LinuxPersonalityFlag");
static PERSONALITY: St = St {
    name: "LinuxPersonality",
    fields: &[
        F("domain", s("specs.LinuxPersonalityDomain"), Both),
        F("flags", l(&PERSONALITY_FLAG), Both),
    ],
};
const ANET_T: Ty = o(&ANET);
static ANET: St = St {
    name: "SolarisAnet",
    fields: &[
        F("linkname", STR, Both),
        F("lowerLink", STR, Both),
        F("allowedAddress", STR, Both),
        F("configureAllowedAddress", STR, Both),
        F("defrouter", STR, Both),
        F("linkProtection", STR, Both),
        F("macAddress", STR, Both),
    ],
};
static SOLARIS: St = St {
    name: "Solaris",
    fields: &[
        F("milestone", STR, Both),
        F("limitpriv", STR, Both),
        F("maxShmMemory", STR, Both),
        F("anet", l(&ANET_T), Both),
        F("cappedCPU", o(&CAPPED_CPU), Both),
        F("cappedMemory", o(&CAPPED_MEMORY), Both),
    ],
};
static CAPPED_CPU: St = St {
    name: "SolarisCappedCPU",
    fields: &[F("ncpus", STR, Both)],
};
static CAPPED_MEMORY: St = St {
    name: "SolarisCappedMemory",
    fields: &[F("physical", STR, Both), F("swap", STR, Both)],
};
const WINDEV_T: Ty = o(&WINDEV);
static WINDEV: St = St {
    name: "WindowsDevice",
    fields: &[F("id", STR, Both), F("idType", STR, Both)],
};
static WINDOWS: St = St {
    name: "Windows",
    fields: &[
        F("layerFolders", STRS, Both),
        F("devices", l(&WINDEV_T), Both),
        F("resources", o(&WINRES), Both),
        F("credentialSpec", Ty::Any, Both),
        F("servicing", BOOL, Both),
        F("ignoreFlushesDuringBoot", BOOL, Both),
        F("hyperv", o(&HYPERV), Both),
        F("network", o(&WINNET), Both),
    ],
};
static WINRES: St = St {
    name: "WindowsResources",
    fields: &[
        F("memory", o(&WINMEM), Both),
        F("cpu", o(&WINCPU), Both),
        F("storage", o(&WINSTORAGE), Both),
    ],
};
static WINMEM: St = St {
    name: "WindowsMemoryResources",
    fields: &[F("limit", U64, Both)],
};
const WINAFFINITY_T: Ty = o(&WINAFFINITY);
static WINCPU: St = St {
    name: "WindowsCPUResources",
    fields: &[
        F("count", U64, Both),
        F("shares", U16, Both),
        F("maximum", U16, Both),
        F("affinity", l(&WINAFFINITY_T), Both),
    ],
};
static WINAFFINITY: St = St {
    name: "WindowsCPUGroupAffinity",
    fields: &[F("mask", U64, Both), F("group", U32, Both)],
};
static WINSTORAGE: St = St {
    name: "WindowsStorageResources",
    fields: &[
        F("iops", U64, Both),
        F("bps", U64, Both),
        F("sandboxSize", U64, Both),
    ],
};
static WINNET: St = St {
    name: "WindowsNetwork",
    fields: &[
        F("endpointList", STRS, Both),
        F("allowUnqualifiedDNSQuery", BOOL, Both),
        F("DNSSearchList", STRS, Both),
        F("networkSharedContainerName", STR, Both),
        F("networkNamespace", STR, Both),
    ],
};
static HYPERV: St = St {
    name: "WindowsHyperV",
    fields: &[F("utilityVMPath", STR, Both)],
};
const IOMEMS_T: Ty = o(&IOMEMS);
static IOMEMS: St = St {
    name: "IOMems",
    fields: &[
        F("firstGFN", U64, Both),
        F("firstMFN", U64, Both),
        F("nrMFNs", U64, Both),
    ],
};
static HWCONFIG: St = St {
    name: "HWConfig",
    fields: &[
        F("deviceTree", STR, Both),
        F("vcpus", U32, Both),
        F("memory", U64, Both),
        F("dtdevs", STRS, Both),
        F("iomems", l(&IOMEMS_T), Both),
        F("irqs", l(&U32), Both),
    ],
};
static VM: St = St {
    name: "VM",
    fields: &[
        F("hypervisor", o(&VM_HYPERVISOR), Both),
        F("kernel", o(&VM_KERNEL), Both),
        F("image", o(&VM_IMAGE), Both),
        F("hwconfig", o(&HWCONFIG), V130),
    ],
};
static VM_HYPERVISOR: St = St {
    name: "VMHypervisor",
    fields: &[F("path", STR, Both), F("parameters", STRS, Both)],
};
static VM_KERNEL: St = St {
    name: "VMKernel",
    fields: &[
        F("path", STR, Both),
        F("parameters", STRS, Both),
        F("initrd", STR, Both),
    ],
};
static VM_IMAGE: St = St {
    name: "VMImage",
    fields: &[F("path", STR, Both), F("format", STR, Both)],
};
const ARCH: Ty = s("specs.Arch");
const SECCOMP_FLAG: Ty = s("specs.LinuxSeccompFlag");
static SECCOMP: St = St {
    name: "LinuxSeccomp",
    fields: &[
        F("defaultAction", s("specs.LinuxSeccompAction"), Both),
        F("defaultErrnoRet", UINT, Both),
        F("architectures", l(&ARCH), Both),
        F("flags", l(&SECCOMP_FLAG), Both),
        F("listenerPath", STR, Both),
        F("listenerMetadata", STR, Both),
        F("syscalls", l(&SYSCALL_T), Both),
    ],
};
const SECCOMP_ARG_T: Ty = o(&SECCOMP_ARG);
static SECCOMP_ARG: St = St {
    name: "LinuxSeccompArg",
    fields: &[
        F("index", UINT, Both),
        F("value", U64, Both),
        F("valueTwo", U64, Both),
        F("op", s("specs.LinuxSeccompOperator"), Both),
    ],
};
const SYSCALL_T: Ty = o(&SYSCALL);
static SYSCALL: St = St {
    name: "LinuxSyscall",
    fields: &[
        F("names", STRS, Both),
        F("action", s("specs.LinuxSeccompAction"), Both),
        F("errnoRet", UINT, Both),
        F("args", l(&SECCOMP_ARG_T), Both),
    ],
};
static RDT: St = St {
    name: "LinuxIntelRdt",
    fields: &[
        F("closID", STR, Both),
        F("schemata", STRS, V130),
        F("l3CacheSchema", STR, Both),
        F("memBwSchema", STR, Both),
        F("enableMonitoring", BOOL, V130),
        F("enableCMT", BOOL, V121),
        F("enableMBM", BOOL, V121),
    ],
};
const MEMPOLICY_FLAG: Ty = s("specs.MemoryPolicyFlagType");
static MEMPOLICY: St = St {
    name: "LinuxMemoryPolicy",
    fields: &[
        F("mode", s("specs.MemoryPolicyModeType"), Both),
        F("nodes", STR, Both),
        F("flags", l(&MEMPOLICY_FLAG), Both),
    ],
};
const ZOS_NS_T: Ty = o(&ZOS_NS);
static ZOS: St = St {
    name: "ZOS",
    fields: &[F("namespaces", l(&ZOS_NS_T), Both)],
};
static ZOS_NS: St = St {
    name: "ZOSNamespace",
    fields: &[
        F("type", s("specs.ZOSNamespaceType"), Both),
        F("path", STR, Both),
    ],
};
const FREEBSD_DEV_T: Ty = o(&FREEBSD_DEV);
const SHARING: Ty = s("specs.FreeBSDSharing");
static FREEBSD: St = St {
    name: "FreeBSD",
    fields: &[
        F("devices", l(&FREEBSD_DEV_T), Both),
        F("jail", o(&JAIL), Both),
    ],
};
static FREEBSD_DEV: St = St {
    name: "FreeBSDDevice",
    fields: &[F("path", STR, Both), F("mode", MODE, Both)],
};
static JAIL: St = St {
    name: "FreeBSDJail",
    fields: &[
        F("parent", STR, Both),
        F("host", SHARING, Both),
        F("ip4", SHARING, Both),
        F("ip4Addr", STRS, Both),
        F("ip6", SHARING, Both),
        F("ip6Addr", STRS, Both),
        F("vnet", SHARING, Both),
        F("interface", STR, Both),
        F("vnetInterfaces", STRS, Both),
        F("sysvmsg", SHARING, Both),
        F("sysvsem", SHARING, Both),
        F("sysvshm", SHARING, Both),
        F("enforceStatfs", INT, Both),
        F("allow", o(&JAIL_ALLOW), Both),
    ],
};
static JAIL_ALLOW: St = St {
    name: "FreeBSDJailAllow",
    fields: &[
        F("setHostname", BOOL, Both),
        F("rawSockets", BOOL, Both),
        F("chflags", BOOL, Both),
        F("mount", STRS, Both),
        F("quotas", BOOL, Both),
        F("socketAf", BOOL, Both),
        F("mlock", BOOL, Both),
        F("reservedPorts", BOOL, Both),
        F("suser", BOOL, Both),
    ],
};

/// Go's name of a type, as `reflect.Type.String()` prints it in decode errors.
fn go_type(t: &Ty) -> String {
    match t {
        Ty::Str(n) | Ty::Int(n, _) | Ty::Uint(n, _) => (*n).to_string(),
        Ty::Bool => "bool".into(),
        Ty::Any => "interface {}".into(),
        Ty::List(e) => format!("[]{}", go_type(e)),
        Ty::Map(e) => format!("map[string]{}", go_type(e)),
        Ty::Struct(st) => format!("specs.{}", st.name),
    }
}

/// Simple Unicode case folding of one character, as Go's `bytes.EqualFold` compares: the
/// Kelvin sign and the long s fold to ASCII letters; other characters by their one-character
/// lower case. (Characters whose lower case is several characters compare as themselves.)
fn fold(c: char) -> char {
    match c {
        '\u{212A}' => 'k',
        '\u{017F}' => 's',
        _ => {
            let mut l = c.to_lowercase();
            match (l.next(), l.next()) {
                (Some(one), None) => one,
                _ => c,
            }
        }
    }
}

fn equal_fold(a: &str, b: &str) -> bool {
    let mut x = a.chars().map(fold);
    let mut y = b.chars().map(fold);
    loop {
        match (x.next(), y.next()) {
            (None, None) => return true,
            (Some(p), Some(q)) if p == q => {}
            _ => return false,
        }
    }
}

/// The field of `st` that Go's decoder fills from `key`: the exact name, else the first
/// case-insensitive match.
fn field<'a>(st: &'a St, key: &str, spec: SpecVersion) -> Option<&'a F> {
    let present = |f: &&F| match f.2 {
        Both => true,
        V121 => spec == SpecVersion::V1_2_1,
        V130 => spec == SpecVersion::V1_3_0,
    };
    st.fields
        .iter()
        .filter(present)
        .find(|f| f.0 == key)
        .or_else(|| {
            st.fields
                .iter()
                .filter(present)
                .find(|f| equal_fold(f.0, key))
        })
}

/// A float as `json.Marshal` prints it (`strconv.FormatFloat` with `'f'` between 1e-6 and
/// 1e21, else `'e'` with a two-digit-or-more exponent), or `None` for NaN and infinities,
/// which JSON cannot hold.
fn go_float(f: f64) -> Option<String> {
    if !f.is_finite() {
        return None;
    }
    let a = f.abs();
    if a == 0.0 || (1e-6..1e21).contains(&a) {
        return Some(format!("{f}"));
    }
    let e = format!("{f:e}");
    let (m, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    Some(format!("{m}e{sign}{digits:0>2}"))
}

struct Walk {
    spec: SpecVersion,
    /// The innermost struct and the JSON field names from the root, for Go's message.
    fields: Vec<&'static str>,
    structs: Vec<&'static str>,
}

fn join_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

impl Walk {
    fn type_error(&self, path: &str, what: String, t: &Ty) -> DecodeError {
        let message = match self.structs.last() {
            Some(st) => format!(
                "json: cannot unmarshal {what} into Go struct field {st}.{} of type {}",
                self.fields.join("."),
                go_type(t)
            ),
            None => format!(
                "json: cannot unmarshal {what} into Go value of type {}",
                go_type(t)
            ),
        };
        DecodeError {
            path: path.to_string(),
            message,
            marshal: false,
        }
    }

    fn value(&mut self, v: &Value, t: &Ty, path: &str) -> Result<(), DecodeError> {
        let v = match v {
            Value::Tagged(t) => &t.value,
            other => other,
        };
        // Numbers that JSON cannot hold stop json.Marshal before any decoding.
        if let Value::Number(n) = v {
            if n.as_i64().is_none() && n.as_u64().is_none() {
                let f = n.as_f64().unwrap_or(f64::NAN);
                if go_float(f).is_none() {
                    return Err(DecodeError {
                        path: path.to_string(),
                        message: format!("json: unsupported value: {f}"),
                        marshal: true,
                    });
                }
            }
        }
        match (v, t) {
            (Value::Null, _) | (_, Ty::Any) => Ok(()),
            (Value::String(_), Ty::Str(_)) | (Value::Bool(_), Ty::Bool) => Ok(()),
            (Value::Number(n), Ty::Int(_, bits) | Ty::Uint(_, bits)) => {
                let literal = if let Some(i) = n.as_i64() {
                    i.to_string()
                } else if let Some(u) = n.as_u64() {
                    u.to_string()
                } else {
                    go_float(n.as_f64().unwrap_or(0.0)).unwrap_or_default()
                };
                let fits = match t {
                    Ty::Int(..) => literal.parse::<i64>().ok().is_some_and(|i| {
                        *bits >= 64 || (i >= -(1i64 << (bits - 1)) && i < (1i64 << (bits - 1)))
                    }),
                    _ => {
                        !literal.starts_with('+')
                            && literal
                                .parse::<u64>()
                                .ok()
                                .is_some_and(|u| *bits >= 64 || u < (1u64 << bits))
                    }
                };
                if fits {
                    Ok(())
                } else {
                    Err(self.type_error(path, format!("number {literal}"), t))
                }
            }
            (Value::Sequence(items), Ty::List(e)) => {
                for (i, item) in items.iter().enumerate() {
                    self.value(item, e, &format!("{path}[{i}]"))?;
                }
                Ok(())
            }
            (Value::Mapping(m), Ty::Map(e)) => {
                // Go's message names struct fields only, not map keys.
                for (k, item) in sorted(m) {
                    self.value(item, e, &join_path(path, &k))?;
                }
                Ok(())
            }
            (Value::Mapping(m), Ty::Struct(st)) => self.object(m, st, path),
            (other, _) => {
                let what = match other {
                    Value::String(_) => "string",
                    Value::Bool(_) => "bool",
                    Value::Number(_) => "number",
                    Value::Sequence(_) => "array",
                    _ => "object",
                };
                Err(self.type_error(path, what.to_string(), t))
            }
        }
    }

    fn object(
        &mut self,
        m: &serde_yaml_ng::Mapping,
        st: &'static St,
        path: &str,
    ) -> Result<(), DecodeError> {
        self.structs.push(st.name);
        let mut result = Ok(());
        for (k, item) in sorted(m) {
            let Some(f) = field(st, &k, self.spec) else {
                continue;
            };
            self.fields.push(f.0);
            let r = self.value(item, &f.1, &join_path(path, &k));
            self.fields.pop();
            if r.is_err() {
                result = r;
                break;
            }
        }
        self.structs.pop();
        result
    }
}

/// A mapping's entries with their keys as text, in the byte order `json.Marshal` writes them.
fn sorted(m: &serde_yaml_ng::Mapping) -> Vec<(String, &Value)> {
    let mut out: Vec<(String, &Value)> = m
        .iter()
        .map(|(k, v)| (crate::talos::scalar_text(k).unwrap_or_default(), v))
        .collect();
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out
}

/// Decode `overrides` (the YAML mapping Talos marshals to JSON) into a `specs.Spec` as Go would;
/// the first error Go keeps, if any.
pub(super) fn decode_spec(overrides: &Value, spec: SpecVersion) -> Result<(), DecodeError> {
    let mut walk = Walk {
        spec,
        fields: Vec::new(),
        structs: Vec::new(),
    };
    walk.value(overrides, &o(&SPEC), "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(yaml: &str, spec: SpecVersion) -> Result<(), DecodeError> {
        let v: Value = serde_yaml_ng::from_str(yaml).expect("yaml");
        decode_spec(&v, spec)
    }

    #[test]
    fn go_json_decoding_rules() {
        let v = SpecVersion::V1_3_0;
        assert_eq!(
            decode(
                "process: {rlimits: [{type: RLIMIT_NOFILE, hard: 1024, soft: 1024}]}",
                v
            ),
            Ok(())
        );
        // Unknown keys are ignored; null fits anything; floats without a fraction fit integers.
        assert_eq!(
            decode("nonsense: 1\nprocess: {user: null, oomScoreAdj: 2.0}", v),
            Ok(())
        );
        // Field names match case-insensitively.
        let e = decode("PROCESS: {User: {UID: x}}", v).expect_err("string uid");
        assert_eq!(e.path, "PROCESS.User.UID");
        assert_eq!(
            e.message,
            "json: cannot unmarshal string into Go struct field User.process.user.uid of type uint32"
        );
        let e = decode("process: {user: {uid: -1}}", v).expect_err("negative");
        assert!(e.message.contains("number -1"), "{}", e.message);
        let e = decode("process: {rlimits: {hard: 1}}", v).expect_err("object for list");
        assert!(
            e.message.contains("of type []specs.POSIXRlimit"),
            "{}",
            e.message
        );
        assert!(decode("linux: {resources: {blockIO: {weight: 70000}}}", v).is_err());
        assert!(decode("process: {oomScoreAdj: 1.5}", v).is_err());
        // The first error in sorted key order is the one Go keeps.
        let e = decode("root: {readonly: x}\nhostname: 5", v).expect_err("two");
        assert_eq!(e.path, "hostname");
        // Fields of one spec version only.
        assert!(decode("linux: {memoryPolicy: {mode: 5}}", v).is_err());
        assert_eq!(
            decode("linux: {memoryPolicy: {mode: 5}}", SpecVersion::V1_2_1),
            Ok(())
        );
        assert!(decode("linux: {intelRdt: {enableCMT: x}}", SpecVersion::V1_2_1).is_err());
        assert_eq!(decode("linux: {intelRdt: {enableCMT: x}}", v), Ok(()));
        // The Kelvin sign folds to k.
        assert!(decode("linux: {resources: {\"\u{212A}ernel\": x}}", v).is_ok());
        assert!(decode("linux: {resources: {memory: {\"\u{212A}ernel\": x}}}", v).is_err());
        assert!(
            decode("process: {oomScoreAdj: .nan}", v)
                .expect_err("nan")
                .marshal
        );
    }
}
