//! The live event feed: the event log followed as it grows, for the API's server-sent events
//! stream (and any live view). It reads the log through the events port, so it shows what every
//! instance sharing the database did, from a given event id on (a reconnecting client resumes
//! where it stopped); it ends when the server shuts down, and when the token it was opened with
//! is revoked or expires, so a revoked credential stops receiving the fleet's events (and, for a
//! console page, when the console session it was opened in signs out or expires).
//!
//! Imports `domain` and the ports.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::ports::{Event, EventFilter, EventStore, StoreError, TokenStore};
use crate::domain::MachineId;

/// How often the log is read for new events.
const POLL: Duration = Duration::from_millis(500);
/// How often the follower's token is checked.
const RECHECK: Duration = Duration::from_secs(5);
/// Events read per query.
const PAGE: u32 = 500;

/// What to follow.
#[derive(Clone, Debug, Default)]
pub struct Follow {
    /// Only this machine's events.
    pub machine: Option<MachineId>,
    /// Only kinds starting with this.
    pub kind_prefix: Option<String>,
    /// Start after this event id (default: only events from now on).
    pub after: Option<i64>,
    /// The token the follower authenticated with: the feed ends when it stops being live.
    pub token: Option<Uuid>,
    /// The console session (the SHA-256 of its id) the follower signed in with: the feed ends
    /// when it signs out or expires (or its token stops being live).
    pub session: Option<Vec<u8>>,
}

/// The live event feed use case.
#[derive(Clone)]
pub struct EventFeed {
    events: Arc<dyn EventStore>,
    tokens: Arc<dyn TokenStore>,
}

impl EventFeed {
    /// Over the events and tokens ports.
    pub fn new(events: Arc<dyn EventStore>, tokens: Arc<dyn TokenStore>) -> Self {
        EventFeed { events, tokens }
    }

    /// Follow the log: the stream yields events in order and ends at `stop`, or when the
    /// follower's token is revoked or expires. A read that fails is logged and retried.
    pub async fn follow(
        &self,
        what: Follow,
        stop: CancellationToken,
    ) -> Result<impl Stream<Item = Event> + Send + 'static, StoreError> {
        let after = match what.after {
            Some(a) => a,
            None => self.events.last_event_id().await?,
        };
        struct Cursor {
            feed: EventFeed,
            what: Follow,
            stop: CancellationToken,
            after: i64,
            buffer: VecDeque<Event>,
            checked: tokio::time::Instant,
        }
        let start = Cursor {
            feed: self.clone(),
            what,
            stop,
            after,
            buffer: VecDeque::new(),
            checked: tokio::time::Instant::now(),
        };
        Ok(futures::stream::unfold(start, |mut c| async move {
            loop {
                if let Some(e) = c.buffer.pop_front() {
                    c.after = e.id;
                    return Some((e, c));
                }
                if c.stop.is_cancelled() {
                    return None;
                }
                if c.checked.elapsed() >= RECHECK {
                    c.checked = tokio::time::Instant::now();
                    if !c.feed.still_allowed(&c.what).await {
                        return None;
                    }
                }
                let filter = EventFilter {
                    machine_id: c.what.machine,
                    kind_prefix: c.what.kind_prefix.clone(),
                    after_id: Some(c.after),
                    limit: PAGE,
                };
                match c.feed.events.list_events(&filter).await {
                    Ok(list) if !list.is_empty() => {
                        c.buffer.extend(list);
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "event feed: read failed"),
                }
                tokio::select! {
                    _ = c.stop.cancelled() => return None,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        }))
    }

    /// Is the follower's token (and console session) still live? A revoked or expired token, a
    /// session signed out or expired, ends the feed, and so does a check that cannot be made (the
    /// client reconnects and authenticates again).
    async fn still_allowed(&self, what: &Follow) -> bool {
        let checked = match (&what.session, what.token) {
            (Some(hash), _) => self.tokens.session_by_hash(hash).await.map(|s| s.is_some()),
            (None, Some(id)) => self.tokens.live_token(id).await.map(|t| t.is_some()),
            (None, None) => return true,
        };
        checked.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "event feed: token check failed; ending the feed");
            false
        })
    }
}
