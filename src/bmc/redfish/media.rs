//! Virtual media: the CD/DVD slot (from the System's and the Manager's `VirtualMedia` links, in
//! the order the quirk row prefers), `InsertMedia` with only the parameters its `ActionInfo`
//! accepts (or a PATCH of `Image`/`Inserted` where there is no action), `EjectMedia`, and a
//! read-back of the slot after each change.

use serde_json::{json, Value};

use super::discovery::Discovered;
use super::RedfishBmc;
use crate::bmc::odata::{action, flag, link, list, members, same_link, text, texts_at, under};
use crate::bmc::transport::Doc;
use crate::bmc::BmcError;
use crate::service::ports::bmc::{MediaLocation, VirtualMediaStatus};

impl RedfishBmc {
    /// The virtual CD/DVD slot: from the System's and the Manager's VirtualMedia links, in the
    /// order the quirks prefer, the first slot whose MediaTypes include CD or DVD.
    pub(super) async fn cd_slot(&self) -> Result<(Doc, MediaLocation), BmcError> {
        let d = self.discover().await?;
        let sys = self.system().await?;
        let mut collections: Vec<String> = Vec::new();
        let sys_vm = link(&sys.json, "VirtualMedia");
        let mgr_vm = match &d.manager {
            Some(m) => link(&self.t.get(m).await?.json, "VirtualMedia"),
            None => None,
        };
        let (first, second) = match d.quirks.media_location {
            MediaLocation::System => (sys_vm, mgr_vm),
            MediaLocation::Manager => (mgr_vm, sys_vm),
        };
        for c in [first, second].into_iter().flatten() {
            if !collections.iter().any(|x| same_link(x, &c)) {
                collections.push(c);
            }
        }
        if collections.is_empty() {
            return Err(BmcError::NotSupported(
                "neither the System nor the Manager links VirtualMedia".into(),
            ));
        }
        let mut fallback: Option<Doc> = None;
        for c in &collections {
            for m in members(&self.t, c).await? {
                let slot = self.t.get(&m).await?;
                let types = texts_at(&slot.json, "/MediaTypes");
                let is_cd = types
                    .iter()
                    .any(|t| t.eq_ignore_ascii_case("CD") || t.eq_ignore_ascii_case("DVD"));
                if is_cd {
                    let loc = self.location_of(&slot.uri, d);
                    return Ok((slot, loc));
                }
                let named_cd = text(&slot.json, "Id")
                    .or_else(|| text(&slot.json, "Name"))
                    .is_some_and(|n| n.to_ascii_uppercase().contains("CD"));
                if types.is_empty() && named_cd && fallback.is_none() {
                    fallback = Some(slot);
                }
            }
        }
        match fallback {
            Some(slot) => {
                let loc = self.location_of(&slot.uri, d);
                Ok((slot, loc))
            }
            None => Err(BmcError::NotSupported(format!(
                "no CD/DVD slot in {}",
                collections
                    .iter()
                    .map(|c| self.t.path_of(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    fn location_of(&self, slot: &str, d: &Discovered) -> MediaLocation {
        let slot = self.t.path_of(slot);
        match &d.manager {
            Some(m) if under(&slot, &self.t.path_of(m)) => MediaLocation::Manager,
            _ => MediaLocation::System,
        }
    }

    fn media_status(slot: &Doc, location: MediaLocation) -> VirtualMediaStatus {
        VirtualMediaStatus {
            slot: slot.uri.clone(),
            location,
            inserted: flag(&slot.json, "Inserted").unwrap_or(false),
            image: text(&slot.json, "Image"),
            connected_via: text(&slot.json, "ConnectedVia"),
            media_types: texts_at(&slot.json, "/MediaTypes"),
        }
    }

    /// Read a slot again until `done` holds, a few polls at most.
    async fn settle_media(
        &self,
        slot: &str,
        location: MediaLocation,
        done: impl Fn(&VirtualMediaStatus) -> bool,
    ) -> Result<VirtualMediaStatus, BmcError> {
        let mut status = Self::media_status(&self.t.get(slot).await?, location);
        for _ in 0..5 {
            if done(&status) {
                break;
            }
            tokio::time::sleep(self.t.options().poll_interval).await;
            status = Self::media_status(&self.t.get(slot).await?, location);
        }
        Ok(status)
    }

    async fn eject_slot(
        &self,
        slot: &Doc,
        location: MediaLocation,
    ) -> Result<VirtualMediaStatus, BmcError> {
        let eject = action(&slot.json, "#VirtualMedia.EjectMedia").and_then(|a| text(a, "target"));
        match eject {
            Some(target) => {
                self.t.post(&target, &json!({})).await?;
            }
            None => {
                self.t
                    .patch(
                        &slot.uri,
                        &json!({"Image": null, "Inserted": false}),
                        slot.etag.clone(),
                    )
                    .await?;
            }
        }
        let status = self
            .settle_media(&slot.uri, location, |s| !s.inserted)
            .await?;
        if status.inserted {
            return Err(BmcError::MediaNotApplied {
                slot: slot.uri.clone(),
                reason: format!(
                    "eject accepted but media is still inserted ({})",
                    status.image.as_deref().unwrap_or("no image shown")
                ),
            });
        }
        Ok(status)
    }

    /// Parameters InsertMedia accepts, from its `@Redfish.ActionInfo` (None: not described).
    async fn insert_params(&self, action: &Value) -> Result<Option<Vec<String>>, BmcError> {
        let Some(info) = text(action, "@Redfish.ActionInfo") else {
            return Ok(None);
        };
        let doc = self.t.get(&info).await?;
        Ok(Some(
            list(&doc.json, "Parameters")
                .iter()
                .filter_map(|p| text(p, "Name"))
                .collect(),
        ))
    }

    /// Insert an image URL into the virtual CD/DVD slot (ejecting what is there first).
    pub(super) async fn insert_media(
        &self,
        image_url: &str,
    ) -> Result<VirtualMediaStatus, BmcError> {
        let d = self.discover().await?;
        let url = reqwest::Url::parse(image_url)
            .map_err(|e| BmcError::Config(format!("image URL `{image_url}`: {e}")))?;
        let (mut slot, location) = self.cd_slot().await?;
        if Self::media_status(&slot, location).inserted {
            tracing::info!(slot = %self.t.path_of(&slot.uri), "ejecting the current image first");
            self.eject_slot(&slot, location).await?;
            slot = self.t.get(&slot.uri).await?;
        }
        let insert = action(&slot.json, "#VirtualMedia.InsertMedia").cloned();
        match insert {
            Some(insert) => {
                let target = text(&insert, "target").ok_or_else(|| BmcError::Protocol {
                    path: slot.uri.clone(),
                    reason: "InsertMedia action without a target".into(),
                })?;
                let params = self.insert_params(&insert).await?;
                let allowed = |p: &str| match &params {
                    Some(names) => names.iter().any(|x| x == p),
                    None => !d.quirks.insert_image_only,
                };
                let mut body = serde_json::Map::new();
                body.insert("Image".into(), json!(image_url));
                if allowed("Inserted") {
                    body.insert("Inserted".into(), json!(true));
                }
                if allowed("WriteProtected") {
                    body.insert("WriteProtected".into(), json!(true));
                }
                if params.is_some() && allowed("TransferProtocolType") {
                    body.insert(
                        "TransferProtocolType".into(),
                        json!(url.scheme().to_ascii_uppercase()),
                    );
                }
                self.t.post(&target, &Value::Object(body)).await?;
            }
            None => {
                self.t
                    .patch(
                        &slot.uri,
                        &json!({"Image": image_url, "Inserted": true}),
                        slot.etag.clone(),
                    )
                    .await?;
            }
        }
        let status = self
            .settle_media(&slot.uri, location, |s| {
                s.inserted && s.image.as_deref() == Some(image_url)
            })
            .await?;
        if !(status.inserted && status.image.as_deref() == Some(image_url)) {
            return Err(BmcError::MediaNotApplied {
                slot: slot.uri.clone(),
                reason: format!(
                    "insert accepted, but the slot shows inserted={} image={}",
                    status.inserted,
                    status.image.as_deref().unwrap_or("(none)")
                ),
            });
        }
        Ok(status)
    }

    /// Eject the virtual CD/DVD slot.
    pub(super) async fn eject_media(&self) -> Result<VirtualMediaStatus, BmcError> {
        let (slot, location) = self.cd_slot().await?;
        let status = Self::media_status(&slot, location);
        if !status.inserted {
            return Ok(status);
        }
        self.eject_slot(&slot, location).await
    }

    /// State of the virtual CD/DVD slot.
    pub(super) async fn cd_status(&self) -> Result<VirtualMediaStatus, BmcError> {
        let (slot, location) = self.cd_slot().await?;
        Ok(Self::media_status(&slot, location))
    }
}
