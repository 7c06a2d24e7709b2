//! The OpenAPI document, generated from the handlers' annotations and the types' derives.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::{ErrorBody, ErrorEnvelope};
use super::{bmc, configs, machines, tokens, workflows};
use crate::domain::*;
use crate::service::bmc::{
    BootMode, BootOnceReport, BootOverride, BootTarget, Capabilities, DriveSource, EtagSupport,
    FieldChange, InspectConflict, InspectedDrive, InspectedHardware, InspectedNic,
    InspectionReport, MediaLocation, MediaReport, PowerAction, PowerReport, VirtualMediaStatus,
};
use crate::service::{ApiRole, CapabilityRecord, Event, MachinePage, RowError, TokenInfo};

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let comps = doc.components.get_or_insert_with(Default::default);
        comps.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(title = "Plinth API", description = "Bare-metal provisioning for Talos Linux: inventory, events, tokens, BMC power, boot override, virtual media and inspection."),
    paths(
        super::healthz,
        machines::create, machines::show, machines::update, machines::remove, machines::list,
        machines::lookup, machines::import, machines::events, machines::set_state, machines::status,
        tokens::create, tokens::list, tokens::revoke,
        bmc::power_status, bmc::power, bmc::boot_once, bmc::media_status, bmc::media_insert,
        bmc::media_eject, bmc::inspect, bmc::capabilities, bmc::refresh_capabilities, bmc::probe,
        configs::status, configs::open, configs::close, configs::approve,
        super::circuits::show, super::circuits::set, super::circuits::clear,
        workflows::start, workflows::status, workflows::cancel, workflows::stream, super::boot::timeline,
        super::clusters::bootstrap, super::clusters::bootstrap_status, super::clusters::talosconfig,
        super::clusters::kubeconfig, super::clusters::health,
        super::clusters::upgrade, super::clusters::upgrade_status, super::clusters::upgrade_action,
        super::snapshots::take, super::snapshots::list, super::snapshots::show,
        super::snapshots::recover, super::snapshots::recovery,
    ),
    components(schemas(
        Machine, machines::EditedMachine, MachineSpec, Interface, Disk, Bmc, BmcSpec, Role, LifecycleState, DiskType, TlsMode, MacAddr,
        MachineId, MachinePage, MachineRef, Conflict, RowError, FieldError, Event, ErrorBody, ErrorEnvelope,
        bmc::PowerRequest, bmc::BootOnceRequest, bmc::MediaInsertRequest, PowerReport, BootOnceReport,
        MediaReport, InspectionReport, FieldChange, InspectConflict, CapabilityRecord, PowerAction,
        BootTarget, BootMode, BootOverride, VirtualMediaStatus, MediaLocation, InspectedHardware,
        InspectedNic, InspectedDrive, DriveSource, Capabilities, EtagSupport,
        ApiRole, TokenInfo, tokens::NewTokenRequest, tokens::MintedToken, machines::ImportResult, machines::StateChange,
        super::circuits::CircuitAnswer, super::circuits::SetCircuit, crate::service::ports::CircuitPin,
        crate::service::machine_config::ConfigStatus, configs::OpenWindow, configs::ApproveRelease, configs::WindowOpened, crate::service::ProvisionWindow, machines::MachineStatus, machines::StatusMachine,
        workflows::ReinstallRequest, crate::service::workflow::Started, crate::service::workflow::Cancelled, crate::service::Reinstall, crate::service::Stage,
        super::clusters::BootstrapRequest, super::clusters::CredentialRequest,
        crate::service::clusters::ClusterHealth, crate::service::clusters::NodeHealth, crate::service::clusters::EtcdHealth,
        crate::service::ports::talos_api::ServiceStatus, crate::service::ports::talos_api::EtcdMember,
        crate::service::ports::talos_api::ClusterCheck,
        super::clusters::UpgradeRequest, crate::service::upgrade::UpgradePlan,
        crate::service::upgrade::RolloutStatus, crate::service::upgrade::PreCheck,
        crate::service::upgrade::VerifiedSnapshot,
        crate::service::ports::upgrades::Rollout, crate::service::ports::upgrades::RolloutNode,
        crate::service::ports::upgrades::RolloutState, crate::service::ports::upgrades::NodeStep,
        crate::service::ports::upgrades::UpgradeMethod,
        crate::service::ports::snapshots::SnapshotRecord, crate::service::ports::snapshots::SnapshotState,
        crate::service::ports::snapshots::RecoveryRecord, crate::service::ports::snapshots::RecoveryState,
        super::snapshots::RecoverBody,
    )),
    modifiers(&Bearer),
)]
pub struct ApiDoc;

/// `GET /api/v1/openapi.json` (no token needed: it describes, it does not reveal).
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
