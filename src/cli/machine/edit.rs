//! `plinth machine edit`, beyond one machine's `--set`: one NIC of a machine (`--nic MAC --set
//! ipv4=...`, the other NICs left as they are) and many machines at once (`--rack r21 --set ...`,
//! also `--site`, `--cluster`, `--role`), which prints how many machines match and asks before
//! changing them (`--yes` skips the question). Each machine is patched at the version it was
//! listed at (If-Match), so one edited by someone else meanwhile is refused, not overwritten; the
//! others are changed. A bulk edit is one request per machine, not one transaction.
//!
//! Imports `cli::api`, `cli::output` and `domain` (the MAC parser) only.

use std::io::BufRead;

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::{json, Map, Value};

use crate::cli::api::ApiClient;
use crate::cli::output::{s, say};
use crate::domain::MacAddr;

/// The keys `--nic MAC --set KEY=VALUE` changes on that NIC.
const NIC_KEYS: &[&str] = &["mac", "ipv4", "boot", "name"];

/// The merge patch that changes the NIC `mac` of `machine` (a machine as the API shows it) by
/// `pairs` (`KEY=VALUE`, an empty value clearing `ipv4` or `name`): the whole `interfaces` array,
/// since a merge patch replaces arrays, with every other NIC as it was.
pub(super) fn nic_patch(machine: &Value, mac: &str, pairs: &[String]) -> anyhow::Result<Value> {
    let want: MacAddr = mac
        .parse()
        .map_err(|e| anyhow::anyhow!("--nic {mac}: {e}"))?;
    let mut nics: Vec<Value> = machine["interfaces"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let known: Vec<String> = nics.iter().map(|n| s(&n["mac"])).collect();
    let nic = nics
        .iter_mut()
        .find(|n| {
            n["mac"]
                .as_str()
                .and_then(|m| m.parse::<MacAddr>().ok())
                .is_some_and(|m| m == want)
        })
        .with_context(|| {
            format!(
                "{} has no NIC {want} (its NICs: {})",
                s(&machine["hostname"]),
                known.join(", ")
            )
        })?;
    let obj = nic.as_object_mut().context("a NIC is an object")?;
    for pair in pairs {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("`{pair}` is not KEY=VALUE"))?;
        if !NIC_KEYS.contains(&k) {
            bail!(
                "--nic changes {} of one NIC, not `{k}`",
                NIC_KEYS.join(", ")
            );
        }
        let value = match (k, v) {
            (_, "") => Value::Null,
            ("boot", b) => Value::Bool(
                b.parse()
                    .map_err(|_| anyhow::anyhow!("boot={b}: true or false"))?,
            ),
            (_, v) => Value::String(v.to_string()),
        };
        if value.is_null() {
            obj.remove(k);
        } else {
            obj.insert(k.to_string(), value);
        }
    }
    if pairs.iter().any(|p| p == "boot=true") {
        // One boot NIC: the others stop being it.
        for n in nics.iter_mut() {
            let is_it = n["mac"]
                .as_str()
                .and_then(|m| m.parse::<MacAddr>().ok())
                .is_some_and(|m| m == want)
                || pairs
                    .iter()
                    .any(|p| p.strip_prefix("mac=") == n["mac"].as_str());
            if !is_it {
                if let Some(o) = n.as_object_mut() {
                    o.insert("boot".into(), Value::Bool(false));
                }
            }
        }
    }
    Ok(json!({ "interfaces": nics }))
}

/// Every machine matching `selection` (list filters), all pages.
async fn select(api: &ApiClient, selection: &[(&str, String)]) -> anyhow::Result<Vec<Value>> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query: Vec<(&str, String)> = selection.to_vec();
        query.push(("limit", "1000".into()));
        if let Some(c) = &cursor {
            query.push(("cursor", c.clone()));
        }
        let (_, page) = api
            .send(api.req(Method::GET, "/machines").query(&query))
            .await?;
        items.extend(page["items"].as_array().cloned().unwrap_or_default());
        cursor = page["next_cursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            return Ok(items);
        }
    }
}

/// Ask on stderr, read the answer from stdin: only `y` or `yes` goes on.
fn confirmed(question: &str) -> anyhow::Result<bool> {
    eprint!("{question} [y/N] ");
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the answer from stdin")?;
    Ok(matches!(
        line.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// `plinth machine edit --rack R [--site S --cluster C --role X] --set ... [--yes]`.
pub(super) async fn bulk(
    api: &ApiClient,
    selection: &[(&str, String)],
    patch: &Value,
    yes: bool,
    json_out: bool,
) -> anyhow::Result<()> {
    let what = selection
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    let machines = select(api, selection).await?;
    if machines.is_empty() {
        bail!("no machine matches {what}; nothing changed");
    }
    let names: Vec<String> = machines
        .iter()
        .map(|m| match m["hostname"].as_str() {
            Some(h) => h.to_string(),
            None => s(&m["id"]),
        })
        .collect();
    let keys = patch
        .as_object()
        .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let shown = names
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    let more = if names.len() > 10 { ", ..." } else { "" };
    eprintln!("{} machine(s) match {what}: {shown}{more}", machines.len());
    if !yes
        && !confirmed(&format!(
            "change {keys} on these {} machine(s)?",
            machines.len()
        ))?
    {
        bail!("not confirmed; nothing changed (--yes skips the question)");
    }
    let mut changed = Vec::new();
    let mut failed = Vec::new();
    for (m, name) in machines.iter().zip(&names) {
        let id = s(&m["id"]);
        let version = m["version"].as_i64().unwrap_or(0);
        let r = api
            .send(
                api.req(Method::PATCH, &format!("/machines/{id}"))
                    .header(reqwest::header::IF_MATCH, format!("\"{version}\""))
                    .json(patch),
            )
            .await;
        match r {
            Ok(_) => changed.push(name.clone()),
            Err(e) => failed.push(json!({"machine": name, "error": format!("{e:#}")})),
        }
    }
    if json_out {
        say(json!({"matched": machines.len(), "changed": changed, "failed": failed}));
    } else {
        for f in &failed {
            eprintln!("{}: {}", s(&f["machine"]), s(&f["error"]));
        }
        say(format!(
            "changed {} of {} machine(s) matching {what}",
            changed.len(),
            machines.len()
        ));
    }
    if !failed.is_empty() {
        bail!("{} machine(s) not changed (above)", failed.len());
    }
    Ok(())
}

/// The selection flags given, as list filters.
pub(super) fn selection(
    rack: &Option<String>,
    site: &Option<String>,
    cluster: &Option<String>,
    role: &Option<String>,
) -> Vec<(&'static str, String)> {
    [
        ("rack", rack),
        ("site", site),
        ("cluster", cluster),
        ("role", role),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
    .collect()
}

/// An empty patch is refused before anything is asked or sent.
pub(super) fn require_changes(patch: &Value) -> anyhow::Result<()> {
    if patch.as_object().is_some_and(Map::is_empty) {
        bail!("nothing to change: give --set KEY=VALUE or --file PATCH.json");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nic_patch_changes_one_nic_and_keeps_the_others() {
        let m = json!({"hostname": "w-1", "interfaces": [
            {"mac": "52:54:00:aa:bb:01", "ipv4": "10.0.0.21", "boot": true},
            {"mac": "52:54:00:aa:bb:02", "boot": false}]});
        let p = nic_patch(&m, "52-54-00-AA-BB-02", &["ipv4=10.0.0.22".into()]).expect("patch");
        assert_eq!(p["interfaces"][0]["ipv4"], "10.0.0.21");
        assert_eq!(p["interfaces"][1]["ipv4"], "10.0.0.22");
        let p = nic_patch(&m, "52:54:00:aa:bb:01", &["ipv4=".into()]).expect("clear");
        assert!(p["interfaces"][0].get("ipv4").is_none());
        let p = nic_patch(&m, "52:54:00:aa:bb:02", &["boot=true".into()]).expect("boot");
        assert_eq!(p["interfaces"][0]["boot"], false);
        assert_eq!(p["interfaces"][1]["boot"], true);
        let e = nic_patch(&m, "52:54:00:aa:bb:09", &["ipv4=1.2.3.4".into()]).expect_err("none");
        assert!(format!("{e}").contains("52:54:00:aa:bb:01"), "{e}");
        assert!(nic_patch(&m, "52:54:00:aa:bb:01", &["rack=r1".into()]).is_err());
    }
}
