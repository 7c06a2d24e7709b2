//! The Redfish client: power, one-time boot override, virtual media, out-of-band inspection and
//! capability probing of a machine's BMC, over `reqwest` with rustls.
//!
//! Layout: `model` holds the `Bmc` trait and the plain result types the service layer uses;
//! `transport` owns HTTP (sessions, ETags, task monitors, retries, timeouts, the per-BMC request
//! limit); `tls` builds the rustls configuration (system roots, a pinned certificate fingerprint, or
//! explicitly insecure); `odata` follows `@odata.id` links and pages through collections; `quirks`
//! is the one table of vendor differences; `redfish` implements `Bmc` on top of them.
//!
//! Every resource is found by following links from the service root; no path but `/redfish/v1/` is
//! ever built by hand. This module may import `domain` (MAC addresses, disk types, TLS modes) and
//! nothing from `store`, `http` or the front doors. Passwords and session tokens are never logged.

mod model;
mod odata;
mod quirks;
mod redfish;
mod tls;
mod transport;

pub use model::{
    disk_type_of, Bmc, BootMode, BootOverride, BootTarget, Capabilities, DriveSource, EtagSupport,
    InspectedDrive, InspectedHardware, InspectedNic, MediaLocation, PowerAction, PowerState,
    VirtualMediaStatus,
};
pub use quirks::{quirks_for, ModeInPatch, Quirks, QUIRKS};
pub use redfish::RedfishBmc;
pub use tls::{CertFingerprint, TlsPolicy};
pub use transport::{AuthMode, BmcEndpoint, BmcOptions, Password};

use std::time::Duration;

/// Errors of the Redfish client. Messages name the request and what the BMC answered; they never
/// carry a password or a session token.
#[derive(Debug, thiserror::Error)]
pub enum BmcError {
    /// The endpoint or options are unusable (bad URL, bad fingerprint, no trust roots).
    #[error("BMC configuration: {0}")]
    Config(String),
    /// The BMC could not be reached, or the connection broke, after the allowed retries.
    #[error("{method} {path}: cannot talk to the BMC: {reason}")]
    Transport {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The transport error, with its causes.
        reason: String,
    },
    /// No answer within the per-request timeout.
    #[error("{method} {path}: no answer within {after:?}")]
    Timeout {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// The BMC answered with a non-success status.
    #[error("{method} {path}: HTTP {status}: {message}")]
    Http {
        /// HTTP method.
        method: String,
        /// Request path.
        path: String,
        /// Status code.
        status: u16,
        /// Redfish error message, or the start of a non-JSON body.
        message: String,
    },
    /// The BMC refused the credentials.
    #[error("the BMC refused the credentials: {0}")]
    Unauthorized(String),
    /// An answer that does not have the shape Redfish promises.
    #[error("unexpected answer from {path}: {reason}")]
    Protocol {
        /// Resource path.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// The BMC does not offer what was asked.
    #[error("not supported by this BMC: {0}")]
    NotSupported(String),
    /// A state change did not complete in time.
    #[error("{what} did not complete within {after:?}; last seen: {last}")]
    Deadline {
        /// What was awaited.
        what: String,
        /// The deadline.
        after: Duration,
        /// The last state observed.
        last: String,
    },
    /// The BMC accepted a boot override but holds something else when read back.
    #[error("boot override not kept: asked for {wanted}; the BMC holds {actual}")]
    BootNotApplied {
        /// What was written.
        wanted: Box<BootOverride>,
        /// What was read back.
        actual: Box<BootOverride>,
    },
    /// Virtual media did not end up as asked.
    #[error("virtual media at {slot}: {reason}")]
    MediaNotApplied {
        /// Slot URI.
        slot: String,
        /// What the BMC did instead.
        reason: String,
    },
    /// A task monitor reported failure.
    #[error("task {task} ended {state}: {message}")]
    TaskFailed {
        /// Task monitor URI.
        task: String,
        /// `TaskState`, e.g. `Exception`.
        state: String,
        /// The task's messages.
        message: String,
    },
}
