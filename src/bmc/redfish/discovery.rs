//! Discovery, once per client: the service root, the system this client drives (the first member
//! of `Systems`, or the one `BmcOptions::system` names), its Manager (`Links.ManagedBy`, else the
//! first of `Managers`), the vendor and model, and the row of the quirk table that applies. Every
//! resource is found by following links; only the service root's path is built by hand.

use serde_json::Value;

use super::RedfishBmc;
use crate::bmc::odata::{link, links_at, members, prop, same_link, text};
use crate::bmc::quirks::{quirks_for, Quirks};
use crate::bmc::transport::SERVICE_ROOT;
use crate::bmc::BmcError;

/// What discovery found once per client: the root, the system and its manager, and the quirks.
#[derive(Debug)]
pub(super) struct Discovered {
    pub(super) root: Value,
    pub(super) system: String,
    pub(super) manager: Option<String>,
    pub(super) vendor: Option<String>,
    pub(super) model: Option<String>,
    pub(super) quirks: &'static Quirks,
}

impl RedfishBmc {
    pub(super) async fn discover_now(&self) -> Result<Discovered, BmcError> {
        let root = self.t.get(SERVICE_ROOT).await?;
        let systems = link(&root.json, "Systems").ok_or_else(|| BmcError::Protocol {
            path: SERVICE_ROOT.into(),
            reason: "the service root links no Systems collection".into(),
        })?;
        let list = members(&self.t, &systems).await?;
        let system = match &self.t.options().system {
            None => list.first().cloned(),
            Some(want) => list
                .iter()
                .find(|m| {
                    same_link(m, want) || m.trim_end_matches('/').rsplit('/').next() == Some(want)
                })
                .cloned(),
        }
        .ok_or_else(|| BmcError::Protocol {
            path: self.t.path_of(&systems),
            reason: match &self.t.options().system {
                Some(w) => format!("no system `{w}` among {list:?}"),
                None => "the Systems collection is empty".into(),
            },
        })?;
        let sys = self.t.get(&system).await?;
        let mut manager = links_at(&sys.json, "/Links/ManagedBy").into_iter().next();
        if manager.is_none() {
            if let Some(managers) = link(&root.json, "Managers") {
                manager = members(&self.t, &managers).await?.into_iter().next();
            }
        }
        let manager_doc = match &manager {
            Some(m) => self.t.get(m).await.ok(),
            None => None,
        };
        let root_vendor = text(&root.json, "Vendor");
        let sys_maker = text(&sys.json, "Manufacturer");
        let mgr_maker = manager_doc
            .as_ref()
            .and_then(|d| text(&d.json, "Manufacturer"));
        let oem_keys: Vec<String> = prop(&root.json, "Oem")
            .and_then(Value::as_object)
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let mut names: Vec<&str> = Vec::new();
        names.extend(root_vendor.as_deref());
        names.extend(sys_maker.as_deref());
        names.extend(mgr_maker.as_deref());
        names.extend(oem_keys.iter().map(String::as_str));
        let model = text(&sys.json, "Model");
        let quirks = quirks_for(&names, model.as_deref());
        if quirks.if_match_required {
            self.t.require_if_match();
        }
        tracing::debug!(system = %self.t.path_of(&system), quirks = quirks.name, "BMC discovered");
        Ok(Discovered {
            root: root.json,
            system,
            manager,
            vendor: root_vendor.or(sys_maker),
            model,
            quirks,
        })
    }
}
