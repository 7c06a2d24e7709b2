//! A store that fails: an implementation of every store port of `plinth::service::ports`. Each
//! call goes to the real store it wraps until the test breaks that call's port, then fails with
//! `StoreError::Backend`, as a lost database connection does. `BrokenStore::dead()` wraps no store:
//! every call fails from the start. The lease port can also be stalled (its calls wait, as on a
//! database that stopped answering, until healed). Healing a port makes it answer again.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use plinth::domain::{LifecycleState, MacAddr, Machine, MachineId, MachineRef, UniqueKey};
use plinth::service::ports::snapshots::{
    RecoveryRecord, RecoveryState, SnapshotOutcome, SnapshotRecord, SnapshotStore,
};
use plinth::service::ports::talos_state::{
    BootstrapRecord, BootstrapState, NodeVerification, TalosStateStore,
};
use plinth::service::ports::upgrades::{
    NodeStep, Rollout, RolloutEnd, RolloutNode, RolloutState, UpgradeStore,
};
use plinth::service::ports::{
    Approval, BmcCapabilityStore, CapabilityRecord, CircuitPin, ClientFacts, ClusterRecord,
    ConfigStore, ConfigWrite, Event, EventFilter, EventStore, GroupSpec, Lease, LeaseClaim,
    LeaseState, LeaseStore, MachineFilter, MachinePage, MachinePatches, MachineRecord,
    MachineStore, NewEvent, NewToken, ProfileSpec, ProvisionWindow, Reinstall, ReinstallStore,
    Reservation, ServedConfig, Stage, StoreError, StoreHealth, Stores, TokenInfo, TokenStore,
};
use uuid::Uuid;

/// One port of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Machines,
    Events,
    Tokens,
    Leases,
    BmcCapabilities,
    Configs,
    Reinstalls,
    Health,
    Talos,
    Upgrades,
    Snapshots,
}

impl Port {
    pub const ALL: [Port; 11] = [
        Port::Machines,
        Port::Events,
        Port::Tokens,
        Port::Leases,
        Port::BmcCapabilities,
        Port::Configs,
        Port::Reinstalls,
        Port::Health,
        Port::Talos,
        Port::Upgrades,
        Port::Snapshots,
    ];

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The fake; hand `Stores::of(store.clone())` to the server and keep the `Arc` to break it.
pub struct BrokenStore {
    inner: Option<Stores>,
    broken: AtomicU16,
    /// The lease port's calls wait (until `heal`).
    stalled: std::sync::atomic::AtomicBool,
    healed: tokio::sync::Notify,
}

impl BrokenStore {
    /// Every call of every port fails.
    pub fn dead() -> Arc<BrokenStore> {
        Arc::new(BrokenStore {
            inner: None,
            broken: AtomicU16::new(u16::MAX),
            stalled: Default::default(),
            healed: Default::default(),
        })
    }

    /// Answers like `inner` until a port is broken.
    pub fn over(inner: Stores) -> Arc<BrokenStore> {
        Arc::new(BrokenStore {
            inner: Some(inner),
            broken: AtomicU16::new(0),
            stalled: Default::default(),
            healed: Default::default(),
        })
    }

    /// From now on every call of `port` fails.
    pub fn break_port(&self, port: Port) {
        self.broken.fetch_or(port.bit(), Ordering::SeqCst);
    }

    /// From now on every call fails.
    pub fn break_all(&self) {
        for p in Port::ALL {
            self.break_port(p);
        }
    }

    /// From now on every call of the lease port waits, until `heal`.
    pub fn stall_leases(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    /// Every port answers again (through the wrapped store).
    pub fn heal(&self) {
        self.broken.store(0, Ordering::SeqCst);
        self.stalled.store(false, Ordering::SeqCst);
        self.healed.notify_waiters();
    }

    /// The lease port: waits while stalled, then as `port`.
    async fn leases(&self) -> Result<&Stores, StoreError> {
        loop {
            let healed = self.healed.notified();
            if !self.stalled.load(Ordering::SeqCst) {
                break;
            }
            healed.await;
        }
        self.port(Port::Leases)
    }

    /// The wrapped store, or the fault.
    fn port(&self, port: Port) -> Result<&Stores, StoreError> {
        match &self.inner {
            Some(s) if self.broken.load(Ordering::SeqCst) & port.bit() == 0 => Ok(s),
            _ => Err(StoreError::Backend(format!(
                "broken store: the {port:?} port is down"
            ))),
        }
    }
}

#[async_trait]
impl MachineStore for BrokenStore {
    async fn create_machine(
        &self,
        id: MachineId,
        state: LifecycleState,
        rec: &MachineRecord,
        event: &NewEvent,
    ) -> Result<Machine, StoreError> {
        let s = self.port(Port::Machines)?;
        s.machines.create_machine(id, state, rec, event).await
    }

    async fn update_machine(
        &self,
        id: MachineId,
        expected_version: i64,
        rec: &MachineRecord,
        event: &NewEvent,
    ) -> Result<Machine, StoreError> {
        let s = self.port(Port::Machines)?;
        s.machines
            .update_machine(id, expected_version, rec, event)
            .await
    }

    async fn delete_machine(
        &self,
        id: MachineId,
        expected_version: i64,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        let s = self.port(Port::Machines)?;
        s.machines.delete_machine(id, expected_version, event).await
    }

    async fn set_state(
        &self,
        id: MachineId,
        expected_version: Option<i64>,
        from: LifecycleState,
        to: LifecycleState,
        reason: Option<&str>,
        manual_hold: bool,
        event: &NewEvent,
    ) -> Result<Machine, StoreError> {
        let s = self.port(Port::Machines)?;
        s.machines
            .set_state(id, expected_version, from, to, reason, manual_hold, event)
            .await
    }

    async fn import_batches(
        &self,
        batches: &mut dyn plinth::service::ports::ImportBatches,
        actor: &str,
    ) -> Result<(), StoreError> {
        let s = self.port(Port::Machines)?;
        s.machines.import_batches(batches, actor).await
    }

    async fn get_machine(&self, id: MachineId) -> Result<Option<Machine>, StoreError> {
        self.port(Port::Machines)?.machines.get_machine(id).await
    }

    async fn find_machine(&self, key: &UniqueKey) -> Result<Option<Machine>, StoreError> {
        self.port(Port::Machines)?.machines.find_machine(key).await
    }

    async fn owners(&self, keys: &[UniqueKey]) -> Result<Vec<(UniqueKey, MachineRef)>, StoreError> {
        self.port(Port::Machines)?.machines.owners(keys).await
    }

    async fn list_machines(&self, filter: &MachineFilter) -> Result<MachinePage, StoreError> {
        self.port(Port::Machines)?
            .machines
            .list_machines(filter)
            .await
    }

    async fn bmc_password(&self, id: MachineId) -> Result<Option<Vec<u8>>, StoreError> {
        self.port(Port::Machines)?.machines.bmc_password(id).await
    }

    async fn machine_table(
        &self,
        filter: &MachineFilter,
        sort: plinth::service::MachineSort,
        descending: bool,
        offset: u32,
    ) -> Result<MachinePage, StoreError> {
        self.port(Port::Machines)?
            .machines
            .machine_table(filter, sort, descending, offset)
            .await
    }
}

#[async_trait]
impl EventStore for BrokenStore {
    async fn append_event(&self, event: &NewEvent) -> Result<(), StoreError> {
        self.port(Port::Events)?.events.append_event(event).await
    }

    async fn append_events(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        self.port(Port::Events)?.events.append_events(events).await
    }

    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<Event>, StoreError> {
        self.port(Port::Events)?.events.list_events(filter).await
    }

    async fn last_event_id(&self) -> Result<i64, StoreError> {
        self.port(Port::Events)?.events.last_event_id().await
    }
}

#[async_trait]
impl TokenStore for BrokenStore {
    async fn create_token(&self, token: &NewToken) -> Result<TokenInfo, StoreError> {
        self.port(Port::Tokens)?.tokens.create_token(token).await
    }

    async fn token_by_hash(&self, hash: &[u8]) -> Result<Option<TokenInfo>, StoreError> {
        self.port(Port::Tokens)?.tokens.token_by_hash(hash).await
    }

    async fn live_token(&self, id: Uuid) -> Result<Option<TokenInfo>, StoreError> {
        self.port(Port::Tokens)?.tokens.live_token(id).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError> {
        self.port(Port::Tokens)?.tokens.list_tokens().await
    }

    async fn revoke_token(&self, id: Uuid) -> Result<bool, StoreError> {
        self.port(Port::Tokens)?.tokens.revoke_token(id).await
    }

    async fn create_session(
        &self,
        session: &plinth::service::NewSession,
    ) -> Result<(), StoreError> {
        self.port(Port::Tokens)?
            .tokens
            .create_session(session)
            .await
    }

    async fn session_by_hash(
        &self,
        hash: &[u8],
    ) -> Result<Option<(TokenInfo, chrono::DateTime<chrono::Utc>)>, StoreError> {
        self.port(Port::Tokens)?.tokens.session_by_hash(hash).await
    }

    async fn delete_session(&self, hash: &[u8]) -> Result<bool, StoreError> {
        self.port(Port::Tokens)?.tokens.delete_session(hash).await
    }
}

#[async_trait]
impl LeaseStore for BrokenStore {
    async fn claim_lease(&self, claim: &LeaseClaim) -> Result<bool, StoreError> {
        self.leases().await?.leases.claim_lease(claim).await
    }

    fn is_shared(&self) -> bool {
        self.inner.as_ref().is_some_and(|s| s.leases.is_shared())
    }

    async fn lease_by_ip(&self, ip: Ipv4Addr) -> Result<Option<Lease>, StoreError> {
        self.leases().await?.leases.lease_by_ip(ip).await
    }

    async fn lease_at(&self, ip: Ipv4Addr) -> Result<Option<Lease>, StoreError> {
        self.leases().await?.leases.lease_at(ip).await
    }

    async fn lease_by_mac(&self, subnet: &str, mac: MacAddr) -> Result<Option<Lease>, StoreError> {
        self.leases().await?.leases.lease_by_mac(subnet, mac).await
    }

    async fn end_lease(
        &self,
        ip: Ipv4Addr,
        mac: MacAddr,
        state: LeaseState,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let s = self.leases().await?;
        s.leases.end_lease(ip, mac, state, expires_ms, now_ms).await
    }

    async fn busy_ips(&self, subnet: &str, now_ms: i64) -> Result<Vec<Ipv4Addr>, StoreError> {
        self.leases().await?.leases.busy_ips(subnet, now_ms).await
    }

    async fn leases_of_mac(&self, mac: MacAddr) -> Result<Vec<Lease>, StoreError> {
        self.leases().await?.leases.leases_of_mac(mac).await
    }

    async fn reservation(&self, mac: MacAddr) -> Result<Option<Reservation>, StoreError> {
        self.leases().await?.leases.reservation(mac).await
    }

    async fn reserved_for_other(&self, ip: Ipv4Addr, mac: MacAddr) -> Result<bool, StoreError> {
        self.leases()
            .await?
            .leases
            .reserved_for_other(ip, mac)
            .await
    }

    async fn client_facts(
        &self,
        subnet: &str,
        mac: MacAddr,
        ips: [Option<Ipv4Addr>; 2],
    ) -> Result<ClientFacts, StoreError> {
        let s = self.leases().await?;
        s.leases.client_facts(subnet, mac, ips).await
    }
    async fn pin_circuit(
        &self,
        machine: MachineId,
        pin: &CircuitPin,
    ) -> Result<CircuitPin, StoreError> {
        self.leases().await?.leases.pin_circuit(machine, pin).await
    }
    async fn circuit_pin(&self, machine: MachineId) -> Result<Option<CircuitPin>, StoreError> {
        self.leases().await?.leases.circuit_pin(machine).await
    }
    async fn set_circuit_pin(
        &self,
        machine: MachineId,
        pin: Option<&CircuitPin>,
    ) -> Result<(), StoreError> {
        self.leases()
            .await?
            .leases
            .set_circuit_pin(machine, pin)
            .await
    }
}

#[async_trait]
impl BmcCapabilityStore for BrokenStore {
    async fn put_bmc_capabilities(
        &self,
        rec: &CapabilityRecord,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        let s = self.port(Port::BmcCapabilities)?;
        s.bmc_capabilities.put_bmc_capabilities(rec, event).await
    }

    async fn bmc_capabilities(
        &self,
        id: MachineId,
    ) -> Result<Option<CapabilityRecord>, StoreError> {
        let s = self.port(Port::BmcCapabilities)?;
        s.bmc_capabilities.bmc_capabilities(id).await
    }
}

#[async_trait]
impl ConfigStore for BrokenStore {
    async fn put_config_objects(
        &self,
        write: &ConfigWrite,
        events: &[NewEvent],
    ) -> Result<(), StoreError> {
        let s = self.port(Port::Configs)?;
        s.configs.put_config_objects(write, events).await
    }

    async fn clusters(&self) -> Result<Vec<ClusterRecord>, StoreError> {
        self.port(Port::Configs)?.configs.clusters().await
    }

    async fn profiles(&self) -> Result<Vec<ProfileSpec>, StoreError> {
        self.port(Port::Configs)?.configs.profiles().await
    }

    async fn groups(&self) -> Result<Vec<GroupSpec>, StoreError> {
        self.port(Port::Configs)?.configs.groups().await
    }

    async fn machine_config(
        &self,
        id: MachineId,
    ) -> Result<(MachinePatches, Option<ServedConfig>), StoreError> {
        self.port(Port::Configs)?.configs.machine_config(id).await
    }

    async fn all_machine_patches(&self) -> Result<Vec<(MachineId, MachinePatches)>, StoreError> {
        self.port(Port::Configs)?
            .configs
            .all_machine_patches()
            .await
    }

    async fn record_served(
        &self,
        id: MachineId,
        token_sha256: &str,
        served: &ServedConfig,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        let s = self.port(Port::Configs)?;
        s.configs
            .record_served(id, token_sha256, served, event)
            .await
    }

    async fn put_window(&self, w: &ProvisionWindow, event: &NewEvent) -> Result<(), StoreError> {
        self.port(Port::Configs)?.configs.put_window(w, event).await
    }

    async fn window(&self, id: MachineId) -> Result<Option<ProvisionWindow>, StoreError> {
        self.port(Port::Configs)?.configs.window(id).await
    }

    async fn set_window_token(
        &self,
        id: MachineId,
        token_sha256: &str,
        ip: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let s = self.port(Port::Configs)?;
        s.configs.set_window_token(id, token_sha256, ip, now).await
    }

    async fn close_window(
        &self,
        id: MachineId,
        now: DateTime<Utc>,
        reason: &str,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        let s = self.port(Port::Configs)?;
        s.configs.close_window(id, now, reason, event).await
    }
    async fn approval(&self, id: MachineId) -> Result<Option<Approval>, StoreError> {
        self.port(Port::Configs)?.configs.approval(id).await
    }
    async fn set_approval_code(
        &self,
        id: MachineId,
        code_sha256: &str,
    ) -> Result<bool, StoreError> {
        self.port(Port::Configs)?
            .configs
            .set_approval_code(id, code_sha256)
            .await
    }
    async fn approve(
        &self,
        id: MachineId,
        code_sha256: &str,
        now: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        self.port(Port::Configs)?
            .configs
            .approve(id, code_sha256, now, event)
            .await
    }
}

#[async_trait]
impl ReinstallStore for BrokenStore {
    async fn reinstall(&self, id: MachineId) -> Result<Option<Reinstall>, StoreError> {
        self.port(Port::Reinstalls)?.reinstalls.reinstall(id).await
    }

    async fn active_reinstalls(&self) -> Result<Vec<Reinstall>, StoreError> {
        self.port(Port::Reinstalls)?
            .reinstalls
            .active_reinstalls()
            .await
    }

    async fn start_reinstall(&self, r: &Reinstall, event: &NewEvent) -> Result<bool, StoreError> {
        self.port(Port::Reinstalls)?
            .reinstalls
            .start_reinstall(r, event)
            .await
    }

    async fn advance_reinstall(
        &self,
        r: &Reinstall,
        from: Stage,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        let s = self.port(Port::Reinstalls)?;
        s.reinstalls.advance_reinstall(r, from, event).await
    }
}

#[async_trait]
impl StoreHealth for BrokenStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.port(Port::Health)?.health.ping().await
    }
    async fn write_probe(&self, instance: &str) -> Result<(), StoreError> {
        self.port(Port::Health)?.health.write_probe(instance).await
    }
    async fn key_fingerprint(&self) -> Result<Option<String>, StoreError> {
        self.port(Port::Health)?.health.key_fingerprint().await
    }
    async fn claim_key_fingerprint(&self, fingerprint: &str) -> Result<String, StoreError> {
        self.port(Port::Health)?
            .health
            .claim_key_fingerprint(fingerprint)
            .await
    }
    async fn holds_sealed_values(&self) -> Result<bool, StoreError> {
        self.port(Port::Health)?.health.holds_sealed_values().await
    }
    async fn migration_gap(&self) -> Result<plinth::service::ports::MigrationGap, StoreError> {
        self.port(Port::Health)?.health.migration_gap().await
    }
    fn observe_commits(&self, observer: Arc<dyn plinth::service::ports::CommitObserver>) {
        if let Some(s) = &self.inner {
            s.health.observe_commits(observer);
        }
    }
}

#[async_trait]
impl TalosStateStore for BrokenStore {
    async fn claim_bootstrap(
        &self,
        r: &BootstrapRecord,
        event: &NewEvent,
    ) -> Result<Option<BootstrapRecord>, StoreError> {
        self.port(Port::Talos)?
            .talos
            .claim_bootstrap(r, event)
            .await
    }

    async fn finish_bootstrap(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        state: BootstrapState,
        detail: &str,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        self.port(Port::Talos)?
            .talos
            .finish_bootstrap(cluster, attempt_id, state, detail, at, event)
            .await
    }

    async fn release_bootstrap(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        self.port(Port::Talos)?
            .talos
            .release_bootstrap(cluster, attempt_id, event)
            .await
    }

    async fn cluster_bootstrap(
        &self,
        cluster: &str,
    ) -> Result<Option<BootstrapRecord>, StoreError> {
        self.port(Port::Talos)?
            .talos
            .cluster_bootstrap(cluster)
            .await
    }

    async fn record_verification(
        &self,
        v: &NodeVerification,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        self.port(Port::Talos)?
            .talos
            .record_verification(v, event)
            .await
    }

    async fn verifications(&self) -> Result<Vec<NodeVerification>, StoreError> {
        self.port(Port::Talos)?.talos.verifications().await
    }

    async fn put_health(
        &self,
        cluster: &str,
        report: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.port(Port::Talos)?
            .talos
            .put_health(cluster, report, at)
            .await
    }

    async fn cluster_health(
        &self,
        cluster: &str,
    ) -> Result<Option<(String, DateTime<Utc>)>, StoreError> {
        self.port(Port::Talos)?.talos.cluster_health(cluster).await
    }
}

#[async_trait]
impl UpgradeStore for BrokenStore {
    async fn create_rollout(
        &self,
        r: &Rollout,
        nodes: &[RolloutNode],
        event: &NewEvent,
    ) -> Result<Option<Rollout>, StoreError> {
        self.port(Port::Upgrades)?
            .upgrades
            .create_rollout(r, nodes, event)
            .await
    }

    async fn rollout(&self, id: Uuid) -> Result<Option<(Rollout, Vec<RolloutNode>)>, StoreError> {
        self.port(Port::Upgrades)?.upgrades.rollout(id).await
    }

    async fn latest_rollout(
        &self,
        cluster: &str,
    ) -> Result<Option<(Rollout, Vec<RolloutNode>)>, StoreError> {
        self.port(Port::Upgrades)?
            .upgrades
            .latest_rollout(cluster)
            .await
    }

    async fn active_rollouts(&self) -> Result<Vec<Rollout>, StoreError> {
        self.port(Port::Upgrades)?.upgrades.active_rollouts().await
    }

    async fn claim_rollout(
        &self,
        id: Uuid,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.port(Port::Upgrades)?
            .upgrades
            .claim_rollout(id, owner, now, until)
            .await
    }

    async fn renew_rollout(
        &self,
        id: Uuid,
        owner: &str,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.port(Port::Upgrades)?
            .upgrades
            .renew_rollout(id, owner, until)
            .await
    }

    async fn release_rollout(&self, id: Uuid, owner: &str) -> Result<(), StoreError> {
        self.port(Port::Upgrades)?
            .upgrades
            .release_rollout(id, owner)
            .await
    }

    async fn advance_node(
        &self,
        id: Uuid,
        owner: &str,
        node: &RolloutNode,
        from: NodeStep,
        event: Option<&NewEvent>,
    ) -> Result<bool, StoreError> {
        self.port(Port::Upgrades)?
            .upgrades
            .advance_node(id, owner, node, from, event)
            .await
    }

    async fn set_rollout_state(
        &self,
        id: Uuid,
        from: &[RolloutState],
        to: RolloutState,
        note: Option<&str>,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<Option<Rollout>, StoreError> {
        self.port(Port::Upgrades)?
            .upgrades
            .set_rollout_state(id, from, to, note, at, event)
            .await
    }

    async fn end_rollout(
        &self,
        id: Uuid,
        owner: &str,
        end: &RolloutEnd,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        self.port(Port::Upgrades)?
            .upgrades
            .end_rollout(id, owner, end, event)
            .await
    }
}

#[async_trait]
impl SnapshotStore for BrokenStore {
    async fn take_snapshot_turn(
        &self,
        cluster: &str,
        instance: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .take_snapshot_turn(cluster, instance, now, until)
            .await
    }
    async fn release_snapshot_turn(&self, cluster: &str, instance: &str) -> Result<(), StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .release_snapshot_turn(cluster, instance)
            .await
    }
    async fn insert_snapshot(
        &self,
        r: &SnapshotRecord,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .insert_snapshot(r, event)
            .await
    }
    async fn finish_snapshot(
        &self,
        id: Uuid,
        outcome: &SnapshotOutcome,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .finish_snapshot(id, outcome, event)
            .await
    }
    async fn mark_snapshot_deleted(&self, id: Uuid, event: &NewEvent) -> Result<bool, StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .mark_snapshot_deleted(id, event)
            .await
    }
    async fn snapshots(
        &self,
        cluster: &str,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .snapshots(cluster, limit)
            .await
    }
    async fn snapshot(&self, id: Uuid) -> Result<Option<SnapshotRecord>, StoreError> {
        self.port(Port::Snapshots)?.snapshots.snapshot(id).await
    }
    async fn claim_recovery(
        &self,
        r: &RecoveryRecord,
        event: &NewEvent,
    ) -> Result<Option<RecoveryRecord>, StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .claim_recovery(r, event)
            .await
    }
    async fn finish_recovery(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        state: RecoveryState,
        detail: &str,
        at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .finish_recovery(cluster, attempt_id, state, detail, at, event)
            .await
    }
    async fn release_recovery(
        &self,
        cluster: &str,
        attempt_id: Uuid,
        event: &NewEvent,
    ) -> Result<bool, StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .release_recovery(cluster, attempt_id, event)
            .await
    }
    async fn recovery(&self, cluster: &str) -> Result<Option<RecoveryRecord>, StoreError> {
        self.port(Port::Snapshots)?
            .snapshots
            .recovery(cluster)
            .await
    }
}
