//! The client cache: one `Bmc` client per machine, rebuilt only when the BMC's URL, user, TLS
//! settings or password change. A client's session and its per-BMC limit of concurrent requests
//! only work when it is reused. The password enters the cache key only through a digest.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::BmcService;
use crate::domain::{self, Machine, MachineId};
use crate::service::error::ServiceError;
use crate::service::ports::bmc::Bmc;

/// A client and the key of the settings it was built from.
pub(super) struct Cached {
    key: [u8; 32],
    bmc: Arc<dyn Bmc>,
}

/// Identifies the settings a client was built from; the password enters only through a digest.
fn client_key(b: &domain::Bmc, password: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [
        b.url.as_str(),
        b.username.as_str(),
        b.tls.as_str(),
        b.fingerprint.as_deref().unwrap_or(""),
        password,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

impl BmcService {
    /// The machine named by `reference` (id or host name) and a client for its BMC.
    pub(super) async fn client(
        &self,
        reference: &str,
    ) -> Result<(Machine, Arc<dyn Bmc>), ServiceError> {
        let m = self.inner.inventory.resolve(reference).await?;
        let bmc = self.client_of(&m).await?;
        Ok((m, bmc))
    }

    pub(super) async fn client_of(&self, m: &Machine) -> Result<Arc<dyn Bmc>, ServiceError> {
        let Some(b) = &m.bmc else {
            return Err(ServiceError::NoBmc(m.display_name()));
        };
        let password = self
            .inner
            .inventory
            .bmc_password(m)
            .await?
            .unwrap_or_default();
        let key = client_key(b, &password);
        let mut clients = self
            .inner
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(c) = clients.get(&m.id) {
            if c.key == key {
                return Ok(c.bmc.clone());
            }
        }
        // A replaced client logs out when its last user drops it.
        let bmc = self
            .inner
            .connector
            .connect(b, &password)
            .map_err(ServiceError::Bmc)?;
        clients.insert(
            m.id,
            Cached {
                key,
                bmc: bmc.clone(),
            },
        );
        Ok(bmc)
    }

    /// Drop the cached client of a machine (after it was removed from the inventory).
    pub fn forget(&self, id: MachineId) {
        let mut clients = self
            .inner
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        clients.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_key_changes_with_password() {
        let b = domain::Bmc {
            url: "https://bmc".into(),
            username: "root".into(),
            tls: domain::TlsMode::Insecure,
            fingerprint: None,
            has_password: true,
        };
        assert_eq!(client_key(&b, "a"), client_key(&b, "a"));
        assert_ne!(client_key(&b, "a"), client_key(&b, "b"));
    }
}
