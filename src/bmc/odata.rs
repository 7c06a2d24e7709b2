//! Reading Redfish JSON leniently: `@odata.id` links, collection members across
//! `Members@odata.nextLink` pages, and optional text fields (absent, `null` and blank are all "not
//! reported"; unknown enum values stay text).

use serde_json::Value;

use super::transport::Transport;
use super::BmcError;

/// Most pages followed in one collection; a BMC that links pages in a loop stops here.
const MAX_PAGES: usize = 64;

/// `v[key]["@odata.id"]`.
pub(crate) fn link(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(|l| l.get("@odata.id"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Links of an array of `{"@odata.id": ...}` at a JSON pointer.
pub(crate) fn links_at(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|m| m.get("@odata.id").and_then(Value::as_str))
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A text field, trimmed; `None` when absent, null, not text, or blank.
pub(crate) fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A list of text values at a JSON pointer.
pub(crate) fn texts_at(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
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
        next = doc
            .json
            .get("Members@odata.nextLink")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string);
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
