//! Reading Redfish JSON leniently: properties, `@odata.id` links, collection members across
//! `Members@odata.nextLink` pages, and optional text fields (unknown enum values stay text).
//!
//! A property shown as `null` is an absent one: BMCs (AMI MegaRAC among them) list properties they
//! do not support with a `null` value. Every reader of Redfish JSON in `bmc` goes through `prop`
//! or `at`, so what the capability probe reports and what an operation does always agree.

use serde_json::Value;

use super::transport::Transport;
use super::BmcError;

/// Most pages followed in one collection; a BMC that links pages in a loop stops here.
const MAX_PAGES: usize = 64;

/// The property `key` of a resource; `None` when it is absent or `null`.
pub(crate) fn prop<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|p| !p.is_null())
}

/// The value at a JSON pointer (RFC 6901); `None` when it, or anything on the way, is absent or
/// `null`.
pub(crate) fn at<'a>(v: &'a Value, pointer: &str) -> Option<&'a Value> {
    v.pointer(pointer).filter(|p| !p.is_null())
}

/// The action `name` (e.g. `#ComputerSystem.Reset`) of a resource's `Actions`.
pub(crate) fn action<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    prop(v, "Actions").and_then(|a| prop(a, name))
}

/// `v[key]["@odata.id"]`.
pub(crate) fn link(v: &Value, key: &str) -> Option<String> {
    prop(v, key).and_then(|l| text(l, "@odata.id"))
}

/// Links of an array of `{"@odata.id": ...}` at a JSON pointer.
pub(crate) fn links_at(v: &Value, pointer: &str) -> Vec<String> {
    list_at(v, pointer)
        .iter()
        .filter_map(|m| text(m, "@odata.id"))
        .collect()
}

/// A text property, trimmed; `None` when absent, null, not text, or blank.
pub(crate) fn text(v: &Value, key: &str) -> Option<String> {
    text_of(prop(v, key))
}

/// A text value at a JSON pointer, trimmed; `None` when absent, null, not text, or blank.
pub(crate) fn text_at(v: &Value, pointer: &str) -> Option<String> {
    text_of(at(v, pointer))
}

fn text_of(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A boolean property; `None` when absent, null or not a boolean.
pub(crate) fn flag(v: &Value, key: &str) -> Option<bool> {
    prop(v, key).and_then(Value::as_bool)
}

/// A non-negative integer property; `None` when absent, null or not one.
pub(crate) fn number(v: &Value, key: &str) -> Option<u64> {
    prop(v, key).and_then(Value::as_u64)
}

/// An array property; empty when absent, null or not an array.
pub(crate) fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    prop(v, key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// An array at a JSON pointer; empty when absent, null or not an array.
pub(crate) fn list_at<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    at(v, pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A list of text values at a JSON pointer (null members and non-text members skipped).
pub(crate) fn texts_at(v: &Value, pointer: &str) -> Vec<String> {
    list_at(v, pointer)
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// Compare two links ignoring a trailing slash and the origin.
pub(crate) fn same_link(a: &str, b: &str) -> bool {
    fn norm(s: &str) -> &str {
        let s = s.split('#').next().unwrap_or(s);
        let s = match s
            .strip_prefix("https://")
            .or_else(|| s.strip_prefix("http://"))
        {
            Some(rest) => rest.find('/').map(|i| &rest[i..]).unwrap_or("/"),
            None => s,
        };
        s.trim_end_matches('/')
    }
    norm(a) == norm(b)
}

/// Whether `link` lies under `prefix` (path-wise).
pub(crate) fn under(link: &str, prefix: &str) -> bool {
    let p = prefix.trim_end_matches('/');
    let l = link.trim_end_matches('/');
    l == p || l.starts_with(&format!("{p}/"))
}

/// Member links of a collection, following `Members@odata.nextLink` pages.
pub(crate) async fn members(t: &Transport, collection: &str) -> Result<Vec<String>, BmcError> {
    let mut out: Vec<String> = Vec::new();
    let mut seen_pages: Vec<String> = Vec::new();
    let mut next = Some(collection.to_string());
    while let Some(page) = next.take() {
        if seen_pages.iter().any(|p| same_link(p, &page)) {
            tracing::warn!(collection, page, "BMC collection pages loop; stopping");
            break;
        }
        if seen_pages.len() >= MAX_PAGES {
            return Err(BmcError::Protocol {
                path: t.path_of(collection),
                reason: format!("more than {MAX_PAGES} pages of members"),
            });
        }
        seen_pages.push(page.clone());
        let doc = t.get(&page).await?;
        for m in links_at(&doc.json, "/Members") {
            if !out.iter().any(|o| same_link(o, &m)) {
                out.push(m);
            }
        }
        next = text(&doc.json, "Members@odata.nextLink");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lenient_fields() {
        let v = json!({"A": " x ", "B": null, "C": "", "D": 3, "L": {"@odata.id": "/r/1"},
            "M": [{"@odata.id": "/r/a"}, {"x": 1}, {"@odata.id": ""}], "T": ["a", 1, "b"]});
        assert_eq!(text(&v, "A").as_deref(), Some("x"));
        assert_eq!(text(&v, "B"), None);
        assert_eq!(text(&v, "C"), None);
        assert_eq!(text(&v, "D"), None);
        assert_eq!(text(&v, "Z"), None);
        assert_eq!(link(&v, "L").as_deref(), Some("/r/1"));
        assert_eq!(links_at(&v, "/M"), vec!["/r/a".to_string()]);
        assert_eq!(texts_at(&v, "/T"), vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn null_is_absent() {
        let v = json!({"Boot": null, "PowerState": null, "UUID": null, "Inserted": null,
            "CapacityBytes": null, "Members": null, "Link": null, "Actions": {"#A.B": null},
            "Sys": {"Boot": {"BootSourceOverrideMode": null,
                "BootSourceOverrideTarget@Redfish.AllowableValues": null}},
            "Mixed": ["a", null, "b"], "Links": [{"@odata.id": null}, {"@odata.id": "/r/1"}]});
        for key in [
            "Boot",
            "PowerState",
            "UUID",
            "Inserted",
            "CapacityBytes",
            "Members",
            "Nope",
        ] {
            assert_eq!(prop(&v, key), None, "{key}");
        }
        assert!(prop(&v, "Sys").is_some());
        assert_eq!(at(&v, "/Sys/Boot/BootSourceOverrideMode"), None);
        assert_eq!(at(&v, "/Boot/BootSourceOverrideMode"), None);
        assert_eq!(text(&v, "PowerState"), None);
        assert_eq!(text_at(&v, "/Sys/Boot/BootSourceOverrideMode"), None);
        assert_eq!(flag(&v, "Inserted"), None);
        assert_eq!(number(&v, "CapacityBytes"), None);
        assert!(list(&v, "Members").is_empty());
        assert!(texts_at(
            &v,
            "/Sys/Boot/BootSourceOverrideTarget@Redfish.AllowableValues"
        )
        .is_empty());
        assert_eq!(
            texts_at(&v, "/Mixed"),
            vec!["a".to_string(), "b".to_string()]
        );
        assert_eq!(link(&v, "Link"), None);
        assert_eq!(links_at(&v, "/Links"), vec!["/r/1".to_string()]);
        assert_eq!(action(&v, "#A.B"), None);
        assert_eq!(action(&v, "#Missing"), None);
    }

    #[test]
    fn link_comparison() {
        assert!(same_link("/redfish/v1/Systems/", "/redfish/v1/Systems"));
        assert!(same_link(
            "https://x/redfish/v1/Systems#/a",
            "/redfish/v1/Systems"
        ));
        assert!(!same_link("/redfish/v1/Systems/1", "/redfish/v1/Systems"));
        assert!(under(
            "/redfish/v1/Managers/1/VirtualMedia",
            "/redfish/v1/Managers/1/"
        ));
        assert!(!under("/redfish/v1/Managers/10", "/redfish/v1/Managers/1"));
    }
}
