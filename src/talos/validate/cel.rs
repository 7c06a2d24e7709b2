//! Type-checking of the CEL expressions in Talos config documents (disk, volume and link
//! selectors) against the CEL environments Talos declares for them
//! (`pkg/machinery/cel/celenv/celenv.go`): `DiskLocator` (`disk`, `system_disk`, `glob()` and
//! the size constants), `VolumeLocator` (`volume`, `disk` and the size constants) and, from 1.12,
//! `LinkLocator` (`link`, `glob()`, `mac()`). Talos parses each selector with cel-go, checks it
//! against its environment and requires the result to be exactly `bool`
//! (`pkg/machinery/cel/cel.go`); a selector that fails is an error of the document's
//! `Validate()`.
//!
//! The `cel` crate (cel-rust) parses CEL and expands its macros exactly as cel-go does, but has no
//! type checker, so this module checks the parsed AST itself: the message types are declared
//! from Talos' resource protos (`api/resource/definitions/{block,network}/*.proto`) at each
//! release, and the operators and functions are CEL's standard library as cel-go declares it,
//! without cross-type numeric comparisons (cel-go's default, so `disk.size > 1` is an error:
//! `uint` against `int`). Imports nothing outside `crate::talos`.

use std::collections::HashMap;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

use crate::talos::TalosVersion;

/// A Talos CEL environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CelEnv {
    /// `celenv.DiskLocator`: disk selectors of volume documents and the install disk.
    Disk,
    /// `celenv.VolumeLocator`: volume selectors (`ExistingVolumeConfig`, RAID/LVM, ...).
    Volume,
    /// `celenv.LinkLocator` (Talos 1.12+): link selectors of network documents.
    Link,
    /// `celenv.OOMTrigger` (Talos 1.12+): `OOMConfig.triggerExpression`.
    OomTrigger,
    /// `celenv.OOMCgroupScoring` (Talos 1.12+): `OOMConfig.cgroupRankingExpression`.
    OomScoring,
}

impl CelEnv {
    /// Talos' name of the environment.
    pub fn name(self) -> &'static str {
        match self {
            CelEnv::Disk => "DiskLocator",
            CelEnv::Volume => "VolumeLocator",
            CelEnv::Link => "LinkLocator",
            CelEnv::OomTrigger => "OOMTrigger",
            CelEnv::OomScoring => "OOMCgroupScoring",
        }
    }
}

/// A CEL type, as far as the checker needs one.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    Duration,
    Timestamp,
    Dyn,
    Type,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Msg(&'static str),
    Optional(Box<Ty>),
}

impl std::fmt::Display for Ty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ty::Bool => f.write_str("bool"),
            Ty::Int => f.write_str("int"),
            Ty::Uint => f.write_str("uint"),
            Ty::Double => f.write_str("double"),
            Ty::String => f.write_str("string"),
            Ty::Bytes => f.write_str("bytes"),
            Ty::Null => f.write_str("null_type"),
            Ty::Duration => f.write_str("google.protobuf.Duration"),
            Ty::Timestamp => f.write_str("google.protobuf.Timestamp"),
            Ty::Dyn => f.write_str("dyn"),
            Ty::Type => f.write_str("type"),
            Ty::List(t) => write!(f, "list({t})"),
            Ty::Map(k, v) => write!(f, "map({k}, {v})"),
            Ty::Msg(m) => f.write_str(m),
            Ty::Optional(t) => write!(f, "optional_type({t})"),
        }
    }
}

/// The kind of a proto field, as declared in Talos' resource protos. Proto enums are `int` to
/// CEL.
#[derive(Clone, Copy)]
enum F {
    U64,
    U32,
    I64,
    I32,
    Str,
    Bool,
    Bytes,
    Enum,
    Dur,
    Msg(&'static str),
    Rep(&'static F),
}

impl F {
    fn ty(self) -> Ty {
        match self {
            F::U64 | F::U32 => Ty::Uint,
            F::I64 | F::I32 | F::Enum => Ty::Int,
            F::Str => Ty::String,
            F::Bool => Ty::Bool,
            F::Bytes => Ty::Bytes,
            F::Dur => Ty::Duration,
            F::Msg(m) => Ty::Msg(m),
            F::Rep(inner) => Ty::List(Box::new(inner.ty())),
        }
    }
}

const DISK: &str = "talos.resource.definitions.block.DiskSpec";
const VOLUME: &str = "talos.resource.definitions.block.DiscoveredVolumeSpec";
const LINK: &str = "talos.resource.definitions.network.LinkStatusSpec";

/// One message field: (message, field, kind, first minor release that has it).
type FieldDecl = (&'static str, &'static str, F, u32);

/// The fields of the messages the environments expose, from
/// `api/resource/definitions/block/block.proto`, `.../network/network.proto` and
/// `api/common/common.proto` at v1.11.6, v1.12.11, v1.13.9 and v1.14.0-rc.1.
const FIELDS: &[FieldDecl] = &[
    // DiskSpec
    (DISK, "size", F::U64, 11),
    (DISK, "io_size", F::U64, 11),
    (DISK, "sector_size", F::U64, 11),
    (DISK, "readonly", F::Bool, 11),
    (DISK, "model", F::Str, 11),
    (DISK, "serial", F::Str, 11),
    (DISK, "modalias", F::Str, 11),
    (DISK, "wwid", F::Str, 11),
    (DISK, "bus_path", F::Str, 11),
    (DISK, "sub_system", F::Str, 11),
    (DISK, "transport", F::Str, 11),
    (DISK, "rotational", F::Bool, 11),
    (DISK, "cdrom", F::Bool, 11),
    (DISK, "dev_path", F::Str, 11),
    (DISK, "pretty_size", F::Str, 11),
    (DISK, "secondary_disks", F::Rep(&F::Str), 11),
    (DISK, "uuid", F::Str, 11),
    (DISK, "symlinks", F::Rep(&F::Str), 11),
    (DISK, "firmware_version", F::Str, 14),
    // DiscoveredVolumeSpec
    (VOLUME, "size", F::U64, 11),
    (VOLUME, "sector_size", F::U64, 11),
    (VOLUME, "io_size", F::U64, 11),
    (VOLUME, "name", F::Str, 11),
    (VOLUME, "uuid", F::Str, 11),
    (VOLUME, "label", F::Str, 11),
    (VOLUME, "block_size", F::U32, 11),
    (VOLUME, "filesystem_block_size", F::U32, 11),
    (VOLUME, "probed_size", F::U64, 11),
    (VOLUME, "partition_uuid", F::Str, 11),
    (VOLUME, "partition_type", F::Str, 11),
    (VOLUME, "partition_label", F::Str, 11),
    (VOLUME, "partition_index", F::U64, 11),
    (VOLUME, "type", F::Str, 11),
    (VOLUME, "device_path", F::Str, 11),
    (VOLUME, "parent", F::Str, 11),
    (VOLUME, "dev_path", F::Str, 11),
    (VOLUME, "parent_dev_path", F::Str, 11),
    (VOLUME, "pretty_size", F::Str, 11),
    (VOLUME, "offset", F::U64, 14),
    // LinkStatusSpec (the LinkLocator environment exists from 1.12)
    (LINK, "index", F::U32, 12),
    (LINK, "type", F::Enum, 12),
    (LINK, "link_index", F::U32, 12),
    (LINK, "flags", F::U32, 12),
    (LINK, "hardware_addr", F::Bytes, 12),
    (LINK, "broadcast_addr", F::Bytes, 12),
    (LINK, "mtu", F::U32, 12),
    (LINK, "queue_disc", F::Str, 12),
    (LINK, "master_index", F::U32, 12),
    (LINK, "operational_state", F::Enum, 12),
    (LINK, "kind", F::Str, 12),
    (LINK, "slave_kind", F::Str, 12),
    (LINK, "bus_path", F::Str, 12),
    (LINK, "pciid", F::Str, 12),
    (LINK, "driver", F::Str, 12),
    (LINK, "driver_version", F::Str, 12),
    (LINK, "firmware_version", F::Str, 12),
    (LINK, "product_id", F::Str, 12),
    (LINK, "vendor_id", F::Str, 12),
    (LINK, "product", F::Str, 12),
    (LINK, "vendor", F::Str, 12),
    (LINK, "link_state", F::Bool, 12),
    (LINK, "speed_megabits", F::I64, 12),
    (LINK, "port", F::Enum, 12),
    (LINK, "duplex", F::Enum, 12),
    (LINK, "vlan", F::Msg(VLAN), 12),
    (LINK, "bridge_master", F::Msg(BRIDGE), 12),
    (LINK, "bond_master", F::Msg(BOND), 12),
    (LINK, "wireguard", F::Msg(WG), 12),
    (LINK, "permanent_addr", F::Bytes, 12),
    (LINK, "alias", F::Str, 12),
    (LINK, "alt_names", F::Rep(&F::Str), 12),
    (LINK, "vrf_master", F::Msg(VRF), 13),
    (LINK, "veth", F::Msg(VETH), 14),
    (VLAN, "vid", F::U32, 12),
    (VLAN, "protocol", F::Enum, 12),
    (BRIDGE, "stp", F::Msg(STP), 12),
    (BRIDGE, "vlan", F::Msg(BRIDGE_VLAN), 12),
    (STP, "enabled", F::Bool, 12),
    (BRIDGE_VLAN, "filtering_enabled", F::Bool, 12),
    (BOND, "mode", F::Enum, 12),
    (BOND, "hash_policy", F::Enum, 12),
    (BOND, "lacp_rate", F::Enum, 12),
    (BOND, "arp_validate", F::Enum, 12),
    (BOND, "arp_all_targets", F::Enum, 12),
    (BOND, "primary_index", F::U32, 12),
    (BOND, "primary_reselect", F::Enum, 12),
    (BOND, "fail_over_mac", F::Enum, 12),
    (BOND, "ad_select", F::Enum, 12),
    (BOND, "mii_mon", F::U32, 12),
    (BOND, "up_delay", F::U32, 12),
    (BOND, "down_delay", F::U32, 12),
    (BOND, "arp_interval", F::U32, 12),
    (BOND, "resend_igmp", F::U32, 12),
    (BOND, "min_links", F::U32, 12),
    (BOND, "lp_interval", F::U32, 12),
    (BOND, "packets_per_slave", F::U32, 12),
    (BOND, "num_peer_notif", F::U32, 12),
    (BOND, "tlb_dynamic_lb", F::U32, 12),
    (BOND, "all_slaves_active", F::U32, 12),
    (BOND, "use_carrier", F::Bool, 12),
    (BOND, "ad_actor_sys_prio", F::U32, 12),
    (BOND, "ad_user_port_key", F::U32, 12),
    (BOND, "peer_notify_delay", F::U32, 12),
    (BOND, "arpip_targets", F::Rep(&F::Msg(NET_IP)), 12),
    (BOND, "nsip6_targets", F::Rep(&F::Msg(NET_IP)), 12),
    (BOND, "adlacp_active", F::Enum, 12),
    (BOND, "missed_max", F::U32, 12),
    (WG, "private_key", F::Str, 12),
    (WG, "public_key", F::Str, 12),
    (WG, "listen_port", F::I64, 12),
    (WG, "firewall_mark", F::I64, 12),
    (WG, "peers", F::Rep(&F::Msg(WG_PEER)), 12),
    (WG_PEER, "public_key", F::Str, 12),
    (WG_PEER, "preshared_key", F::Str, 12),
    (WG_PEER, "endpoint", F::Str, 12),
    (WG_PEER, "persistent_keepalive_interval", F::Dur, 12),
    (WG_PEER, "allowed_ips", F::Rep(&F::Msg(NET_PREFIX)), 12),
    (VRF, "table", F::Enum, 13),
    (VETH, "peer_name", F::Str, 14),
    (NET_IP, "ip", F::Bytes, 12),
    (NET_PREFIX, "ip", F::Bytes, 12),
    (NET_PREFIX, "prefix_length", F::I32, 12),
];

const VLAN: &str = "talos.resource.definitions.network.VLANSpec";
const BRIDGE: &str = "talos.resource.definitions.network.BridgeMasterSpec";
const STP: &str = "talos.resource.definitions.network.STPSpec";
const BRIDGE_VLAN: &str = "talos.resource.definitions.network.BridgeVLANSpec";
const BOND: &str = "talos.resource.definitions.network.BondMasterSpec";
const WG: &str = "talos.resource.definitions.network.WireguardSpec";
const WG_PEER: &str = "talos.resource.definitions.network.WireguardPeer";
const VRF: &str = "talos.resource.definitions.network.VRFMasterSpec";
const VETH: &str = "talos.resource.definitions.network.VethSpec";
const NET_IP: &str = "common.NetIP";
const NET_PREFIX: &str = "common.NetIPPrefix";

/// The size constants of the disk and volume environments (`KiB` ... `EB`, all `uint`).
const SIZE_CONSTANTS: &[&str] = &[
    "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "kB", "MB", "GB", "TB", "PB", "EB",
];

/// Whether `env` exists in Talos `version`.
pub fn env_exists(env: CelEnv, version: TalosVersion) -> bool {
    matches!(env, CelEnv::Disk | CelEnv::Volume) || version.minor >= 12
}

/// The pressure variables of the OOM trigger environment (all `double`; the `qos_` ones are maps
/// from a QoS class to `double`).
const OOM_ROOT: &[&str] = &[
    "memory_some_avg10",
    "memory_some_avg60",
    "memory_some_avg300",
    "memory_some_total",
    "memory_full_avg10",
    "memory_full_avg60",
    "memory_full_avg300",
    "memory_full_total",
];

/// The QoS classes, `int` constants of both OOM environments.
const QOS_CLASSES: &[&str] = &[
    "Besteffort",
    "Burstable",
    "Guaranteed",
    "Podruntime",
    "System",
];

/// Check that `source` parses and type-checks in Talos' environment `env` of `version` and that
/// its result is exactly `bool`. The error says what Talos' check would refuse.
pub fn check_bool(source: &str, env: CelEnv, version: TalosVersion) -> Result<(), String> {
    check_typed(source, env, version, "bool")
}

/// Like [`check_bool`], for an expression whose result must be exactly `double` (the OOM cgroup
/// ranking).
pub fn check_double(source: &str, env: CelEnv, version: TalosVersion) -> Result<(), String> {
    check_typed(source, env, version, "double")
}

fn check_typed(source: &str, env: CelEnv, version: TalosVersion, want: &str) -> Result<(), String> {
    if !env_exists(env, version) {
        return Err(format!(
            "Talos {version} has no {} CEL environment",
            env.name()
        ));
    }
    // An anonymous config can carry a selector: bound the work before parsing.
    if source.len() > 16 * 1024 {
        return Err(format!(
            "expression is {} bytes long; Plinth checks selectors up to 16 KiB",
            source.len()
        ));
    }
    // Only the OOM environments declare optional types (`cel.OptionalTypes()`).
    let optional = matches!(env, CelEnv::OomTrigger | CelEnv::OomScoring);
    let (expr, info) = cel::parser::Parser::new()
        .enable_optional_syntax(optional)
        .parse_with_source_info(source)
        .map_err(|e| format!("does not parse: {}", one_line(&e.to_string())))?;
    let mut checker = Checker {
        env,
        minor: version.minor,
        scopes: Vec::new(),
        depth: 0,
    };
    let ty = checker
        .check(&expr)
        .map_err(|(id, msg)| match info.offset_for(id) {
            Some((start, _)) => format!("{msg} (at character {})", start + 1),
            None => msg,
        })?;
    if ty.to_string() != want {
        return Err(format!("expression output type is {ty}, expected {want}"));
    }
    Ok(())
}

fn one_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

type CheckResult = Result<Ty, (u64, String)>;

struct Checker {
    env: CelEnv,
    minor: u32,
    /// Comprehension variables, innermost last.
    scopes: Vec<HashMap<String, Ty>>,
    depth: usize,
}

/// Whether a value of type `a` may stand where `b` is wanted (one of them `dyn`, or the same
/// type, element-wise for lists and maps).
fn assignable(a: &Ty, b: &Ty) -> bool {
    match (a, b) {
        (Ty::Dyn, _) | (_, Ty::Dyn) => true,
        (Ty::List(x), Ty::List(y)) => assignable(x, y),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => assignable(k1, k2) && assignable(v1, v2),
        (Ty::Null, Ty::Msg(_) | Ty::Duration | Ty::Timestamp)
        | (Ty::Msg(_) | Ty::Duration | Ty::Timestamp, Ty::Null) => true,
        _ => a == b,
    }
}

/// The common type of a list's elements or a ternary's branches: the type itself when all
/// agree, else `dyn`.
fn join(types: &[Ty]) -> Ty {
    match types.split_first() {
        None => Ty::Dyn,
        Some((first, rest)) if rest.iter().all(|t| t == first) => first.clone(),
        _ => Ty::Dyn,
    }
}

fn is_dyn(t: &Ty) -> bool {
    *t == Ty::Dyn
}

fn no_overload(name: &str, args: &[Ty]) -> String {
    let shown = match name {
        "@in" => "@in".to_string(),
        n => n.to_string(),
    };
    format!(
        "found no matching overload for '{shown}' applied to '({})'",
        args.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

impl Checker {
    fn lookup_ident(&self, name: &str) -> Option<Ty> {
        for scope in self.scopes.iter().rev() {
            if let Some(t) = scope.get(name) {
                return Some(t.clone());
            }
        }
        match (self.env, name) {
            (CelEnv::Disk | CelEnv::Volume, "disk") => Some(Ty::Msg(DISK)),
            (CelEnv::Disk, "system_disk") => Some(Ty::Bool),
            (CelEnv::Volume, "volume") => Some(Ty::Msg(VOLUME)),
            (CelEnv::Link, "link") => Some(Ty::Msg(LINK)),
            (CelEnv::Disk | CelEnv::Volume | CelEnv::OomTrigger | CelEnv::OomScoring, c)
                if SIZE_CONSTANTS.contains(&c) =>
            {
                Some(Ty::Uint)
            }
            (CelEnv::OomTrigger | CelEnv::OomScoring, c) if QOS_CLASSES.contains(&c) => {
                Some(Ty::Int)
            }
            (CelEnv::OomTrigger, "time_since_trigger") => Some(Ty::Duration),
            (CelEnv::OomTrigger, v) => {
                let plain = v.strip_prefix("d_").unwrap_or(v);
                if OOM_ROOT.contains(&plain) {
                    Some(Ty::Double)
                } else if plain.strip_prefix("qos_").is_some_and(|q| {
                    OOM_ROOT.contains(&q)
                        || matches!(q, "memory_current" | "memory_peak" | "memory_max")
                }) {
                    Some(Ty::Map(Box::new(Ty::Int), Box::new(Ty::Double)))
                } else {
                    None
                }
            }
            (CelEnv::OomScoring, "memory_max" | "memory_current" | "memory_peak") => {
                Some(Ty::Optional(Box::new(Ty::Uint)))
            }
            (CelEnv::OomScoring, "path") => Some(Ty::String),
            (CelEnv::OomScoring, "class") => Some(Ty::Int),
            // Type names are values of type `type`.
            (
                _,
                "int" | "uint" | "double" | "bool" | "string" | "bytes" | "list" | "map"
                | "null_type" | "type",
            ) => Some(Ty::Type),
            _ => None,
        }
    }

    fn field(&self, msg: &'static str, field: &str) -> Option<Ty> {
        FIELDS
            .iter()
            .find(|(m, f, _, since)| *m == msg && *f == field && *since <= self.minor)
            .map(|(_, _, k, _)| k.ty())
    }

    fn check(&mut self, e: &IdedExpr) -> CheckResult {
        self.depth += 1;
        if self.depth > 200 {
            return Err((e.id, "expression nests too deeply".into()));
        }
        let out = self.check_inner(e);
        self.depth -= 1;
        out
    }

    fn check_inner(&mut self, e: &IdedExpr) -> CheckResult {
        let id = e.id;
        match &e.expr {
            Expr::Unspecified => Err((id, "empty expression".into())),
            Expr::Literal(l) => Ok(match l {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::Null => Ty::Null,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::UInt(_) => Ty::Uint,
            }),
            Expr::Ident(name) => self.lookup_ident(name).ok_or_else(|| {
                (
                    id,
                    format!("undeclared reference to '{name}' (in container '')"),
                )
            }),
            Expr::Select(sel) => {
                let operand = self.check(&sel.operand)?;
                let field_ty = match &operand {
                    Ty::Msg(m) => self
                        .field(m, &sel.field)
                        .ok_or_else(|| (id, format!("undefined field '{}' of {m}", sel.field)))?,
                    Ty::Map(k, v) if matches!(**k, Ty::String | Ty::Dyn) => (**v).clone(),
                    Ty::Dyn => Ty::Dyn,
                    other => {
                        return Err((
                            id,
                            format!("type '{other}' does not support field selection"),
                        ))
                    }
                };
                Ok(if sel.test { Ty::Bool } else { field_ty })
            }
            Expr::List(list) => {
                let mut types = Vec::new();
                for el in &list.elements {
                    types.push(self.check(el)?);
                }
                Ok(Ty::List(Box::new(join(&types))))
            }
            Expr::Map(map) => {
                let mut keys = Vec::new();
                let mut values = Vec::new();
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            let k = self.check(&me.key)?;
                            if !matches!(k, Ty::Int | Ty::Uint | Ty::Bool | Ty::String | Ty::Dyn) {
                                return Err((me.key.id, format!("unsupported map key type: {k}")));
                            }
                            keys.push(k);
                            values.push(self.check(&me.value)?);
                        }
                        EntryExpr::StructField(_) => {
                            return Err((entry.id, "struct field in a map literal".into()))
                        }
                    }
                }
                Ok(Ty::Map(Box::new(join(&keys)), Box::new(join(&values))))
            }
            Expr::Struct(s) => Err((
                id,
                format!("undeclared reference to type '{}'", s.type_name),
            )),
            Expr::Comprehension(c) => {
                let range = self.check(&c.iter_range)?;
                let (var1, var2) = match &range {
                    Ty::List(t) => (Ty::Int, (**t).clone()),
                    Ty::Map(k, v) => ((**k).clone(), (**v).clone()),
                    Ty::Dyn => (Ty::Dyn, Ty::Dyn),
                    other => {
                        return Err((
                            c.iter_range.id,
                            format!(
                                "expression of type '{other}' cannot be range of a comprehension (must be list, map, or dynamic)"
                            ),
                        ))
                    }
                };
                let mut init = self.check(&c.accu_init)?;
                let mut scope = HashMap::new();
                match &c.iter_var2 {
                    Some(v2) => {
                        scope.insert(c.iter_var.clone(), var1);
                        scope.insert(v2.clone(), var2);
                    }
                    None => {
                        let single = match &range {
                            Ty::List(t) => (**t).clone(),
                            Ty::Map(k, _) => (**k).clone(),
                            _ => Ty::Dyn,
                        };
                        scope.insert(c.iter_var.clone(), single);
                    }
                }
                // An empty list accumulator takes the element type of its first step.
                scope.insert(c.accu_var.clone(), init.clone());
                self.scopes.push(scope);
                let result = (|| {
                    let cond = self.check(&c.loop_cond)?;
                    if !assignable(&cond, &Ty::Bool) {
                        return Err((
                            c.loop_cond.id,
                            format!("loop condition is {cond}, not bool"),
                        ));
                    }
                    let step = self.check(&c.loop_step)?;
                    if init == Ty::List(Box::new(Ty::Dyn)) {
                        if let Ty::List(_) = step {
                            init = step.clone();
                        }
                    }
                    if !assignable(&step, &init) {
                        return Err((
                            c.loop_step.id,
                            format!("comprehension step is {step}, accumulator is {init}"),
                        ));
                    }
                    if let Some(scope) = self.scopes.last_mut() {
                        scope.insert(c.accu_var.clone(), init.clone());
                    }
                    self.check(&c.result)
                })();
                self.scopes.pop();
                result
            }
            Expr::Call(call) => {
                let optional_env = matches!(self.env, CelEnv::OomTrigger | CelEnv::OomScoring);
                if let (true, Some(t)) = (optional_env, &call.target) {
                    if matches!(&t.expr, Expr::Ident(n) if n == "optional") {
                        let mut args = Vec::new();
                        for a in &call.args {
                            args.push(self.check(a)?);
                        }
                        return match (call.func_name.as_str(), args.as_slice()) {
                            ("of" | "ofNonZeroValue", [a]) => Ok(Ty::Optional(Box::new(a.clone()))),
                            ("none", []) => Ok(Ty::Optional(Box::new(Ty::Dyn))),
                            _ => Err((
                                id,
                                no_overload(&format!("optional.{}", call.func_name), &args),
                            )),
                        };
                    }
                }
                let mut args = Vec::new();
                if let Some(t) = &call.target {
                    // A qualified function name such as `a.b()` on no receiver value is not
                    // something Talos declares; the receiver is checked like any operand.
                    args.push(self.check(t)?);
                }
                for a in &call.args {
                    args.push(self.check(a)?);
                }
                self.call(id, &call.func_name, call.target.is_some(), &args)
            }
        }
    }

    fn call(&self, id: u64, name: &str, member: bool, args: &[Ty]) -> CheckResult {
        let fail = || Err((id, no_overload(name, args)));
        let num = |t: &Ty| matches!(t, Ty::Int | Ty::Uint | Ty::Double);
        let ordered = |t: &Ty| {
            matches!(
                t,
                Ty::Int
                    | Ty::Uint
                    | Ty::Double
                    | Ty::String
                    | Ty::Bytes
                    | Ty::Bool
                    | Ty::Timestamp
                    | Ty::Duration
            )
        };
        match (name, member, args) {
            ("_&&_" | "_||_", false, [a, b]) => {
                if assignable(a, &Ty::Bool) && assignable(b, &Ty::Bool) {
                    Ok(Ty::Bool)
                } else {
                    fail()
                }
            }
            ("!_" | "@not_strictly_false", false, [a]) => {
                if assignable(a, &Ty::Bool) {
                    Ok(Ty::Bool)
                } else {
                    fail()
                }
            }
            ("_?_:_", false, [c, a, b]) => {
                if !assignable(c, &Ty::Bool) {
                    return fail();
                }
                if is_dyn(a) || is_dyn(b) {
                    Ok(if a == b { a.clone() } else { Ty::Dyn })
                } else if assignable(a, b) {
                    Ok(if *a == Ty::Null { b.clone() } else { a.clone() })
                } else {
                    fail()
                }
            }
            ("_==_" | "_!=_", false, [a, b]) => {
                if assignable(a, b) {
                    Ok(Ty::Bool)
                } else {
                    fail()
                }
            }
            ("_<_" | "_<=_" | "_>_" | "_>=_", false, [a, b]) => {
                let ok = match (is_dyn(a), is_dyn(b)) {
                    (true, true) => true,
                    (true, false) => ordered(b),
                    (false, true) => ordered(a),
                    (false, false) => a == b && ordered(a),
                };
                if ok {
                    Ok(Ty::Bool)
                } else {
                    fail()
                }
            }
            ("_+_", false, [a, b]) => match (a, b) {
                (Ty::Dyn, Ty::Dyn) => Ok(Ty::Dyn),
                (Ty::Dyn, t) | (t, Ty::Dyn)
                    if num(t)
                        || matches!(
                            t,
                            Ty::String | Ty::Bytes | Ty::List(_) | Ty::Duration | Ty::Timestamp
                        ) =>
                {
                    Ok(if matches!(t, Ty::Duration | Ty::Timestamp) {
                        Ty::Dyn
                    } else {
                        t.clone()
                    })
                }
                (Ty::List(x), Ty::List(y)) => Ok(Ty::List(Box::new(if x == y {
                    (**x).clone()
                } else {
                    Ty::Dyn
                }))),
                (Ty::Timestamp, Ty::Duration) | (Ty::Duration, Ty::Timestamp) => Ok(Ty::Timestamp),
                (x, y)
                    if x == y && (num(x) || matches!(x, Ty::String | Ty::Bytes | Ty::Duration)) =>
                {
                    Ok(x.clone())
                }
                _ => fail(),
            },
            ("_-_", false, [a, b]) => match (a, b) {
                (Ty::Timestamp, Ty::Timestamp) => Ok(Ty::Duration),
                (Ty::Timestamp, Ty::Duration) => Ok(Ty::Timestamp),
                (Ty::Dyn, t) | (t, Ty::Dyn) if num(t) || is_dyn(t) => Ok(t.clone()),
                (Ty::Dyn, Ty::Duration | Ty::Timestamp)
                | (Ty::Duration | Ty::Timestamp, Ty::Dyn) => Ok(Ty::Dyn),
                (x, y) if x == y && (num(x) || *x == Ty::Duration) => Ok(x.clone()),
                _ => fail(),
            },
            ("_*_" | "_/_", false, [a, b]) => match (a, b) {
                (Ty::Dyn, t) | (t, Ty::Dyn) if num(t) || is_dyn(t) => Ok(t.clone()),
                (x, y) if x == y && num(x) => Ok(x.clone()),
                _ => fail(),
            },
            ("_%_", false, [a, b]) => match (a, b) {
                (Ty::Dyn, t) | (t, Ty::Dyn) if matches!(t, Ty::Int | Ty::Uint | Ty::Dyn) => {
                    Ok(t.clone())
                }
                (x, y) if x == y && matches!(x, Ty::Int | Ty::Uint) => Ok(x.clone()),
                _ => fail(),
            },
            ("-_", false, [a]) => match a {
                Ty::Int | Ty::Double | Ty::Dyn | Ty::Duration => Ok(a.clone()),
                _ => fail(),
            },
            ("_[_]", false, [c, i]) => match c {
                Ty::List(t) if assignable(i, &Ty::Int) => Ok((**t).clone()),
                Ty::Map(k, v) if assignable(i, k) => Ok((**v).clone()),
                Ty::Dyn => Ok(Ty::Dyn),
                _ => fail(),
            },
            ("@in", false, [x, c]) => match c {
                Ty::List(t) if assignable(x, t) => Ok(Ty::Bool),
                Ty::Map(k, _) if assignable(x, k) => Ok(Ty::Bool),
                Ty::Dyn => Ok(Ty::Bool),
                _ => fail(),
            },
            ("size", _, [a]) => match a {
                Ty::String | Ty::Bytes | Ty::List(_) | Ty::Map(_, _) | Ty::Dyn => Ok(Ty::Int),
                _ => fail(),
            },
            ("contains" | "startsWith" | "endsWith", true, [s, p]) => {
                if assignable(s, &Ty::String) && assignable(p, &Ty::String) {
                    Ok(Ty::Bool)
                } else {
                    fail()
                }
            }
            ("matches", _, [s, p]) => {
                if assignable(s, &Ty::String) && assignable(p, &Ty::String) {
                    Ok(Ty::Bool)
                } else {
                    fail()
                }
            }
            ("int", false, [a]) => conv(
                a,
                &[
                    Ty::Int,
                    Ty::Uint,
                    Ty::Double,
                    Ty::String,
                    Ty::Duration,
                    Ty::Timestamp,
                ],
                Ty::Int,
            )
            .map_or_else(fail, Ok),
            ("uint", false, [a]) => conv(a, &[Ty::Uint, Ty::Int, Ty::Double, Ty::String], Ty::Uint)
                .map_or_else(fail, Ok),
            ("double", false, [a]) => {
                conv(a, &[Ty::Double, Ty::Int, Ty::Uint, Ty::String], Ty::Double)
                    .map_or_else(fail, Ok)
            }
            ("string", false, [a]) => conv(
                a,
                &[
                    Ty::String,
                    Ty::Bool,
                    Ty::Bytes,
                    Ty::Double,
                    Ty::Duration,
                    Ty::Int,
                    Ty::Timestamp,
                    Ty::Uint,
                ],
                Ty::String,
            )
            .map_or_else(fail, Ok),
            ("bytes", false, [a]) => {
                conv(a, &[Ty::Bytes, Ty::String], Ty::Bytes).map_or_else(fail, Ok)
            }
            ("bool", false, [a]) => {
                conv(a, &[Ty::Bool, Ty::String], Ty::Bool).map_or_else(fail, Ok)
            }
            ("duration", false, [a]) => {
                conv(a, &[Ty::Duration, Ty::Int, Ty::String], Ty::Duration).map_or_else(fail, Ok)
            }
            ("timestamp", false, [a]) => {
                conv(a, &[Ty::Timestamp, Ty::Int, Ty::String], Ty::Timestamp).map_or_else(fail, Ok)
            }
            ("dyn", false, [_]) => Ok(Ty::Dyn),
            ("type", false, [_]) => Ok(Ty::Type),
            (
                "getFullYear" | "getMonth" | "getDayOfYear" | "getDayOfMonth" | "getDate"
                | "getDayOfWeek",
                true,
                [t, rest @ ..],
            ) if rest.len() <= 1 => {
                if assignable(t, &Ty::Timestamp) && rest.iter().all(|z| assignable(z, &Ty::String))
                {
                    Ok(Ty::Int)
                } else {
                    fail()
                }
            }
            (
                "getHours" | "getMinutes" | "getSeconds" | "getMilliseconds",
                true,
                [t, rest @ ..],
            ) if rest.len() <= 1 => {
                let ok = (assignable(t, &Ty::Timestamp)
                    && rest.iter().all(|z| assignable(z, &Ty::String)))
                    || (*t == Ty::Duration && rest.is_empty());
                if ok {
                    Ok(Ty::Int)
                } else {
                    fail()
                }
            }
            // Optional values (the OOM environments declare `cel.OptionalTypes()`).
            ("hasValue", true, [Ty::Optional(_)]) => Ok(Ty::Bool),
            ("value", true, [Ty::Optional(t)]) => Ok((**t).clone()),
            ("orValue", true, [Ty::Optional(t), d]) if assignable(d, t) => Ok((**t).clone()),
            ("or", true, [Ty::Optional(t), Ty::Optional(u)]) if assignable(u, t) => {
                Ok(Ty::Optional(t.clone()))
            }
            ("_?._", false, [Ty::Dyn | Ty::Msg(_) | Ty::Map(_, _) | Ty::Optional(_), _]) => {
                Ok(Ty::Optional(Box::new(Ty::Dyn)))
            }
            ("_[?_]", false, [c, _]) => match c {
                Ty::List(t) | Ty::Map(_, t) => Ok(Ty::Optional(t.clone())),
                Ty::Dyn | Ty::Optional(_) => Ok(Ty::Optional(Box::new(Ty::Dyn))),
                _ => fail(),
            },
            ("multiply_qos_vectors", false, [a, b]) if self.env == CelEnv::OomTrigger => {
                let map_of_double = |t: &Ty| match t {
                    Ty::Map(_, v) => assignable(v, &Ty::Double),
                    Ty::Dyn => true,
                    _ => false,
                };
                if map_of_double(a) && map_of_double(b) {
                    Ok(Ty::Double)
                } else {
                    fail()
                }
            }
            // Talos' own functions.
            ("glob", false, [p, s]) if matches!(self.env, CelEnv::Disk | CelEnv::Link) => {
                if assignable(p, &Ty::String) && assignable(s, &Ty::String) {
                    Ok(Ty::Bool)
                } else {
                    fail()
                }
            }
            ("mac", false, [b]) if self.env == CelEnv::Link => {
                if assignable(b, &Ty::Bytes) {
                    Ok(Ty::String)
                } else {
                    fail()
                }
            }
            _ if is_declared(name, self.env) => fail(),
            _ => Err((
                id,
                format!("undeclared reference to '{name}' (in container '')"),
            )),
        }
    }
}

/// A conversion function's result, if `a` is one of the types it converts from.
fn conv(a: &Ty, from: &[Ty], to: Ty) -> Option<Ty> {
    (is_dyn(a) || from.contains(a)).then_some(to)
}

/// Whether `name` is a function of the environment at all (so a bad call is a missing overload
/// rather than an unknown function).
fn is_declared(name: &str, env: CelEnv) -> bool {
    const STD: &[&str] = &[
        "_&&_",
        "_||_",
        "!_",
        "@not_strictly_false",
        "_?_:_",
        "_==_",
        "_!=_",
        "_<_",
        "_<=_",
        "_>_",
        "_>=_",
        "_+_",
        "_-_",
        "_*_",
        "_/_",
        "_%_",
        "-_",
        "_[_]",
        "@in",
        "size",
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "bool",
        "duration",
        "timestamp",
        "dyn",
        "type",
        "getFullYear",
        "getMonth",
        "getDayOfYear",
        "getDayOfMonth",
        "getDate",
        "getDayOfWeek",
        "getHours",
        "getMinutes",
        "getSeconds",
        "getMilliseconds",
    ];
    let optional = matches!(env, CelEnv::OomTrigger | CelEnv::OomScoring);
    STD.contains(&name)
        || (optional
            && matches!(
                name,
                "hasValue" | "value" | "orValue" | "or" | "_?._" | "_[?_]"
            ))
        || (name == "multiply_qos_vectors" && env == CelEnv::OomTrigger)
        || (name == "glob" && matches!(env, CelEnv::Disk | CelEnv::Link))
        || (name == "mac" && env == CelEnv::Link)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: TalosVersion = TalosVersion::new(1, 13, 0);

    #[test]
    fn talos_examples_check() {
        // The examples Talos' own docs and defaults use.
        for (env, e) in [
            (CelEnv::Disk, r#"disk.transport == "nvme""#),
            (CelEnv::Disk, "disk.size > 120u * GB && disk.size < 1u * TB"),
            (
                CelEnv::Disk,
                r#"disk.transport == "sata" && !disk.rotational && !system_disk"#,
            ),
            (CelEnv::Disk, r#"glob("/dev/sd*", disk.dev_path)"#),
            (
                CelEnv::Disk,
                r#"has(disk.serial) && disk.symlinks.exists(s, s.startsWith("/dev/disk/by-id/"))"#,
            ),
            (CelEnv::Volume, r#"volume.partition_label == "MY-DATA""#),
            (
                CelEnv::Volume,
                r#"volume.name == "xfs" && disk.serial == "SERIAL123""#,
            ),
            (
                CelEnv::Link,
                r#"mac(link.permanent_addr) == "00:1a:2b:3c:4d:5e""#,
            ),
            (
                CelEnv::Link,
                r#"glob("00:1a:2b:*", mac(link.permanent_addr))"#,
            ),
            (CelEnv::Link, r#"link.driver == "e1000""#),
            (CelEnv::Link, "link.type == 1 && link.bond_master.mode == 4"),
            (CelEnv::Disk, "[1u, 2u].map(x, x * GiB).all(y, y > 0u)"),
            (CelEnv::Disk, r#"disk.model in ["A", "B"] ? true : false"#),
        ] {
            assert_eq!(check_bool(e, env, V), Ok(()), "{e}");
        }
    }

    #[test]
    fn refusals() {
        for (env, e, want) in [
            (
                CelEnv::Disk,
                "disk.size > 100",
                "'_>_' applied to '(uint, int)'",
            ),
            (
                CelEnv::Disk,
                "disk.size > 100 * GiB",
                "'_*_' applied to '(int, uint)'",
            ),
            (CelEnv::Disk, "disk.serial == 5", "'_==_'"),
            (
                CelEnv::Disk,
                r#"disk.vendor == "x""#,
                "undefined field 'vendor'",
            ),
            (
                CelEnv::Disk,
                r#"dsk.model == "x""#,
                "undeclared reference to 'dsk'",
            ),
            (
                CelEnv::Disk,
                r#"volume.name == "x""#,
                "undeclared reference to 'volume'",
            ),
            (
                CelEnv::Volume,
                "system_disk",
                "undeclared reference to 'system_disk'",
            ),
            (
                CelEnv::Volume,
                r#"glob("a", volume.name)"#,
                "undeclared reference to 'glob'",
            ),
            (
                CelEnv::Disk,
                r#"disk.model.lowerAscii() == "x""#,
                "undeclared reference to 'lowerAscii'",
            ),
            (CelEnv::Disk, "disk.dev_path", "output type is string"),
            (CelEnv::Disk, "disk.model ==", "does not parse"),
            (
                CelEnv::Disk,
                r#"mac(disk.serial) == "x""#,
                "undeclared reference to 'mac'",
            ),
            (
                CelEnv::Link,
                r#"link.name == "eth0""#,
                "undefined field 'name'",
            ),
            (
                CelEnv::Disk,
                r#"disk.firmware_version == "1""#,
                "undefined field",
            ),
        ] {
            let got = check_bool(e, env, V).expect_err(e);
            assert!(got.contains(want), "{e}: {got}");
        }
    }

    #[test]
    fn oom_environments() {
        // Talos' default OOM expressions (pkg/machinery/config/types/runtime/oom.go).
        let trigger = "multiply_qos_vectors(d_qos_memory_full_total, {Besteffort: 1.0, Burstable: 0.2, Guaranteed: 0.0, Podruntime: 0.0, System: 0.0}) > 3000.0 && memory_full_avg10 > 12.0 && time_since_trigger > duration(\"500ms\")";
        assert_eq!(check_bool(trigger, CelEnv::OomTrigger, V), Ok(()));
        let rank = "memory_max.hasValue() ? double(memory_current.orValue(0u)) / double(memory_max.value()) : double(memory_current.orValue(0u)) / 1024.0 / 1024.0";
        assert_eq!(check_double(rank, CelEnv::OomScoring, V), Ok(()));
        // Talos' own defaults (DefaultOOMTriggerExpression / DefaultOOMCgroupRankingExpression
        // in pkg/machinery/constants/constants.go at v1.12.11).
        let default_trigger = "(multiply_qos_vectors(d_qos_memory_full_total, {System: 8.0, Podruntime: 4.0}) > 3000.0 &&\n multiply_qos_vectors(qos_memory_full_avg10, {System: 1.0, Podruntime: 1.0}) > 5.0 && time_since_trigger > duration(\"5s\")) ||\n (memory_full_avg10 > 75.0 && time_since_trigger > duration(\"10s\"))";
        assert_eq!(check_bool(default_trigger, CelEnv::OomTrigger, V), Ok(()));
        let default_rank = "memory_max.hasValue() ? 0.0 :\n {Besteffort: 1.0, Burstable: 0.5, Guaranteed: 0.0, Podruntime: 0.0, System: 0.0}[class] *\n double(memory_current.orValue(0u))";
        assert_eq!(check_double(default_rank, CelEnv::OomScoring, V), Ok(()));
        assert!(check_double("memory_current > 5u", CelEnv::OomScoring, V).is_err());
        assert!(check_bool("memory_full_avg10 > 12", CelEnv::OomTrigger, V).is_err());
        assert!(check_bool("disk.size > 1u", CelEnv::OomTrigger, V).is_err());
    }

    #[test]
    fn fields_follow_the_release() {
        let v14 = TalosVersion::new(1, 14, 0);
        assert_eq!(
            check_bool(r#"disk.firmware_version == "1""#, CelEnv::Disk, v14),
            Ok(())
        );
        assert!(check_bool(
            r#"link.driver == "x""#,
            CelEnv::Link,
            TalosVersion::new(1, 11, 0)
        )
        .is_err());
        assert!(check_bool(r#"link.veth.peer_name == "x""#, CelEnv::Link, V).is_err());
        assert_eq!(
            check_bool(r#"link.veth.peer_name == "x""#, CelEnv::Link, v14),
            Ok(())
        );
    }
}
