//! The inspection use case: read the hardware out of band through the BMC and merge it into the
//! inventory as one versioned change (the merge rule is `domain::inspection`). When the machine
//! changes under it, the merge runs again against what the inventory holds, a few times at most.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{machine_ref, BmcService};
use crate::domain::{
    inspected_keys, merge_inspection, FieldChange, InspectConflict, InspectedHardware, MachineRef,
};
use crate::service::error::ServiceError;

/// What an out-of-band inspection found and did to the inventory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InspectionReport {
    /// The machine.
    pub machine: MachineRef,
    /// The machine's version after the inspection (unchanged when nothing changed).
    pub version: i64,
    /// Fields filled and NICs and disks added.
    pub changes: Vec<FieldChange>,
    /// Values not written because they contradict the inventory.
    pub conflicts: Vec<InspectConflict>,
    /// Everything the BMC reported.
    pub hardware: InspectedHardware,
}

/// How often an inspection retries when the machine changed under it.
const MERGE_ATTEMPTS: usize = 3;

impl BmcService {
    /// Inspect the machine out of band and merge what the BMC reports into the inventory.
    pub async fn inspect(
        &self,
        reference: &str,
        actor: &str,
    ) -> Result<InspectionReport, ServiceError> {
        let (m, bmc) = self.client(reference).await?;
        let started = Instant::now();
        let result = bmc.inspect().await;
        let hw = match result {
            Ok(hw) => hw,
            Err(e) => {
                return self
                    .finish(&m, "bmc.inspect", actor, Map::new(), started, Err(e))
                    .await
            }
        };
        let mut machine = m;
        let mut attempt = 0;
        let (updated, merge) = loop {
            attempt += 1;
            let owners = self.inner.inventory.owners(&inspected_keys(&hw)).await?;
            let merge = merge_inspection(&machine, &hw, &owners);
            if merge.patch.is_empty() {
                break (machine, merge);
            }
            let patch = Value::Object(merge.patch.clone());
            match self
                .inner
                .inventory
                .update(machine.id, Some(machine.version), patch, actor)
                .await
            {
                Ok(updated) => break (updated, merge),
                // Someone edited the machine, or took one of its new values, meanwhile: merge again
                // against what the inventory holds now.
                Err(ServiceError::PreconditionFailed { .. } | ServiceError::Conflict(_))
                    if attempt < MERGE_ATTEMPTS =>
                {
                    machine = self.inner.inventory.get(machine.id).await?;
                }
                Err(e) => return Err(e),
            }
        };
        let mut detail = Map::new();
        detail.insert("version".into(), json!(updated.version));
        detail.insert("changes".into(), json!(merge.changes));
        detail.insert("conflicts".into(), json!(merge.conflicts));
        detail.insert("nics".into(), json!(hw.host_macs().len()));
        detail.insert("drives".into(), json!(hw.drives.len()));
        if !merge.conflicts.is_empty() {
            tracing::warn!(machine = %updated.id, name = %updated.display_name(), conflicts = merge.conflicts.len(), "inspection found values that contradict the inventory; not overwritten");
        }
        self.finish(&updated, "bmc.inspect", actor, detail, started, Ok(()))
            .await?;
        Ok(InspectionReport {
            machine: machine_ref(&updated),
            version: updated.version,
            changes: merge.changes,
            conflicts: merge.conflicts,
            hardware: hw,
        })
    }
}
