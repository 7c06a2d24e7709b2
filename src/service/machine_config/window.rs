//! Provisioning windows and config delivery: opening and closing a machine's window, minting
//! the token of an install boot (`InstallTicket`), and the checks before a config is handed out.
//!
//! A config goes to the machine, not to whoever knows its MAC. The token of an install boot is
//! minted only for a script request from the machine's own address (its reserved address or a
//! lease Plinth bound to one of its MACs; where Plinth knows neither, the address that asked, and
//! the event says the binding is weak), and is bound to that address; a request from any other
//! address gets no token and never replaces the machine's. The fetch must come from that address
//! with that token, within [`TOKEN_TTL`] of the mint, once (the first config served uses it up,
//! in the same transaction), with the machine's SMBIOS UUID (a worker with none on record binds
//! the first one it presents; a control-plane machine, whose config holds the cluster's CA keys,
//! is served only to a UUID on record). Every refusal is one answer to the client (nothing tells which
//! check failed, and refusals take the same time), and an event of the machine; the anomalies
//! that mean someone else is trying (a foreign address, a token used twice, another UUID) are
//! events of their own kind and a metric, so an operator knows which cluster's secrets to rotate.
//! With `delivery: approve` on the cluster, each install boot's script also shows a short code,
//! and the config is released only after an operator approves that code
//! (`ConfigService::approve`); until then every fetch is refused as "awaiting approval".
//! Never logs a config or a token.

use std::collections::HashSet;
use std::net::IpAddr;

use base64::Engine as _;
use chrono::{DateTime, Duration, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::{sealed_context, ConfigService, MachineConfigError, RenderedMachine};
use crate::domain::{LifecycleState, Machine, MachineId, Role};
use crate::service::error::ServiceError;
use crate::service::inventory::Inventory;
use crate::service::ports::configs::Delivery;
use crate::service::ports::{LeaseState, NewEvent, ProvisionWindow, ServedConfig, StoreError};

/// The outcome of a config fetch that is not served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Nothing is served to this request: one answer (404) whatever the reason, which is in the
    /// machine's events.
    Denied,
    /// The store failed: nothing can be decided now, the machine retries: 503 (never a 404).
    Unavailable,
}

/// How long after its mint a config token may be used: an install boot fetches its config within
/// minutes of its script.
pub const TOKEN_TTL: Duration = Duration::minutes(15);

/// The least time a refused fetch takes, whatever was checked: answers do not tell by their
/// timing which machines exist or which windows are open.
const REFUSAL_FLOOR: std::time::Duration = std::time::Duration::from_millis(200);

/// The refusal of a control-plane machine without a recorded SMBIOS UUID.
pub const CONTROL_PLANE_NEEDS_UUID: &str =
    "a control-plane machine's config is served only to its recorded SMBIOS UUID, \
     and none is recorded: read it from the machine's firmware or BMC and set `smbios_uuid` \
     (`plinth machine edit NAME --set smbios_uuid=UUID`)";

/// The refusal (and hold reason) of a config whose release an operator has not approved yet.
pub const AWAITING_APPROVAL: &str = "awaiting approval: the cluster's delivery is `approve`; \
     match the code on the machine's console and run `plinth machine approve NAME CODE`";

/// Letters and digits of an approval code: no 0/O, 1/I to misread on a console.
const CODE_ALPHABET: &[u8; 32] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";

/// A fresh approval code, `XXXX-XXXX` (40 bits).
fn new_approval_code() -> String {
    let mut raw = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    let chars: Vec<char> = raw
        .iter()
        .map(|b| char::from(CODE_ALPHABET[usize::from(b % 32)]))
        .collect();
    let (a, b) = chars.split_at(4);
    format!(
        "{}-{}",
        a.iter().collect::<String>(),
        b.iter().collect::<String>()
    )
}

/// An approval code as typed: upper case, without separators or spaces.
fn normalize_code(code: &str) -> String {
    code.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// What an install boot needs from the config side.
#[derive(Clone)]
pub struct InstallTicket {
    /// The token minted into this boot's kernel command line.
    pub token: String,
    /// Talos version, `v1.11.6`.
    pub talos_version: String,
    /// Schematic id.
    pub schematic_id: String,
    /// Extra kernel arguments of the inventory.
    pub kernel_args: Vec<String>,
    /// The schematic's `customization.extraKernelArgs`.
    pub schematic_kernel_args: Vec<String>,
    /// Wipe the system disk on this boot.
    pub wipe: bool,
    /// The code this boot's console shows, for an operator to approve its config's release
    /// (`delivery: approve`).
    pub approval_code: Option<String>,
}

impl std::fmt::Debug for InstallTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallTicket")
            .field("talos_version", &self.talos_version)
            .field("schematic_id", &self.schematic_id)
            .finish_non_exhaustive()
    }
}

/// The answer to an install boot's script request.
#[derive(Debug)]
pub enum Ticket {
    /// No provisioning window is open.
    NoWindow,
    /// The request does not come from the machine's address: no token (the reason is an event).
    NotFromMachine,
    /// The install cannot start yet (its Talos image is not cached): no token; why.
    Waiting(String),
    /// The install, with this boot's token.
    Issued(InstallTicket),
}

/// Label: the kind of an anomaly.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct AnomalyLabel {
    kind: &'static str,
}

/// Anomalies of config delivery, counted by kind.
#[derive(Clone, Default)]
pub(super) struct Anomalies(
    prometheus_client::metrics::family::Family<
        AnomalyLabel,
        prometheus_client::metrics::counter::Counter,
    >,
);

impl Anomalies {
    pub(super) fn register(&self, metrics: &crate::metrics::Metrics) {
        metrics.register(
            "config_anomalies",
            "Config deliveries that look like someone other than the machine asking, by kind",
            self.0.clone(),
        );
    }

    fn count(&self, kind: &'static str) {
        self.0.get_or_create(&AnomalyLabel { kind }).inc();
    }
}

/// SHA-256 of a token, hex.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl ConfigService {
    /// The config last served to a machine, in the clear.
    pub async fn last_served(
        &self,
        id: MachineId,
    ) -> Result<Option<(String, DateTime<Utc>)>, MachineConfigError> {
        let (_, served) = self.configs.machine_config(id).await?;
        match served {
            Some(s) => {
                let yaml = self.open_text(&sealed_context("served", &id.to_string()), &s.sealed)?;
                Ok(Some((yaml, s.at)))
            }
            None => Ok(None),
        }
    }

    /// A machine's provisioning window, open or not.
    pub async fn window(
        &self,
        id: MachineId,
    ) -> Result<Option<ProvisionWindow>, MachineConfigError> {
        Ok(self.configs.window(id).await?)
    }

    /// The config last served to a machine, sealed, if any.
    pub async fn served(&self, id: MachineId) -> Result<Option<ServedConfig>, MachineConfigError> {
        let (_, served) = self.configs.machine_config(id).await?;
        Ok(served)
    }

    /// Open a machine's provisioning window for `ttl`. The config must render and validate
    /// first; the machine moves to `provisioning`.
    pub async fn open_window(
        &self,
        inventory: &Inventory,
        id: MachineId,
        ttl: Duration,
        wipe: bool,
        actor: &str,
    ) -> Result<(ProvisionWindow, RenderedMachine), OpenError> {
        let m = inventory.get(id).await.map_err(OpenError::Service)?;
        let rendered = self.render_machine(&m).await.map_err(OpenError::Config)?;
        if m.state != LifecycleState::Provisioning {
            inventory
                .set_state(id, None, LifecycleState::Provisioning, None, actor)
                .await
                .map_err(OpenError::Service)?;
        }
        let now = Utc::now();
        let w = ProvisionWindow {
            machine_id: id,
            opened_at: now,
            expires_at: now + ttl,
            opened_by: actor.to_string(),
            wipe,
            token_sha256: None,
            token_minted_at: None,
            token_ip: None,
            token_used_at: None,
            closed_at: None,
            close_reason: None,
        };
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.window_opened".into(),
            actor: actor.into(),
            detail: serde_json::json!({
                "expires_at": w.expires_at, "wipe": wipe, "config_sha256": rendered.sha256,
                "warnings": rendered.warnings,
            }),
        };
        self.configs
            .put_window(&w, &event)
            .await
            .map_err(|e| OpenError::Config(e.into()))?;
        Ok((w, rendered))
    }

    /// Close a machine's window; false when none was open.
    pub async fn close_window(
        &self,
        id: MachineId,
        reason: &str,
        actor: &str,
    ) -> Result<bool, MachineConfigError> {
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.window_closed".into(),
            actor: actor.into(),
            detail: serde_json::json!({ "reason": reason }),
        };
        Ok(self
            .configs
            .close_window(id, Utc::now(), reason, &event)
            .await?)
    }

    /// For an install boot of `m`, asked for from `peer`: mint this boot's token, bound to
    /// `peer`, when the window is open, `peer` is the machine's own address, the config renders,
    /// and `ready` (given the Talos version and schematic) says the install can start. A request
    /// from another address, or one that has to wait, gets no token and leaves the machine's
    /// alone.
    pub async fn install_ticket(
        &self,
        m: &Machine,
        peer: IpAddr,
        ready: impl FnOnce(&str, &str) -> Result<(), String>,
    ) -> Result<Ticket, MachineConfigError> {
        let now = Utc::now();
        let Some(w) = self.configs.window(m.id).await? else {
            return Ok(Ticket::NoWindow);
        };
        if !w.is_open(now) {
            return Ok(Ticket::NoWindow);
        }
        let expected = self.expected_addresses(m).await?;
        let peer_v4 = v4(peer);
        if !expected.is_empty() && !peer_v4.is_some_and(|ip| expected.contains(&ip)) {
            self.anomaly(
                m.id,
                peer,
                "config.script_from_foreign_address",
                serde_json::json!({
                    "expected": expected.iter().map(ToString::to_string).collect::<Vec<_>>(),
                }),
            )
            .await;
            return Ok(Ticket::NotFromMachine);
        }
        let rendered = self.render_machine(m).await?;
        // Talos wipes the system disk and reboots before it loads its config, so the wipe goes
        // on the first install boot of the window only: on every boot it would be a reboot
        // loop. A token minted earlier in this window means that boot has happened.
        let first_boot = w.token_minted_at.is_none();
        if let Err(why) = ready(&rendered.version.to_string(), &rendered.schematic_id) {
            return Ok(Ticket::Waiting(why));
        }
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let ip = peer_v4.map_or_else(|| peer.to_string(), |v| v.to_string());
        if !self
            .configs
            .set_window_token(m.id, &token_hash(&token), &ip, now)
            .await?
        {
            return Ok(Ticket::NoWindow);
        }
        if expected.is_empty() {
            // Plinth neither leases nor reserves this machine's address (proxyDHCP, another DHCP
            // server): the token is bound to the address that asked, which is all it can know.
            self.event(
                m.id,
                "config.token_bound_to_requester",
                serde_json::json!({ "from": ip,
                    "why": "Plinth neither leases nor reserves an address of this machine; reserve one (interfaces[].ipv4) to bind its config to it" }),
            )
            .await;
        }
        let approval_code = if self.delivery_of(m).await? == Delivery::Approve {
            let code = new_approval_code();
            if !self
                .configs
                .set_approval_code(m.id, &token_hash(&normalize_code(&code)))
                .await?
            {
                return Ok(Ticket::NoWindow);
            }
            self.event(
                m.id,
                "config.approval_requested",
                serde_json::json!({ "from": ip }),
            )
            .await;
            Some(code)
        } else {
            None
        };
        Ok(Ticket::Issued(InstallTicket {
            token,
            talos_version: rendered.version.to_string(),
            schematic_id: rendered.schematic_id,
            kernel_args: rendered.kernel_args,
            schematic_kernel_args: rendered.schematic_kernel_args,
            wipe: (w.wipe || rendered.wipe) && first_boot,
            approval_code,
        }))
    }

    /// Serve the config of machine `id` to a request carrying `token` and the SMBIOS `uuid` Talos
    /// substituted, from address `from` (see the module's paragraph for the checks). Every
    /// refusal is `Refusal::Denied` after the same minimum time, and an event.
    pub async fn fetch(
        &self,
        inventory: &Inventory,
        id: MachineId,
        token: Option<&str>,
        uuid: Option<&str>,
        from: IpAddr,
    ) -> Result<String, Refusal> {
        let started = tokio::time::Instant::now();
        let outcome = self.deliver(inventory, id, token, uuid, from).await;
        if outcome == Err(Refusal::Denied) {
            tokio::time::sleep_until(started + REFUSAL_FLOOR).await;
        }
        outcome
    }

    async fn deliver(
        &self,
        inventory: &Inventory,
        id: MachineId,
        token: Option<&str>,
        uuid: Option<&str>,
        from: IpAddr,
    ) -> Result<String, Refusal> {
        let m = match inventory.get(id).await {
            Ok(m) => m,
            Err(ServiceError::NotFound(_)) => return Err(Refusal::Denied),
            Err(e) => {
                tracing::error!(error = %e, "config fetch: machine look-up failed");
                return Err(Refusal::Unavailable);
            }
        };
        let now = Utc::now();
        let window = match self.configs.window(id).await {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "config fetch: window look-up failed");
                return Err(Refusal::Unavailable);
            }
        };
        let Some(w) = window.filter(|w| w.closed_at.is_none()) else {
            return self.refuse(&m, from, "no open provisioning window").await;
        };
        if m.state != LifecycleState::Provisioning {
            return self.refuse(&m, from, "machine is not provisioning").await;
        }
        if w.expires_at <= now {
            return self.refuse(&m, from, "provisioning window expired").await;
        }
        let (Some(token), Some(hash)) = (token, &w.token_sha256) else {
            return self.refuse(&m, from, "no token of this boot").await;
        };
        let hashed = token_hash(token);
        if !constant_time_eq(hashed.as_bytes(), hash.as_bytes()) {
            return self
                .refuse(&m, from, "token does not match this boot's")
                .await;
        }
        if w.token_used_at.is_some() {
            return self
                .refuse_anomaly(
                    &m,
                    from,
                    "config.token_reused",
                    "the token was used already",
                )
                .await;
        }
        if w.token_minted_at.is_none_or(|t| t + TOKEN_TTL <= now) {
            return self.refuse(&m, from, "token expired").await;
        }
        let from_text = v4(from).map_or_else(|| from.to_string(), |v| v.to_string());
        if w.token_ip.as_deref() != Some(from_text.as_str()) {
            return self
                .refuse_anomaly(
                    &m,
                    from,
                    "config.fetch_from_foreign_address",
                    "the token was minted for another address",
                )
                .await;
        }
        let Some(presented) = uuid
            .and_then(|u| u.trim().parse::<uuid::Uuid>().ok())
            .filter(|u| !u.is_nil() && !u.is_max())
        else {
            return self.refuse(&m, from, "no SMBIOS UUID presented").await;
        };
        let bind_uuid = match m.smbios_uuid {
            Some(want) if want == presented => false,
            Some(_) => {
                return self
                    .refuse_anomaly(
                        &m,
                        from,
                        "config.uuid_mismatch",
                        "SMBIOS UUID does not match the machine",
                    )
                    .await
            }
            // A control-plane config holds the cluster's CA keys: it goes only to the UUID an
            // operator (or the machine's discovery) recorded, never to the first one presented.
            None if m.role == Some(Role::ControlPlane) => {
                return self.refuse(&m, from, CONTROL_PLANE_NEEDS_UUID).await
            }
            None => true,
        };
        match self.awaiting_approval(&m).await {
            Ok(false) => {}
            Ok(true) => return self.refuse(&m, from, AWAITING_APPROVAL).await,
            Err(e) => {
                tracing::error!(error = %e, "config fetch: approval look-up failed");
                return Err(Refusal::Unavailable);
            }
        }
        let rendered = match self.render_machine(&m).await {
            Ok(r) => r,
            // The store failed while loading the render's inputs: the config is not at fault,
            // the machine is not failed for it.
            Err(MachineConfigError::Store(e)) => {
                tracing::error!(error = %e, "config fetch: render inputs not loaded");
                return Err(Refusal::Unavailable);
            }
            Err(e) => {
                let reason = e.to_string();
                let _ = inventory
                    .set_state(
                        id,
                        None,
                        LifecycleState::Failed,
                        Some(format!("config not served: {reason}")),
                        "plinth",
                    )
                    .await;
                return self
                    .refuse(&m, from, &format!("config invalid: {reason}"))
                    .await;
            }
        };
        if bind_uuid {
            // The first UUID a machine presents with its own boot's token becomes its identity.
            match inventory
                .update(
                    id,
                    Some(m.version),
                    serde_json::json!({ "smbios_uuid": presented }),
                    "talos",
                )
                .await
            {
                Ok(_) => {
                    self.event(
                        id,
                        "config.uuid_bound",
                        serde_json::json!({ "smbios_uuid": presented, "from": from_text }),
                    )
                    .await
                }
                Err(ServiceError::Conflict(_)) => {
                    return self
                        .refuse_anomaly(
                            &m,
                            from,
                            "config.uuid_mismatch",
                            "the SMBIOS UUID belongs to another machine",
                        )
                        .await
                }
                Err(ServiceError::Store(e)) => {
                    tracing::error!(error = %e, "config fetch: UUID not recorded");
                    return Err(Refusal::Unavailable);
                }
                Err(e) => {
                    return self
                        .refuse(&m, from, &format!("SMBIOS UUID not recorded: {e}"))
                        .await
                }
            }
        }
        let served = ServedConfig {
            sealed: self.secrets.seal(
                &sealed_context("served", &id.to_string()),
                rendered.yaml.as_bytes(),
            ),
            sha256: rendered.sha256.clone(),
            at: now,
        };
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.served".into(),
            actor: "talos".into(),
            detail: serde_json::json!({ "sha256": rendered.sha256, "from": from_text,
                "talos_version": rendered.version.to_string() }),
        };
        match self
            .configs
            .record_served(id, &hashed, &served, &event)
            .await
        {
            Ok(true) => {}
            // Another fetch with this token got there first.
            Ok(false) => {
                return self
                    .refuse_anomaly(
                        &m,
                        from,
                        "config.token_reused",
                        "the token was used already",
                    )
                    .await
            }
            Err(e) => {
                tracing::error!(error = %e, "config fetch: could not record the served config");
                return Err(Refusal::Unavailable);
            }
        }
        tracing::info!(machine = %id, name = %m.display_name(), %from, sha256 = %rendered.sha256, "config served");
        Ok(rendered.yaml)
    }

    /// How `m`'s cluster releases configs (`token` when it names no declared cluster).
    pub(super) async fn delivery_of(&self, m: &Machine) -> Result<Delivery, StoreError> {
        let Some(name) = &m.cluster else {
            return Ok(Delivery::Token);
        };
        Ok(self
            .configs
            .clusters()
            .await?
            .into_iter()
            .find(|c| &c.spec.name == name)
            .and_then(|c| c.spec.delivery)
            .unwrap_or_default())
    }

    /// Does `m`'s config wait for an operator's approval of this boot's release?
    pub(super) async fn awaiting_approval(&self, m: &Machine) -> Result<bool, StoreError> {
        if self.delivery_of(m).await? != Delivery::Approve {
            return Ok(false);
        }
        Ok(self
            .configs
            .approval(m.id)
            .await?
            .is_none_or(|a| a.approved_at.is_none()))
    }

    /// Approve the release of machine `id`'s config for its current install boot, whose console
    /// shows `code`. Refused (naming `code`) when no boot awaits approval or the code is not
    /// that boot's; a wrong code is an anomaly of the machine.
    pub async fn approve(
        &self,
        id: MachineId,
        code: &str,
        actor: &str,
    ) -> Result<(), ServiceError> {
        let invalid = |message: &str| {
            let mut e = crate::domain::ValidationErrors::default();
            e.push("code", message);
            ServiceError::Invalid(e)
        };
        let Some(approval) = self.configs.approval(id).await? else {
            return Err(ServiceError::NotFound("open provisioning window".into()));
        };
        let Some(want) = approval.code_sha256 else {
            return Err(invalid(
                "no install boot of this machine awaits approval (its cluster's delivery is not `approve`, or it has not asked for its install script yet)",
            ));
        };
        if let Some(at) = approval.approved_at {
            return Err(invalid(&format!(
                "this boot's release was approved already, at {}",
                at.to_rfc3339()
            )));
        }
        let hashed = token_hash(&normalize_code(code));
        if !constant_time_eq(hashed.as_bytes(), want.as_bytes()) {
            self.anomalies.count("config.approval_code_mismatch");
            self.event(
                id,
                "config.approval_code_mismatch",
                serde_json::json!({ "actor": actor }),
            )
            .await;
            return Err(invalid(
                "does not match the code this machine's console shows for its current boot",
            ));
        }
        let event = NewEvent {
            machine_id: Some(id),
            kind: "config.approved".into(),
            actor: actor.into(),
            detail: serde_json::json!({}),
        };
        if self
            .configs
            .approve(id, &hashed, Utc::now(), &event)
            .await?
        {
            Ok(())
        } else {
            Err(invalid(
                "the boot awaiting approval changed meanwhile: read the code again",
            ))
        }
    }

    /// Refuse, with a `config.refused` event naming `reason` (throttled per source).
    async fn refuse(&self, m: &Machine, from: IpAddr, reason: &str) -> Result<String, Refusal> {
        let id = m.id;
        tracing::info!(machine = %id, name = %m.display_name(), %from, reason, "config refused");
        if let Some(suppressed) = self.throttle.admit(&(id, from, "config.refused", reason)) {
            self.event(
                id,
                "config.refused",
                serde_json::json!({ "reason": reason, "from": from.to_string(),
                    "suppressed": suppressed }),
            )
            .await;
        }
        Err(Refusal::Denied)
    }

    /// Refuse, recording an anomaly of `kind` (someone other than the machine may be asking).
    async fn refuse_anomaly(
        &self,
        m: &Machine,
        from: IpAddr,
        kind: &'static str,
        reason: &str,
    ) -> Result<String, Refusal> {
        let id = m.id;
        tracing::warn!(machine = %id, name = %m.display_name(), %from, kind, reason, "config refused: anomaly");
        self.anomaly(id, from, kind, serde_json::json!({ "reason": reason }))
            .await;
        Err(Refusal::Denied)
    }

    /// An anomaly of delivery: counted, and an event of the machine (throttled per source).
    async fn anomaly(
        &self,
        id: MachineId,
        from: IpAddr,
        kind: &'static str,
        mut detail: serde_json::Value,
    ) {
        self.anomalies.count(kind);
        if let Some(suppressed) = self.throttle.admit(&(id, from, kind)) {
            if let serde_json::Value::Object(o) = &mut detail {
                o.insert("from".into(), from.to_string().into());
                o.insert("suppressed".into(), suppressed.into());
            }
            self.event(id, kind, detail).await;
        }
    }

    async fn event(&self, id: MachineId, kind: &str, detail: serde_json::Value) {
        let event = NewEvent {
            machine_id: Some(id),
            kind: kind.into(),
            actor: "talos".into(),
            detail,
        };
        if let Err(e) = self.events.append_event(&event).await {
            tracing::warn!(error = %e, kind, "config delivery: event not written");
        }
    }

    /// Addresses a request for `m`'s config may come from: its reserved addresses and its bound
    /// leases. Empty when Plinth hands out none of them.
    async fn expected_addresses(
        &self,
        m: &Machine,
    ) -> Result<HashSet<std::net::Ipv4Addr>, StoreError> {
        let mut out: HashSet<std::net::Ipv4Addr> =
            m.interfaces.iter().filter_map(|i| i.ipv4).collect();
        let now_ms = Utc::now().timestamp_millis();
        for i in &m.interfaces {
            for l in self.leases.leases_of_mac(i.mac).await? {
                if l.state == LeaseState::Bound && l.expires_ms > now_ms {
                    out.insert(l.ip);
                }
            }
        }
        Ok(out)
    }
}

/// Why a window could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The machine or its state.
    #[error(transparent)]
    Service(ServiceError),
    /// The config does not render or validate.
    #[error(transparent)]
    Config(MachineConfigError),
}

/// An address as IPv4 (an IPv4-mapped IPv6 address too).
fn v4(ip: IpAddr) -> Option<std::net::Ipv4Addr> {
    match ip {
        IpAddr::V4(v) => Some(v),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_open_and_close() {
        let now = Utc::now();
        let mut w = ProvisionWindow {
            machine_id: MachineId::new(),
            opened_at: now,
            expires_at: now + Duration::minutes(5),
            opened_by: "t".into(),
            wipe: false,
            token_sha256: None,
            token_minted_at: None,
            token_ip: None,
            token_used_at: None,
            closed_at: None,
            close_reason: None,
        };
        assert!(w.is_open(now));
        assert!(!w.is_open(now + Duration::minutes(6)));
        w.closed_at = Some(now);
        assert!(!w.is_open(now));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
