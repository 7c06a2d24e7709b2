//! The typed merge rules of Talos' config patcher, as data: which lists are replaced, which merge
//! by a key, which maps replace per key. Pure data and one lookup; imports nothing.

/// How a list or mapping at a given place merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeRule {
    /// Lists append; mappings merge key by key.
    Default,
    /// The patch value replaces the config value wholesale (`merge:"replace"` in Talos).
    Replace,
    /// List items that agree on the first of these keys the patch item sets are merged; others
    /// are appended.
    KeyedMerge(&'static [&'static str]),
    /// List items that agree on this key are replaced by the patch item; others are appended.
    KeyedReplace(&'static str),
    /// Mapping values replace per key (Talos `extraArgs`).
    PerKey,
}

/// The typed merge rules of Talos, by document kind and path (`[]` stands for "any list item").
/// Sources: fields tagged `merge:"replace"` and types with their own `Merge` method in Talos'
/// `pkg/machinery/config/types`.
pub const RULES: &[(&str, &str, MergeRule)] = &[
    (
        "v1alpha1",
        "machine.network.interfaces",
        MergeRule::KeyedMerge(&["interface", "deviceSelector"]),
    ),
    (
        "v1alpha1",
        "machine.network.interfaces[].vlans",
        MergeRule::KeyedMerge(&["vlanId"]),
    ),
    (
        "v1alpha1",
        "cluster.apiServer.admissionControl",
        MergeRule::KeyedMerge(&["name"]),
    ),
    ("v1alpha1", "cluster.network.podSubnets", MergeRule::Replace),
    (
        "v1alpha1",
        "cluster.network.serviceSubnets",
        MergeRule::Replace,
    ),
    (
        "v1alpha1",
        "cluster.apiServer.auditPolicy",
        MergeRule::Replace,
    ),
    ("v1alpha1", "machine.kubelet.extraArgs", MergeRule::PerKey),
    ("v1alpha1", "cluster.apiServer.extraArgs", MergeRule::PerKey),
    (
        "v1alpha1",
        "cluster.controllerManager.extraArgs",
        MergeRule::PerKey,
    ),
    ("v1alpha1", "cluster.scheduler.extraArgs", MergeRule::PerKey),
    ("v1alpha1", "cluster.proxy.extraArgs", MergeRule::PerKey),
    ("v1alpha1", "cluster.etcd.extraArgs", MergeRule::PerKey),
    (
        "ExtensionServiceConfig",
        "configFiles",
        MergeRule::KeyedMerge(&["mountPath"]),
    ),
    ("NetworkRuleConfig", "ingress", MergeRule::Replace),
    (
        "NetworkRuleConfig",
        "portSelector.ports",
        MergeRule::Replace,
    ),
    ("KubeNetworkConfig", "podSubnets", MergeRule::Replace),
    ("KubeNetworkConfig", "serviceSubnets", MergeRule::Replace),
    ("KubeAuditPolicyConfig", "configuration", MergeRule::Replace),
    (
        "KubeAuthenticationConfig",
        "configuration",
        MergeRule::Replace,
    ),
    (
        "KubeCredentialProviderConfig",
        "configuration",
        MergeRule::Replace,
    ),
    ("KubeStaticPodConfig", "pod", MergeRule::Replace),
    ("BGPInstanceConfig", "advertise", MergeRule::Replace),
    ("BGPInstanceConfig", "importRoutes", MergeRule::Replace),
    ("BGPInstanceConfig", "neighbors", MergeRule::Replace),
    ("CRIBaseRuntimeSpecConfig", "overrides", MergeRule::Replace),
    (
        "ImageVerificationConfig",
        "rules",
        MergeRule::KeyedReplace("image"),
    ),
    ("KubeAPIServerConfig", "extraArgs", MergeRule::PerKey),
    (
        "KubeControllerManagerConfig",
        "extraArgs",
        MergeRule::PerKey,
    ),
    ("KubeSchedulerConfig", "extraArgs", MergeRule::PerKey),
    ("KubeProxyConfig", "extraArgs", MergeRule::PerKey),
    ("KubeletConfig", "extraArgs", MergeRule::PerKey),
];

/// The merge rule for a place in a document of the given kind.
pub fn rule_for(kind: &str, rule_path: &str) -> MergeRule {
    RULES
        .iter()
        .find(|(k, p, _)| *k == kind && *p == rule_path)
        .map(|(_, _, r)| *r)
        .unwrap_or(MergeRule::Default)
}
