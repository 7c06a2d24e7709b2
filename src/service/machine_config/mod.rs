//! Talos machine configs as a use case: the declared clusters, profiles and groups (loaded by
//! `plinth apply`), rendering one machine's config from them, and handing it out only inside the
//! machine's provisioning window, to the machine itself: the request from the address the token of
//! its latest install boot was minted for, carrying that token (once, within minutes) and the
//! machine's SMBIOS UUID.
//!
//! Rendering order: base config of the role (generated from the cluster's secrets bundle, or the
//! base config the cluster provides) -> cluster patches -> role patches -> site -> rack -> profile
//! (hardware) -> machine patches -> the machine's facts (hostname, install disk pinned by serial or
//! WWID, installer image, boot NIC). Every rendered config is validated (Talos JSON schema of its
//! version when one is configured, and Talos' own rules) before anyone sees it.
//!
//! Layout: `declared` (the inputs: sealing cluster secrets, loading the sources), `render`
//! (render and validate one machine's config), `window` (provisioning windows, install tickets,
//! the checks before a config is delivered), `diff` (redacted config diffs), `circuit` (the relay
//! circuit a machine's DHCP is pinned to, as an operator sees and changes it). The stored records
//! (`ClusterSpec`, `ProvisionWindow`, ...) are the `ConfigStore` port's, in `service::ports`.
//!
//! This module imports `domain`, `talos`, the ports and the inventory use case; nothing from
//! `store`, `http` or the front doors. It never logs a config or a token.

mod circuit;
mod declared;
mod diff;
mod render;
mod status;
mod window;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

pub use circuit::SwitchPort;
pub use declared::{ClusterSecretInput, Sources, DEFAULT_FACTORY_HOST};
pub use diff::{config_diff, redact};
pub use render::{schema_file, RenderedMachine};
pub use status::ConfigStatus;
pub use window::{
    token_hash, InstallTicket, OpenError, Refusal, Ticket, AWAITING_APPROVAL, TOKEN_TTL,
};

use super::error::MachineConfigError;
use super::ports::{ConfigStore, EventStore, LeaseStore};
use super::secrets::SecretBox;
use render::ValidatorCache;

/// Config use cases.
#[derive(Clone)]
pub struct ConfigService {
    configs: Arc<dyn ConfigStore>,
    events: Arc<dyn EventStore>,
    leases: Arc<dyn LeaseStore>,
    secrets: SecretBox,
    schema_dir: Option<PathBuf>,
    validators: Arc<Mutex<ValidatorCache>>,
    /// Refusals and anomalies written per (machine, source, kind) at most once a minute.
    throttle: Arc<super::throttle::Throttle>,
    /// Anomalies of config delivery, by kind (`plinth_config_anomalies_total`).
    anomalies: window::Anomalies,
}

impl ConfigService {
    /// Over the config objects, the event log and the leases (where a config request may come
    /// from), sealing with `secrets`, validating against the schemas embedded in the
    /// binary, or the one in `schema_dir` (`config.schema.v<major>.<minor>[.<patch>].json`) where
    /// it has one for the release.
    pub fn new(
        configs: Arc<dyn ConfigStore>,
        events: Arc<dyn EventStore>,
        leases: Arc<dyn LeaseStore>,
        secrets: SecretBox,
        schema_dir: Option<PathBuf>,
    ) -> Self {
        ConfigService {
            configs,
            events,
            leases,
            secrets,
            schema_dir,
            validators: Arc::default(),
            throttle: Arc::new(super::throttle::Throttle::new(
                std::time::Duration::from_secs(60),
            )),
            anomalies: window::Anomalies::default(),
        }
    }

    /// Export the anomalies of config delivery as `plinth_config_anomalies_total{kind}`.
    pub fn register(&self, metrics: &crate::metrics::Metrics) {
        self.anomalies.register(metrics);
    }
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn sealed_context(kind: &str, name: &str) -> String {
    format!("plinth/{kind}/{name}")
}
