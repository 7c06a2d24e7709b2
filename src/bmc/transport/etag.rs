//! ETags and `If-Match` (DSP0266 §6.5): a PATCH carries the resource's ETag when the BMC shows one
//! or demands one; on 412 or 428 the client climbs a short ladder (the strong form of a weak ETag,
//! a freshly read ETag, the wildcard, none) as the known clients do. A 428 teaches the client that
//! this BMC requires `If-Match` from then on.

use std::sync::atomic::Ordering;

use reqwest::header::ETAG;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{Answer, Transport};
use crate::bmc::odata::text;
use crate::bmc::BmcError;

impl Answer {
    /// The ETag of the answer: header first, then `@odata.etag`.
    pub fn etag(&self) -> Option<String> {
        self.headers
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| self.body.as_ref().and_then(|b| text(b, "@odata.etag")))
            .filter(|s| !s.is_empty())
    }
}

/// `W/"x"` -> `"x"`.
fn strong_form(etag: &str) -> Option<String> {
    etag.strip_prefix("W/").map(str::to_string)
}

impl Transport {
    pub fn if_match_required(&self) -> bool {
        self.if_match_required.load(Ordering::Relaxed)
    }

    pub fn require_if_match(&self) {
        self.if_match_required.store(true, Ordering::Relaxed);
    }

    /// PATCH with `If-Match`: the given ETag first; on 412/428 the strong form of a weak ETag, then
    /// without `If-Match` (or, on 428, with a freshly read ETag), as the known clients do.
    pub async fn patch(
        &self,
        link: &str,
        body: &Value,
        etag: Option<String>,
    ) -> Result<Answer, BmcError> {
        let mut etag = etag;
        if etag.is_none() && self.if_match_required() {
            // The BMC wants If-Match: its ETag if it shows one, else the wildcard.
            etag = Some(
                self.fetch_etag(link)
                    .await?
                    .unwrap_or_else(|| "*".to_string()),
            );
        }
        let mut queue: Vec<Option<String>> = vec![etag.clone()];
        let mut tried: Vec<Option<String>> = Vec::new();
        let mut last: Option<Answer> = None;
        while let Some(cand) = queue.first().cloned() {
            queue.remove(0);
            if tried.contains(&cand) || tried.len() >= 5 {
                continue;
            }
            tried.push(cand.clone());
            let ans = self
                .request(Method::PATCH, link, Some(body), cand.as_deref())
                .await?;
            match ans.status {
                StatusCode::PRECONDITION_FAILED | StatusCode::PRECONDITION_REQUIRED => {
                    let required = ans.status == StatusCode::PRECONDITION_REQUIRED;
                    tracing::info!(path = %self.path_of(link), status = ans.status.as_u16(),
                        if_match = cand.is_some(), "BMC refused the ETag precondition; retrying");
                    if required {
                        self.require_if_match();
                    }
                    match &cand {
                        Some(tag) => {
                            if let Some(strong) = strong_form(tag) {
                                queue.push(Some(strong));
                            }
                            if required {
                                // The resource may have changed: read its ETag again.
                                if let Some(fresh) = self.fetch_etag(link).await? {
                                    if let Some(strong) = strong_form(&fresh) {
                                        queue.push(Some(strong));
                                    }
                                    queue.push(Some(fresh));
                                }
                                queue.push(Some("*".into()));
                            } else {
                                queue.push(None);
                            }
                        }
                        None => {
                            if let Some(fresh) = self.fetch_etag(link).await? {
                                queue.push(Some(fresh.clone()));
                                if let Some(strong) = strong_form(&fresh) {
                                    queue.push(Some(strong));
                                }
                            }
                            queue.push(Some("*".into()));
                        }
                    }
                    last = Some(ans);
                }
                _ => return self.finish(Method::PATCH, link, ans).await,
            }
        }
        match last {
            Some(ans) => self.check(&Method::PATCH, link, ans),
            None => Err(BmcError::Protocol {
                path: self.path_of(link),
                reason: "no PATCH was sent".into(),
            }),
        }
    }

    async fn fetch_etag(&self, link: &str) -> Result<Option<String>, BmcError> {
        Ok(self.get(link).await?.etag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strong_form_of_weak_etags() {
        assert_eq!(strong_form("W/\"abc\"").as_deref(), Some("\"abc\""));
        assert_eq!(strong_form("\"abc\""), None);
    }
}
