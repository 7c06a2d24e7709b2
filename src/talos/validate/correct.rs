//! Corrections of Talos' published JSON schema where it disagrees with the decoder Talos
//! actually runs: the schema is generated from doc comments (`docgen`), and in a few places it
//! describes a field differently from the Go type the YAML decoder fills. Talos accepts what its
//! decoder accepts, so the schema is corrected to the decoder's type before it is compiled. Each
//! correction names the Talos file of the Go type, applies only where the schema still has the
//! wrong shape (a schema that is already right is left as it is), and leaves value rules to the
//! ported `Validate()` of the document.

use serde_json::{json, Value};

/// Correct `schema` (a `config.schema.json` of any release) in place.
pub(super) fn correct_schema(schema: &mut Value) {
    let Some(defs) = schema.get_mut("$defs").and_then(Value::as_object_mut) else {
        return;
    };

    // `clientIdentity` of the RegistryTLSConfig document is a `meta.CertificateAndKey`
    // (pkg/machinery/config/types/cri/registry_tls.go; the type is in
    // pkg/machinery/config/types/meta/certificate_key.go), whose YAML keys are `cert` and `key`.
    // The 1.12 and 1.13 schemas name them `crt` and `key` (the v1alpha1 spelling).
    if let Some(ci) = defs
        .get_mut("cri.RegistryTLSConfigV1Alpha1")
        .and_then(|d| d.pointer_mut("/properties/clientIdentity/properties"))
        .and_then(Value::as_object_mut)
    {
        if !ci.contains_key("cert") {
            if let Some(crt) = ci.remove("crt") {
                ci.insert("cert".into(), crt);
            }
        }
    }

    // `acceptedCAs` of the v1alpha1 machine and cluster sections is a list of
    // `*x509.PEMEncodedCertificate` (pkg/machinery/config/types/v1alpha1/v1alpha1_types.go,
    // `MachineAcceptedCAs`, `ClusterAcceptedCAs`); every schema from 1.11 to 1.14 describes one
    // object `{crt}` instead of a list of them.
    for def in ["v1alpha1.MachineConfig", "v1alpha1.ClusterConfig"] {
        if let Some(field) = defs
            .get_mut(def)
            .and_then(|d| d.pointer_mut("/properties/acceptedCAs"))
        {
            if field.get("type").and_then(Value::as_str) == Some("object") {
                list_of_objects(field);
            }
        }
    }

    // Lists of strings that the schema gives an `enum` of single values (docgen's `values:` on a
    // `[]string` field), so a list fails the enum: the decoder takes any strings, and the
    // document's `Validate()` (ported in `kinds`) decides which are allowed.
    // - `dependsOn.networks` and `userVolume.options` of ContainerConfig, `[]string`
    //   (pkg/machinery/config/types/container/runtime.go, mounts.go; 1.14);
    // - `options` of the encryption spec, `EncryptionPerfOptions []string`
    //   (pkg/machinery/config/types/block/encryption.go; 1.11 and 1.12), which Talos does not
    //   check at all.
    for (def, prop) in [
        ("container.ContainerDependsOn", "networks"),
        ("container.UserVolumeMount", "options"),
        ("block.EncryptionSpec", "options"),
    ] {
        if let Some(field) = defs
            .get_mut(def)
            .and_then(|d| d.pointer_mut(&format!("/properties/{prop}")))
            .and_then(Value::as_object_mut)
        {
            if field.contains_key("enum") && !field.contains_key("type") {
                field.remove("enum");
                field.insert("type".into(), json!("array"));
                field.insert("items".into(), json!({"type": "string"}));
            }
        }
    }
}

/// Turn an object schema into a list of such objects, keeping its annotations on the list.
fn list_of_objects(field: &mut Value) {
    let Some(obj) = field.as_object_mut() else {
        return;
    };
    let mut item = serde_json::Map::new();
    for key in ["properties", "additionalProperties", "type", "required"] {
        if let Some(v) = obj.remove(key) {
            item.insert(key.into(), v);
        }
    }
    obj.insert("type".into(), json!("array"));
    obj.insert("items".into(), Value::Object(item));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrections_apply_once() {
        let mut s = json!({"$defs": {
            "v1alpha1.MachineConfig": {"properties": {"acceptedCAs": {
                "type": "object", "title": "acceptedCAs",
                "properties": {"crt": {"type": "string"}}, "additionalProperties": false}}},
            "cri.RegistryTLSConfigV1Alpha1": {"properties": {"clientIdentity": {
                "properties": {"crt": {"type": "string"}, "key": {"type": "string"}}}}},
            "container.ContainerDependsOn": {"properties": {"networks": {"enum": ["addresses"]}}}
        }});
        correct_schema(&mut s);
        let once = s.clone();
        correct_schema(&mut s);
        assert_eq!(s, once);
        let ca = &s["$defs"]["v1alpha1.MachineConfig"]["properties"]["acceptedCAs"];
        assert_eq!(ca["type"], "array");
        assert_eq!(ca["title"], "acceptedCAs");
        assert_eq!(ca["items"]["properties"]["crt"]["type"], "string");
        let ci = &s["$defs"]["cri.RegistryTLSConfigV1Alpha1"]["properties"]["clientIdentity"];
        assert!(ci["properties"].get("cert").is_some());
        assert!(ci["properties"].get("crt").is_none());
        let n = &s["$defs"]["container.ContainerDependsOn"]["properties"]["networks"];
        assert_eq!(n["items"]["type"], "string");
        assert!(n.get("enum").is_none());
    }
}
