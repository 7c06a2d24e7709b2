//! Actions and task monitors (DSP0266 §12.2): a POST that answers 202 with a `Location` is
//! followed to its end, polling at the BMC's `Retry-After` (capped) or the poll interval, under the
//! task deadline; a task that ends `Exception`, `Killed`, `Cancelled` or `Interrupted` is an error
//! carrying the task's messages.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::request::parse_retry_after;
use super::{Answer, Transport};
use crate::bmc::odata::{list, text};
use crate::bmc::BmcError;

impl Transport {
    /// POST (an action, usually) and follow a task monitor if the BMC hands one out.
    pub async fn post(&self, link: &str, body: &Value) -> Result<Answer, BmcError> {
        let ans = self.request(Method::POST, link, Some(body), None).await?;
        self.finish(Method::POST, link, ans).await
    }

    /// Check an answer; on 202 with `Location`, poll the task monitor to its end.
    pub(super) async fn finish(
        &self,
        method: Method,
        link: &str,
        ans: Answer,
    ) -> Result<Answer, BmcError> {
        if ans.status == StatusCode::ACCEPTED {
            if let Some(monitor) = ans.location() {
                let first_wait = parse_retry_after(&ans.headers);
                return self.wait_task(&monitor, first_wait).await;
            }
        }
        self.check(&method, link, ans)
    }

    /// Poll a task monitor (DSP0266 §12.2): 202 while running, then the final answer. A monitor
    /// that answers with a Task resource is read by its `TaskState`.
    pub async fn wait_task(
        &self,
        monitor: &str,
        first_wait: Option<Duration>,
    ) -> Result<Answer, BmcError> {
        let deadline = Instant::now() + self.opts.task_timeout;
        let mut wait = first_wait;
        let mut last_state = String::from("(not polled)");
        loop {
            let pause = wait
                .unwrap_or(self.opts.poll_interval)
                .min(self.opts.max_retry_after);
            if Instant::now() + pause > deadline {
                return Err(BmcError::Deadline {
                    what: format!("task {}", self.path_of(monitor)),
                    after: self.opts.task_timeout,
                    last: last_state,
                });
            }
            tokio::time::sleep(pause).await;
            let ans = self.request(Method::GET, monitor, None, None).await?;
            wait = parse_retry_after(&ans.headers);
            if ans.status == StatusCode::ACCEPTED {
                last_state = ans
                    .body
                    .as_ref()
                    .and_then(|b| text(b, "TaskState"))
                    .unwrap_or_else(|| "running".into());
                continue;
            }
            let ans = self.check(&Method::GET, monitor, ans)?;
            let state = ans.body.as_ref().and_then(|b| text(b, "TaskState"));
            match state.as_deref() {
                Some(
                    "New" | "Starting" | "Running" | "Pending" | "Suspended" | "Stopping"
                    | "Cancelling" | "Service",
                ) => {
                    last_state = state.unwrap_or_default();
                    continue;
                }
                Some(s @ ("Exception" | "Killed" | "Cancelled" | "Interrupted")) => {
                    let messages = ans
                        .body
                        .as_ref()
                        .map(|b| {
                            list(b, "Messages")
                                .iter()
                                .filter_map(|m| text(m, "Message"))
                                .collect::<Vec<_>>()
                                .join("; ")
                        })
                        .unwrap_or_default();
                    return Err(BmcError::TaskFailed {
                        task: self.path_of(monitor),
                        state: s.to_string(),
                        message: messages,
                    });
                }
                _ => return Ok(ans),
            }
        }
    }
}
