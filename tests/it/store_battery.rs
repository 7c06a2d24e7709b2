//! One store battery, run against SQLite and PostgreSQL through the ports (`service::ports`):
//! machines (CRUD, version conflicts, uniqueness conflicts, filters and pages, BMC passwords, the
//! search column's backfill by migration 0021),
//! events (order, filters), API tokens, DHCP leases (claims, the conditional upsert, expiry, the
//! group commit, SQLite's writer turns), BMC capability records, config objects, served configs
//! and provisioning windows, reinstalls, upgrade rollouts, and the health ping. Each case opens a
//! fresh database.

use crate::support;

use std::net::Ipv4Addr;
use std::sync::Arc;

use chrono::{DateTime, Duration, SubsecRound, Utc};
use plinth::domain::{
    Bmc, Disk, DiskType, Interface, LifecycleState, MacAddr, Machine, MachineId, MachineSpec, Role,
    TlsMode, UniqueKey,
};
use plinth::service::ports::bmc::{Capabilities, EtagSupport, MediaLocation};
use plinth::service::ports::{
    ApiRole, CapabilityRecord, ClusterRecord, ClusterSpec, ConfigWrite, EventFilter, GroupKind,
    GroupSpec, LeaseClaim, LeaseState, MachineFilter, MachinePatches, MachineRecord, NewEvent,
    NewToken, PasswordChange, PatchSource, ProfileSpec, ProvisionWindow, Reinstall, ServedConfig,
    Stage, StoreError, Stores,
};
use support::{Backend, TestDb};

/// Now, at the precision both databases keep (PostgreSQL: microseconds).
fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

fn event(id: Option<MachineId>, kind: &str) -> NewEvent {
    NewEvent {
        machine_id: id,
        kind: kind.into(),
        actor: "test".into(),
        detail: serde_json::json!({ "n": kind }),
    }
}

fn mac(text: &str) -> MacAddr {
    text.parse().expect("mac")
}

/// A machine with every unique value set from `n`, one boot NIC, one disk and a BMC.
fn spec(n: u8) -> MachineSpec {
    MachineSpec {
        hostname: Some(format!("node-{n}")),
        smbios_uuid: Some(uuid::Uuid::from_u128(0x1000 + u128::from(n))),
        serial: Some(format!("SN-{n}")),
        asset_tag: Some(format!("AT-{n}")),
        manufacturer: Some("Acme".into()),
        model: Some("R1".into()),
        site: Some("par1".into()),
        rack: Some(format!("r{}", n % 2)),
        rack_unit: Some(u16::from(n)),
        role: Some(if n % 2 == 0 {
            Role::Worker
        } else {
            Role::ControlPlane
        }),
        cluster: Some("c1".into()),
        profile: None,
        interfaces: vec![
            Interface {
                mac: mac(&format!("52:54:00:b0:00:{n:02x}")),
                ipv4: Some(Ipv4Addr::new(10, 9, 0, n)),
                boot: true,
                name: Some("eno1".into()),
            },
            Interface {
                mac: mac(&format!("52:54:00:b1:00:{n:02x}")),
                ipv4: None,
                boot: false,
                name: None,
            },
        ],
        disks: vec![Disk {
            serial: Some(format!("D-{n}")),
            wwid: None,
            model: Some("NVMe 1TB".into()),
            size_bytes: Some(1_000_000_000_000),
            disk_type: Some(DiskType::Nvme),
            bus_path: None,
            data_disk: false,
        }],
        bmc: Some(plinth::domain::BmcSpec {
            url: format!("https://10.8.0.{n}"),
            username: "root".into(),
            password: None,
            tls: TlsMode::Insecure,
            fingerprint: None,
        }),
    }
}

fn record(spec: MachineSpec, password: PasswordChange) -> MachineRecord {
    MachineRecord { spec, password }
}

async fn create(st: &Stores, n: u8) -> Machine {
    let id = MachineId::new();
    st.machines
        .create_machine(
            id,
            LifecycleState::Registered,
            &record(spec(n), PasswordChange::Set(vec![n; 40])),
            &event(Some(id), "machine.created"),
        )
        .await
        .expect("create")
}

/// A machine's events of one kind.
async fn events_of(st: &Stores, id: MachineId, kind: &str) -> usize {
    st.events
        .list_events(&EventFilter {
            machine_id: Some(id),
            kind_prefix: Some(kind.into()),
            after_id: None,
            limit: 1000,
        })
        .await
        .expect("events")
        .len()
}

/// Create, read back, look up by every unique value, update (children replaced, version bumped),
/// change state, delete; each write with its event.
async fn machines_crud(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let m = create(&st, 1).await;
    assert_eq!(m.version, 1);
    assert_eq!(m.state, LifecycleState::Registered);
    assert_eq!(m.spec(), spec(1));
    assert_eq!(
        m.bmc,
        Some(Bmc {
            url: "https://10.8.0.1".into(),
            username: "root".into(),
            tls: TlsMode::Insecure,
            fingerprint: None,
            has_password: true,
        })
    );
    assert_eq!(
        st.machines.get_machine(m.id).await.expect("get"),
        Some(m.clone())
    );
    assert_eq!(
        st.machines
            .get_machine(MachineId::new())
            .await
            .expect("get"),
        None
    );
    let s = spec(1);
    for key in [
        UniqueKey::Hostname("node-1".into()),
        UniqueKey::Serial("SN-1".into()),
        UniqueKey::AssetTag("AT-1".into()),
        UniqueKey::SmbiosUuid(s.smbios_uuid.expect("uuid")),
        UniqueKey::Mac(s.interfaces[0].mac),
        UniqueKey::Mac(s.interfaces[1].mac),
        UniqueKey::Ipv4(Ipv4Addr::new(10, 9, 0, 1)),
    ] {
        let found = st.machines.find_machine(&key).await.expect("find");
        assert_eq!(found.map(|f| f.id), Some(m.id), "{key:?}");
    }
    for key in [
        UniqueKey::Hostname("node-2".into()),
        UniqueKey::Mac(mac("52:54:00:ff:ff:ff")),
        UniqueKey::Ipv4(Ipv4Addr::new(10, 9, 0, 2)),
    ] {
        assert!(
            st.machines
                .find_machine(&key)
                .await
                .expect("find")
                .is_none(),
            "{key:?}"
        );
    }
    assert_eq!(events_of(&st, m.id, "machine.created").await, 1);

    // Update: fields and children replaced, version bumped.
    let mut changed = spec(1);
    changed.model = Some("R2".into());
    changed.interfaces.truncate(1);
    changed.disks.clear();
    let u = st
        .machines
        .update_machine(
            m.id,
            1,
            &record(changed.clone(), PasswordChange::Keep),
            &event(Some(m.id), "machine.updated"),
        )
        .await
        .expect("update");
    assert_eq!(u.version, 2);
    assert_eq!(u.model.as_deref(), Some("R2"));
    assert_eq!(u.interfaces.len(), 1);
    assert!(u.disks.is_empty());
    assert!(st
        .machines
        .find_machine(&UniqueKey::Mac(s.interfaces[1].mac))
        .await
        .expect("find")
        .is_none());
    assert_eq!(events_of(&st, m.id, "machine.updated").await, 1);

    // State: from the state it is in, at its version.
    let st2 = st
        .machines
        .set_state(
            m.id,
            Some(2),
            LifecycleState::Registered,
            LifecycleState::Failed,
            Some("disk gone"),
            true,
            &event(Some(m.id), "machine.state"),
        )
        .await
        .expect("state");
    assert_eq!(
        (st2.state, st2.state_reason.as_deref(), st2.version),
        (LifecycleState::Failed, Some("disk gone"), 3)
    );
    // Who set the state, and that a person did, are recorded with it.
    assert_eq!(
        (st2.state_by.as_deref(), st2.manual_hold),
        (Some("test"), true)
    );
    let st3 = st
        .machines
        .set_state(
            m.id,
            None,
            LifecycleState::Failed,
            LifecycleState::Ready,
            None,
            false,
            &event(Some(m.id), "machine.state"),
        )
        .await
        .expect("state without a version");
    assert_eq!(
        (st3.state, st3.state_reason, st3.version),
        (LifecycleState::Ready, None, 4)
    );
    assert!(
        !st3.manual_hold,
        "the next state change sets the hold again"
    );
    assert_eq!(events_of(&st, m.id, "machine.state").await, 2);

    st.machines
        .delete_machine(m.id, 4, &event(Some(m.id), "machine.deleted"))
        .await
        .expect("delete");
    assert_eq!(st.machines.get_machine(m.id).await.expect("get"), None);
    assert!(st
        .machines
        .find_machine(&UniqueKey::Hostname("node-1".into()))
        .await
        .expect("find")
        .is_none());
    // History outlives the machine.
    assert_eq!(events_of(&st, m.id, "machine.").await, 5);
    db.drop_db().await;
}

/// Optimistic concurrency: a stale version is refused with both versions; a missing machine is
/// NotFound; a state change from a state the machine is no longer in is refused.
async fn machines_version_conflicts(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let m = create(&st, 3).await;
    let ev = event(Some(m.id), "machine.updated");
    st.machines
        .update_machine(m.id, 1, &record(spec(3), PasswordChange::Keep), &ev)
        .await
        .expect("first update");
    let stale = st
        .machines
        .update_machine(m.id, 1, &record(spec(3), PasswordChange::Keep), &ev)
        .await;
    assert!(
        matches!(
            stale,
            Err(StoreError::VersionMismatch {
                expected: 1,
                current: 2
            })
        ),
        "{stale:?}"
    );
    let stale = st.machines.delete_machine(m.id, 1, &ev).await;
    assert!(
        matches!(
            stale,
            Err(StoreError::VersionMismatch {
                expected: 1,
                current: 2
            })
        ),
        "{stale:?}"
    );
    let stale = st
        .machines
        .set_state(
            m.id,
            Some(1),
            LifecycleState::Registered,
            LifecycleState::Ready,
            None,
            false,
            &ev,
        )
        .await;
    assert!(
        matches!(
            stale,
            Err(StoreError::VersionMismatch {
                expected: 1,
                current: 2
            })
        ),
        "{stale:?}"
    );
    let moved = st
        .machines
        .set_state(
            m.id,
            None,
            LifecycleState::Failed,
            LifecycleState::Ready,
            None,
            false,
            &ev,
        )
        .await;
    assert!(
        matches!(
            moved,
            Err(StoreError::VersionMismatch {
                expected: -1,
                current: 2
            })
        ),
        "{moved:?}"
    );
    let gone = MachineId::new();
    for r in [
        st.machines
            .update_machine(gone, 1, &record(spec(4), PasswordChange::Keep), &ev)
            .await
            .map(|_| ()),
        st.machines.delete_machine(gone, 1, &ev).await,
        st.machines
            .set_state(
                gone,
                None,
                LifecycleState::Registered,
                LifecycleState::Ready,
                None,
                false,
                &ev,
            )
            .await
            .map(|_| ()),
    ] {
        assert!(matches!(r, Err(StoreError::NotFound)), "{r:?}");
    }
    // Nothing of the refused writes was kept.
    let now = st
        .machines
        .get_machine(m.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!((now.version, now.state), (2, LifecycleState::Registered));
    assert_eq!(events_of(&st, m.id, "machine.updated").await, 1);
    db.drop_db().await;
}

/// Gives a spec one unique value of machine 5.
type Take = fn(&mut MachineSpec);

/// Every unique value is a constraint of the schema: taking another machine's is a Conflict, on
/// create and on update, and nothing of the refused write is kept. An import with one taken value
/// imports nothing.
async fn machines_uniqueness_conflicts(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let a = create(&st, 5).await;
    let taken: [(&str, Take); 6] = [
        ("hostname", |s| s.hostname = Some("node-5".into())),
        ("serial", |s| s.serial = Some("SN-5".into())),
        ("asset tag", |s| s.asset_tag = Some("AT-5".into())),
        ("smbios uuid", |s| s.smbios_uuid = spec(5).smbios_uuid),
        ("mac", |s| s.interfaces[1].mac = spec(5).interfaces[0].mac),
        ("ipv4", |s| {
            s.interfaces[0].ipv4 = spec(5).interfaces[0].ipv4
        }),
    ];
    let b_machine = create(&st, 6).await;
    for (what, take) in taken {
        let mut s = spec(7);
        take(&mut s);
        let id = MachineId::new();
        let r = st
            .machines
            .create_machine(
                id,
                LifecycleState::Registered,
                &record(s, PasswordChange::Clear),
                &event(Some(id), "machine.created"),
            )
            .await;
        assert!(
            matches!(r, Err(StoreError::Conflict(_))),
            "create, {what}: {r:?}"
        );
        assert_eq!(
            st.machines.get_machine(id).await.expect("get"),
            None,
            "{what}"
        );
        assert_eq!(events_of(&st, id, "").await, 0, "{what}");

        let mut s = spec(6);
        take(&mut s);
        let r = st
            .machines
            .update_machine(
                b_machine.id,
                1,
                &record(s, PasswordChange::Keep),
                &event(Some(b_machine.id), "machine.updated"),
            )
            .await;
        assert!(
            matches!(r, Err(StoreError::Conflict(_))),
            "update, {what}: {r:?}"
        );
    }
    let kept = st
        .machines
        .get_machine(b_machine.id)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(kept, b_machine, "refused updates left machine 6 as it was");

    // owners: who holds which values.
    let owners = st
        .machines
        .owners(&[
            UniqueKey::Hostname("node-5".into()),
            UniqueKey::Serial("SN-6".into()),
            UniqueKey::Mac(spec(5).interfaces[1].mac),
            UniqueKey::SmbiosUuid(spec(6).smbios_uuid.expect("uuid")),
            UniqueKey::Hostname("nobody".into()),
        ])
        .await
        .expect("owners");
    let mut got: Vec<(UniqueKey, MachineId, String)> =
        owners.into_iter().map(|(k, o)| (k, o.id, o.name)).collect();
    got.sort_by_key(|(k, _, _)| k.to_string());
    let mut want = vec![
        (
            UniqueKey::Hostname("node-5".into()),
            a.id,
            "node-5".to_string(),
        ),
        (
            UniqueKey::Serial("SN-6".into()),
            b_machine.id,
            "node-6".to_string(),
        ),
        (
            UniqueKey::Mac(spec(5).interfaces[1].mac),
            a.id,
            "node-5".to_string(),
        ),
        (
            UniqueKey::SmbiosUuid(spec(6).smbios_uuid.expect("uuid")),
            b_machine.id,
            "node-6".to_string(),
        ),
    ];
    want.sort_by_key(|(k, _, _)| k.to_string());
    assert_eq!(got, want);

    // Import: all or none.
    let rows: Vec<(MachineId, MachineRecord)> = [8u8, 9, 5]
        .iter()
        .map(|n| (MachineId::new(), record(spec(*n), PasswordChange::Clear)))
        .collect();
    let r = st.machines.import_machines(&rows, "test").await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    for (id, _) in &rows {
        assert_eq!(st.machines.get_machine(*id).await.expect("get"), None);
    }
    let rows: Vec<(MachineId, MachineRecord)> = [8u8, 9]
        .iter()
        .map(|n| (MachineId::new(), record(spec(*n), PasswordChange::Clear)))
        .collect();
    st.machines
        .import_machines(&rows, "test")
        .await
        .expect("import");
    for (id, _) in &rows {
        let m = st
            .machines
            .get_machine(*id)
            .await
            .expect("get")
            .expect("row");
        assert_eq!((m.state, m.version), (LifecycleState::Registered, 1));
        assert_eq!(events_of(&st, *id, "machine.created").await, 1);
    }
    db.drop_db().await;
}

/// Listing: every filter, free text (LIKE wildcards taken literally), keyset pages and totals.
async fn machines_filters_and_pages(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let mut ids = Vec::new();
    for n in 10..=14u8 {
        ids.push(create(&st, n).await.id);
    }
    // A host name with a LIKE wildcard in it, and one the wildcard would match.
    let id = MachineId::new();
    let mut odd = spec(15);
    odd.hostname = Some("a_b".into());
    st.machines
        .create_machine(
            id,
            LifecycleState::Ready,
            &record(odd, PasswordChange::Clear),
            &event(Some(id), "machine.created"),
        )
        .await
        .expect("create");
    let mut plain = spec(16);
    plain.hostname = Some("axb".into());
    let id2 = MachineId::new();
    st.machines
        .create_machine(
            id2,
            LifecycleState::Registered,
            &record(plain, PasswordChange::Clear),
            &event(Some(id2), "machine.created"),
        )
        .await
        .expect("create");
    ids.push(id);
    ids.push(id2);

    let list = |f: MachineFilter| {
        let st = st.clone();
        async move {
            let page = st.machines.list_machines(&f).await.expect("list");
            (
                page.total,
                page.items.iter().map(|m| m.id).collect::<Vec<_>>(),
            )
        }
    };
    let all = MachineFilter {
        limit: 100,
        ..Default::default()
    };
    let cases: Vec<(&str, MachineFilter, Vec<MachineId>)> = vec![
        ("all", all.clone(), ids.clone()),
        (
            "state",
            MachineFilter {
                state: Some(LifecycleState::Ready),
                ..all.clone()
            },
            vec![id],
        ),
        (
            "rack",
            MachineFilter {
                rack: Some("r0".into()),
                ..all.clone()
            },
            vec![ids[0], ids[2], ids[4], id2],
        ),
        (
            "role",
            MachineFilter {
                role: Some(Role::ControlPlane),
                ..all.clone()
            },
            vec![ids[1], ids[3], id],
        ),
        (
            "site and cluster",
            MachineFilter {
                site: Some("par1".into()),
                cluster: Some("c1".into()),
                ..all.clone()
            },
            ids.clone(),
        ),
        (
            "no such site",
            MachineFilter {
                site: Some("ams1".into()),
                ..all.clone()
            },
            vec![],
        ),
        (
            "text: serial",
            MachineFilter {
                q: Some("sn-12".into()),
                ..all.clone()
            },
            vec![ids[2]],
        ),
        (
            "text: mac",
            MachineFilter {
                q: Some("B0:00:0D".into()),
                ..all.clone()
            },
            vec![ids[3]],
        ),
        (
            "text: address",
            MachineFilter {
                q: Some("10.9.0.14".into()),
                ..all.clone()
            },
            vec![ids[4]],
        ),
        (
            "text: wildcard taken literally",
            MachineFilter {
                q: Some("a_b".into()),
                ..all.clone()
            },
            vec![id],
        ),
        (
            "text: blank is no filter",
            MachineFilter {
                q: Some("  ".into()),
                ..all.clone()
            },
            ids.clone(),
        ),
    ];
    for (what, f, want) in cases {
        let (total, got) = list(f).await;
        assert_eq!(got, want, "{what}");
        assert_eq!(total, want.len() as i64, "{what}");
    }
    // Pages of two, in id order, each with the total; the last has no cursor.
    let mut seen = Vec::new();
    let mut f = MachineFilter {
        limit: 2,
        ..Default::default()
    };
    loop {
        let page = st.machines.list_machines(&f).await.expect("page");
        assert_eq!(page.total, ids.len() as i64);
        assert!(page.items.len() <= 2);
        assert!(
            page.items.iter().all(|m| m.interfaces.len() == 2),
            "children attached"
        );
        seen.extend(page.items.iter().map(|m| m.id));
        match page.next_cursor {
            Some(c) => f.after = Some(c.parse().expect("cursor")),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    // The provided paging: every machine a filter selects, in pages of two; a visit that stops
    // after its first page reads no further.
    f.after = None;
    let every: Vec<MachineId> = st
        .machines
        .all_machines(&f)
        .await
        .expect("all")
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(every, ids);
    let mut pages = Vec::new();
    st.machines
        .visit_machines(&f, &mut |page| {
            pages.push(page.len());
            false
        })
        .await
        .expect("visit");
    assert_eq!(pages, [2], "one page read, then stopped");
    db.drop_db().await;
}

/// The sealed BMC password: set on create, kept, replaced, cleared; gone with the BMC.
async fn machines_bmc_passwords(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let m = create(&st, 20).await;
    assert_eq!(
        st.machines.bmc_password(m.id).await.expect("pw"),
        Some(vec![20; 40])
    );
    let steps: [(PasswordChange, bool, Option<Vec<u8>>); 4] = [
        (PasswordChange::Keep, true, Some(vec![20; 40])),
        (PasswordChange::Set(vec![7; 40]), true, Some(vec![7; 40])),
        (PasswordChange::Clear, true, None),
        (PasswordChange::Set(vec![8; 40]), false, None),
    ];
    for (n, (change, with_bmc, want)) in steps.into_iter().enumerate() {
        let mut s = spec(20);
        if !with_bmc {
            s.bmc = None;
        }
        let u = st
            .machines
            .update_machine(
                m.id,
                1 + n as i64,
                &record(s, change.clone()),
                &event(Some(m.id), "machine.updated"),
            )
            .await
            .expect("update");
        assert_eq!(
            st.machines.bmc_password(m.id).await.expect("pw"),
            want,
            "{change:?}"
        );
        assert_eq!(
            u.bmc.map(|b| b.has_password),
            with_bmc.then_some(want.is_some()),
            "{change:?}"
        );
    }
    assert_eq!(
        st.machines
            .bmc_password(MachineId::new())
            .await
            .expect("pw"),
        None
    );
    db.drop_db().await;
}

/// The event log: appended in order (one at a time and in batches), read by machine, by kind
/// prefix (wildcards taken literally), after an id, and the newest N oldest first.
async fn events_order_and_filters(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    assert_eq!(st.events.last_event_id().await.expect("last"), 0);
    let (m1, m2) = (MachineId::new(), MachineId::new());
    st.events
        .append_event(&event(Some(m1), "boot.script"))
        .await
        .expect("append");
    st.events
        .append_events(&[
            event(Some(m2), "boot.script"),
            event(Some(m1), "dhcp.ack"),
            event(None, "token.created"),
            event(Some(m1), "a_b"),
            event(Some(m1), "axb"),
        ])
        .await
        .expect("append batch");
    st.events.append_events(&[]).await.expect("an empty batch");
    st.events
        .append_event(&event(Some(m1), "bootx"))
        .await
        .expect("append");
    let all = st
        .events
        .list_events(&EventFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("all");
    let kinds: Vec<&str> = all.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "boot.script",
            "boot.script",
            "dhcp.ack",
            "token.created",
            "a_b",
            "axb",
            "bootx"
        ]
    );
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "ids ascend");
    assert_eq!(all[2].detail, serde_json::json!({ "n": "dhcp.ack" }));
    assert_eq!(all[3].machine_id, None);
    let last = st.events.last_event_id().await.expect("last");
    assert_eq!(last, all[6].id);

    let kinds_of = |f: EventFilter| {
        let st = st.clone();
        async move {
            st.events
                .list_events(&f)
                .await
                .expect("list")
                .into_iter()
                .map(|e| e.kind)
                .collect::<Vec<_>>()
        }
    };
    let of_m1 = EventFilter {
        machine_id: Some(m1),
        limit: 100,
        ..Default::default()
    };
    let cases: Vec<(&str, EventFilter, Vec<&str>)> = vec![
        (
            "machine",
            of_m1.clone(),
            vec!["boot.script", "dhcp.ack", "a_b", "axb", "bootx"],
        ),
        (
            "prefix",
            EventFilter {
                kind_prefix: Some("boot.".into()),
                ..of_m1.clone()
            },
            vec!["boot.script"],
        ),
        (
            "prefix with a wildcard",
            EventFilter {
                kind_prefix: Some("a_".into()),
                ..of_m1.clone()
            },
            vec!["a_b"],
        ),
        (
            "after an id",
            EventFilter {
                after_id: Some(all[3].id),
                limit: 2,
                ..Default::default()
            },
            vec!["a_b", "axb"],
        ),
        (
            "the newest two, oldest first",
            EventFilter {
                limit: 2,
                ..Default::default()
            },
            vec!["axb", "bootx"],
        ),
        (
            "after the last",
            EventFilter {
                after_id: Some(last),
                limit: 10,
                ..Default::default()
            },
            vec![],
        ),
    ];
    for (what, f, want) in cases {
        assert_eq!(kinds_of(f).await, want, "{what}");
    }
    db.drop_db().await;
}

fn token(name: &str, fill: u8, expires_at: Option<DateTime<Utc>>) -> NewToken {
    NewToken {
        id: uuid::Uuid::now_v7(),
        name: name.into(),
        role: ApiRole::Operator,
        hash: vec![fill; 32],
        expires_at,
    }
}

/// API tokens: found by hash while live; expired and revoked ones are not; revoking twice is
/// false; a hash is unique.
async fn tokens_lifecycle(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let live = token("live", 1, Some(now() + Duration::hours(1)));
    let expired = token("expired", 2, Some(now() - Duration::seconds(1)));
    let forever = token("forever", 3, None);
    for t in [&live, &expired, &forever] {
        let info = st.tokens.create_token(t).await.expect("create");
        assert_eq!(
            (info.id, info.name.as_str(), info.role, info.revoked),
            (t.id, t.name.as_str(), t.role, false)
        );
    }
    let dup = st.tokens.create_token(&token("again", 1, None)).await;
    assert!(matches!(dup, Err(StoreError::Conflict(_))), "{dup:?}");
    let by = |fill: u8| {
        let st = st.clone();
        async move {
            st.tokens
                .token_by_hash(&[fill; 32])
                .await
                .expect("by hash")
                .map(|t| t.name)
        }
    };
    assert_eq!(by(1).await.as_deref(), Some("live"));
    assert_eq!(by(2).await, None, "expired");
    assert_eq!(by(3).await.as_deref(), Some("forever"));
    assert_eq!(by(4).await, None, "unknown");
    assert!(st.tokens.revoke_token(forever.id).await.expect("revoke"));
    assert!(!st
        .tokens
        .revoke_token(forever.id)
        .await
        .expect("revoke again"));
    assert!(!st
        .tokens
        .revoke_token(uuid::Uuid::now_v7())
        .await
        .expect("revoke unknown"));
    assert_eq!(by(3).await, None, "revoked");
    let list = st.tokens.list_tokens().await.expect("list");
    let names: Vec<(&str, bool)> = list.iter().map(|t| (t.name.as_str(), t.revoked)).collect();
    assert_eq!(
        names,
        [("live", false), ("expired", false), ("forever", true)]
    );
    db.drop_db().await;
}

/// Lease reads: by address, a MAC's newest offered or bound lease in a subnet, busy addresses,
/// reservations from the inventory, the DHCP hot path's one-query facts; ends of leases only by
/// their holder; expired and released addresses are free again, declined ones are not (even for
/// the MAC that declined them) until they expire.
async fn leases_reads_and_expiry(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    assert_eq!(
        st.leases.is_shared(),
        b == Backend::Postgres,
        "a PostgreSQL lease table may be shared"
    );
    let net = "10.30.0.0/24";
    let claim = |ip: &str, m: &str, state: LeaseState| support::lease_claim(ip, net, m, state);
    let (a, b_mac, c) = (
        "52:54:00:c0:00:01",
        "52:54:00:c0:00:02",
        "52:54:00:c0:00:03",
    );
    assert!(st
        .leases
        .claim_lease(&claim("10.30.0.10", a, LeaseState::Offered))
        .await
        .expect("claim"));
    assert!(st
        .leases
        .claim_lease(&claim("10.30.0.10", a, LeaseState::Bound))
        .await
        .expect("claim"));
    assert!(
        !st.leases
            .claim_lease(&claim("10.30.0.10", b_mac, LeaseState::Offered))
            .await
            .expect("claim"),
        "held by another MAC"
    );
    let l = st
        .leases
        .lease_by_ip("10.30.0.10".parse().expect("ip"))
        .await
        .expect("by ip")
        .expect("row");
    assert_eq!(
        (l.mac, l.state, l.subnet.as_str()),
        (mac(a), LeaseState::Bound, net)
    );
    assert_eq!(
        st.leases
            .lease_by_mac(net, mac(a))
            .await
            .expect("by mac")
            .map(|l| l.ip),
        Some(Ipv4Addr::new(10, 30, 0, 10))
    );
    assert_eq!(
        st.leases
            .lease_by_mac("10.31.0.0/24", mac(a))
            .await
            .expect("by mac"),
        None
    );

    // An expired lease of another MAC is free.
    let mut old = claim("10.30.0.11", b_mac, LeaseState::Bound);
    old.lease.expires_ms = old.lease.updated_ms - 1;
    assert!(st.leases.claim_lease(&old).await.expect("claim"));
    assert!(
        st.leases
            .claim_lease(&claim("10.30.0.11", c, LeaseState::Bound))
            .await
            .expect("claim"),
        "expired: free"
    );

    // Ends: only by the holder.
    let now = chrono::Utc::now().timestamp_millis();
    assert!(!st
        .leases
        .end_lease(
            "10.30.0.10".parse().expect("ip"),
            mac(c),
            LeaseState::Released,
            now,
            now
        )
        .await
        .expect("end"));
    assert!(st
        .leases
        .end_lease(
            "10.30.0.10".parse().expect("ip"),
            mac(a),
            LeaseState::Released,
            now,
            now
        )
        .await
        .expect("end"));
    assert!(
        st.leases
            .claim_lease(&claim("10.30.0.10", b_mac, LeaseState::Bound))
            .await
            .expect("claim"),
        "released: free"
    );
    // Declined: quarantined until it expires, even for the MAC that declined it.
    assert!(st
        .leases
        .end_lease(
            "10.30.0.10".parse().expect("ip"),
            mac(b_mac),
            LeaseState::Declined,
            now + 600_000,
            now
        )
        .await
        .expect("decline"));
    assert!(!st
        .leases
        .claim_lease(&claim("10.30.0.10", b_mac, LeaseState::Bound))
        .await
        .expect("claim"));
    assert!(!st
        .leases
        .claim_lease(&claim("10.30.0.10", c, LeaseState::Offered))
        .await
        .expect("claim"));

    let mut busy = st.leases.busy_ips(net, now).await.expect("busy");
    busy.sort();
    assert_eq!(
        busy,
        [Ipv4Addr::new(10, 30, 0, 10), Ipv4Addr::new(10, 30, 0, 11)]
    );
    assert_eq!(
        st.leases.busy_ips(net, now + 700_000).await.expect("busy"),
        Vec::<Ipv4Addr>::new(),
        "all expired by then"
    );
    let of_b = st.leases.leases_of_mac(mac(b_mac)).await.expect("of mac");
    assert_eq!(
        of_b.iter().map(|l| (l.ip, l.state)).collect::<Vec<_>>(),
        [(Ipv4Addr::new(10, 30, 0, 10), LeaseState::Declined)]
    );

    // Reservations come from the inventory's interfaces.
    let m = create(&st, 30).await;
    let nic = m.interfaces[0].mac;
    let reserved = Ipv4Addr::new(10, 9, 0, 30);
    let r = st
        .leases
        .reservation(nic)
        .await
        .expect("reservation")
        .expect("row");
    assert_eq!((r.machine_id, r.ipv4), (m.id, Some(reserved)));
    assert_eq!(
        st.leases
            .reservation(m.interfaces[1].mac)
            .await
            .expect("r")
            .map(|r| r.ipv4),
        Some(None)
    );
    assert_eq!(st.leases.reservation(mac(a)).await.expect("r"), None);
    assert!(st
        .leases
        .reserved_for_other(reserved, mac(a))
        .await
        .expect("other"));
    assert!(!st
        .leases
        .reserved_for_other(reserved, nic)
        .await
        .expect("own"));
    assert!(!st
        .leases
        .reserved_for_other(Ipv4Addr::new(10, 9, 0, 99), mac(a))
        .await
        .expect("free"));

    let facts = st
        .leases
        .client_facts(
            net,
            mac(c),
            [Some(reserved), Some(Ipv4Addr::new(10, 30, 0, 12))],
        )
        .await
        .expect("facts");
    assert_eq!(facts.reserved_ip, None);
    assert_eq!(
        facts.lease.map(|l| l.ip),
        Some(Ipv4Addr::new(10, 30, 0, 11))
    );
    assert_eq!(facts.reserved_for_other, [reserved]);
    let facts = st
        .leases
        .client_facts(net, nic, [None, None])
        .await
        .expect("facts");
    assert_eq!(
        (facts.reserved_ip, facts.lease, facts.reserved_for_other),
        (Some(reserved), None, vec![])
    );
    db.drop_db().await;
}

/// BMC capability records: a failed first probe, then a successful one replacing it, each with its
/// event; none for a machine never probed.
async fn bmc_capability_records(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let m = create(&st, 40).await;
    assert_eq!(
        st.bmc_capabilities
            .bmc_capabilities(m.id)
            .await
            .expect("none"),
        None
    );
    let failed = CapabilityRecord {
        machine_id: m.id,
        bmc_url: "https://10.8.0.40".into(),
        capabilities: None,
        probed_at: None,
        last_error: Some("connection refused".into()),
        attempted_at: now(),
        stale: false,
    };
    let probed = CapabilityRecord {
        capabilities: Some(Capabilities {
            vendor: Some("Dell".into()),
            model: Some("iDRAC9".into()),
            quirks: Some("dell".into()),
            redfish_version: Some("1.11.0".into()),
            sessions: true,
            auth: "session".into(),
            reset_types: vec!["On".into(), "ForceOff".into()],
            boot_targets: vec!["Pxe".into(), "Cd".into()],
            boot_mode_settable: true,
            virtual_media: Some(MediaLocation::Manager),
            etag: EtagSupport {
                offered: true,
                weak: true,
                if_match_required: false,
            },
            tls: TlsMode::Pinned,
        }),
        probed_at: Some(now()),
        last_error: None,
        attempted_at: now(),
        ..failed.clone()
    };
    for rec in [&failed, &probed] {
        st.bmc_capabilities
            .put_bmc_capabilities(rec, &event(Some(m.id), "bmc.capabilities"))
            .await
            .expect("put");
        assert_eq!(
            st.bmc_capabilities
                .bmc_capabilities(m.id)
                .await
                .expect("get")
                .as_ref(),
            Some(rec)
        );
    }
    assert_eq!(events_of(&st, m.id, "bmc.capabilities").await, 2);
    db.drop_db().await;
}

fn cluster(name: &str, version: &str) -> ClusterRecord {
    ClusterRecord {
        spec: ClusterSpec {
            name: name.into(),
            endpoint: "https://10.0.0.10:6443".into(),
            talos_version: version.into(),
            kubernetes_version: None,
            schematic_id: "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba".into(),
            schematic_kernel_args: vec!["net.ifnames=0".into()],
            factory_host: "factory.talos.dev".into(),
            install_image: None,
            patches: vec![PatchSource {
                origin: "cluster.yaml#patches[0]".into(),
                text: "machine:\n  time:\n    disabled: true\n".into(),
            }],
            role_patches: Default::default(),
            kernel_args: vec!["console=ttyS0".into()],
            reinstall: Some(Default::default()),
            bootstrap: Some(plinth::service::ports::configs::BootstrapMode::Manual),
            delivery: None,
            upgrade: None,
            etcd_snapshots: None,
        },
        sealed_bundle: Some(vec![1, 2, 3]),
        sealed_base: None,
        secrets_sha256: format!("sha-{version}"),
    }
}

/// Declared config objects (upserted in one transaction with their events), a machine's patches
/// and the config last served to it.
async fn configs_objects_and_served(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let m = create(&st, 50).await;
    let profile = ProfileSpec {
        name: "gpu".into(),
        kernel_args: vec!["iommu=pt".into()],
        wipe: true,
        ..Default::default()
    };
    let group = |kind, name: &str| GroupSpec {
        kind,
        name: name.into(),
        patches: vec![],
        kernel_args: vec![format!("{name}=1")],
    };
    let patches = MachinePatches {
        patches: vec![PatchSource {
            origin: "m.yaml".into(),
            text: "machine: {}\n".into(),
        }],
        kernel_args: vec!["quiet".into()],
    };
    let write = ConfigWrite {
        clusters: vec![cluster("zeta", "v1.11.6"), cluster("alpha", "v1.12.0")],
        profiles: vec![profile.clone()],
        groups: vec![
            group(GroupKind::Site, "par1"),
            group(GroupKind::Rack, "r0"),
            group(GroupKind::Rack, "a9"),
        ],
        machine_patches: vec![(m.id, patches.clone())],
    };
    st.configs
        .put_config_objects(
            &write,
            &[
                event(None, "config.applied"),
                event(Some(m.id), "config.patches"),
            ],
        )
        .await
        .expect("put");
    assert_eq!(
        st.configs.clusters().await.expect("clusters"),
        vec![cluster("alpha", "v1.12.0"), cluster("zeta", "v1.11.6")]
    );
    assert_eq!(
        st.configs.profiles().await.expect("profiles"),
        vec![profile]
    );
    assert_eq!(
        st.configs.groups().await.expect("groups"),
        vec![
            group(GroupKind::Rack, "a9"),
            group(GroupKind::Rack, "r0"),
            group(GroupKind::Site, "par1")
        ]
    );
    assert_eq!(
        st.configs.all_machine_patches().await.expect("patches"),
        vec![(m.id, patches.clone())]
    );
    assert_eq!(events_of(&st, m.id, "config.patches").await, 1);
    // Upsert: a changed cluster replaces the old one.
    let write = ConfigWrite {
        clusters: vec![cluster("zeta", "v1.12.1")],
        ..Default::default()
    };
    st.configs
        .put_config_objects(&write, &[])
        .await
        .expect("upsert");
    assert_eq!(
        st.configs.clusters().await.expect("clusters"),
        vec![cluster("alpha", "v1.12.0"), cluster("zeta", "v1.12.1")]
    );

    assert_eq!(
        st.configs.machine_config(m.id).await.expect("config"),
        (patches.clone(), None)
    );
    assert_eq!(
        st.configs
            .machine_config(MachineId::new())
            .await
            .expect("none"),
        (MachinePatches::default(), None)
    );
    let served = ServedConfig {
        sealed: vec![9; 64],
        sha256: "ab".repeat(32),
        at: now(),
    };
    // A config is recorded as served only with the window's token, and only once per token.
    let with_token = |id: MachineId, token: &'static str| {
        let st = st.clone();
        async move {
            let opened = now();
            let w = ProvisionWindow {
                machine_id: id,
                opened_at: opened,
                expires_at: opened + Duration::minutes(30),
                opened_by: "test".into(),
                wipe: false,
                token_sha256: None,
                token_minted_at: None,
                token_ip: None,
                token_used_at: None,
                closed_at: None,
                close_reason: None,
            };
            st.configs
                .put_window(&w, &event(Some(id), "config.window_opened"))
                .await
                .expect("open");
            assert!(st
                .configs
                .set_window_token(id, token, "10.9.0.1", now())
                .await
                .expect("token"));
        }
    };
    with_token(m.id, "tk-50").await;
    assert!(!st
        .configs
        .record_served(
            m.id,
            "another",
            &served,
            &event(Some(m.id), "config.served")
        )
        .await
        .expect("not the window's token"));
    assert!(st
        .configs
        .record_served(m.id, "tk-50", &served, &event(Some(m.id), "config.served"))
        .await
        .expect("served"));
    assert!(!st
        .configs
        .record_served(m.id, "tk-50", &served, &event(Some(m.id), "config.served"))
        .await
        .expect("a token serves once"));
    assert_eq!(
        st.configs.machine_config(m.id).await.expect("config"),
        (patches, Some(served.clone()))
    );
    assert_eq!(events_of(&st, m.id, "config.served").await, 1);
    let used = st.configs.window(m.id).await.expect("window").expect("row");
    assert_eq!(used.token_used_at, Some(served.at));
    // A served config without patches keeps default patches.
    let other = create(&st, 51).await;
    with_token(other.id, "tk-51").await;
    assert!(st
        .configs
        .record_served(
            other.id,
            "tk-51",
            &served,
            &event(Some(other.id), "config.served")
        )
        .await
        .expect("served"));
    assert_eq!(
        st.configs.machine_config(other.id).await.expect("config"),
        (MachinePatches::default(), Some(served))
    );
    db.drop_db().await;
}

/// Provisioning windows: opened, handed the token of a boot only while open and unexpired,
/// closed once (the token goes with it), replaced by a new one.
async fn configs_windows(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let m = create(&st, 52).await;
    assert_eq!(st.configs.window(m.id).await.expect("none"), None);
    assert!(!st
        .configs
        .set_window_token(m.id, "t0", "10.9.0.2", now())
        .await
        .expect("no window"));
    let opened = now();
    let w = ProvisionWindow {
        machine_id: m.id,
        opened_at: opened,
        expires_at: opened + Duration::minutes(30),
        opened_by: "test".into(),
        wipe: true,
        token_sha256: None,
        token_minted_at: None,
        token_ip: None,
        token_used_at: None,
        closed_at: None,
        close_reason: None,
    };
    st.configs
        .put_window(&w, &event(Some(m.id), "config.window_opened"))
        .await
        .expect("open");
    assert_eq!(
        st.configs.window(m.id).await.expect("window").as_ref(),
        Some(&w)
    );
    let minted = now();
    assert!(st
        .configs
        .set_window_token(m.id, "t1", "10.9.0.2", minted)
        .await
        .expect("token"));
    let got = st.configs.window(m.id).await.expect("window").expect("row");
    assert_eq!(
        (
            got.token_sha256.as_deref(),
            got.token_minted_at,
            got.token_ip.as_deref(),
            got.token_used_at
        ),
        (Some("t1"), Some(minted), Some("10.9.0.2"), None)
    );
    assert!(!st
        .configs
        .set_window_token(m.id, "t2", "10.9.0.2", w.expires_at + Duration::seconds(1))
        .await
        .expect("expired"));
    let closed = now();
    assert!(st
        .configs
        .close_window(
            m.id,
            closed,
            "installed",
            &event(Some(m.id), "config.window_closed")
        )
        .await
        .expect("close"));
    assert!(!st
        .configs
        .close_window(
            m.id,
            closed,
            "again",
            &event(Some(m.id), "config.window_closed")
        )
        .await
        .expect("closed"));
    let got = st.configs.window(m.id).await.expect("window").expect("row");
    assert_eq!(
        (got.closed_at, got.close_reason.as_deref(), got.token_sha256),
        (Some(closed), Some("installed"), None)
    );
    assert!(!st
        .configs
        .set_window_token(m.id, "t3", "10.9.0.2", now())
        .await
        .expect("closed"));
    assert_eq!(events_of(&st, m.id, "config.window_closed").await, 1);
    // A new window replaces the closed one.
    st.configs
        .put_window(&w, &event(Some(m.id), "config.window_opened"))
        .await
        .expect("reopen");
    assert_eq!(
        st.configs.window(m.id).await.expect("window").as_ref(),
        Some(&w)
    );
    db.drop_db().await;
}

/// Reinstalls: one running per machine; moved on only from the stage it is at; a finished one is
/// replaced by the next.
async fn reinstalls_compare_and_set(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let m = create(&st, 60).await;
    assert_eq!(st.reinstalls.reinstall(m.id).await.expect("none"), None);
    let t = now();
    let r = Reinstall {
        machine_id: m.id,
        stage: Stage::Power,
        stage_started_at: t,
        stage_deadline: t + Duration::minutes(5),
        wipe: false,
        automatic: true,
        attempt: 2,
        event_mark: 17,
        node_address: None,
        requested_by: "scheduler".into(),
        started_at: t,
        finished_at: None,
        error: None,
        cancelled_by: None,
    };
    assert!(st
        .reinstalls
        .start_reinstall(&r, &event(Some(m.id), "reinstall.started"))
        .await
        .expect("start"));
    assert!(!st
        .reinstalls
        .start_reinstall(&r, &event(Some(m.id), "reinstall.started"))
        .await
        .expect("one at a time"));
    assert_eq!(
        st.reinstalls.reinstall(m.id).await.expect("get").as_ref(),
        Some(&r)
    );
    assert_eq!(
        st.reinstalls.active_reinstalls().await.expect("active"),
        vec![r.clone()]
    );
    let next = Reinstall {
        stage: Stage::Netboot,
        node_address: Some("10.9.0.60".into()),
        ..r.clone()
    };
    assert!(!st
        .reinstalls
        .advance_reinstall(
            &next,
            Stage::Config,
            &event(Some(m.id), "reinstall.netboot")
        )
        .await
        .expect("wrong stage"));
    assert!(st
        .reinstalls
        .advance_reinstall(&next, Stage::Power, &event(Some(m.id), "reinstall.netboot"))
        .await
        .expect("advance"));
    assert!(!st
        .reinstalls
        .advance_reinstall(&next, Stage::Power, &event(Some(m.id), "reinstall.netboot"))
        .await
        .expect("only once"));
    assert_eq!(
        st.reinstalls.reinstall(m.id).await.expect("get").as_ref(),
        Some(&next)
    );
    let done = Reinstall {
        stage: Stage::Done,
        finished_at: Some(now()),
        ..next.clone()
    };
    assert!(st
        .reinstalls
        .advance_reinstall(&done, Stage::Netboot, &event(Some(m.id), "reinstall.done"))
        .await
        .expect("done"));
    assert_eq!(
        st.reinstalls.active_reinstalls().await.expect("active"),
        vec![]
    );
    assert_eq!(
        events_of(&st, m.id, "reinstall.").await,
        3,
        "one event per successful write"
    );
    let again = Reinstall {
        attempt: 1,
        automatic: false,
        requested_by: "tech".into(),
        ..r
    };
    assert!(st
        .reinstalls
        .start_reinstall(&again, &event(Some(m.id), "reinstall.started"))
        .await
        .expect("after done"));
    assert_eq!(
        st.reinstalls.reinstall(m.id).await.expect("get").as_ref(),
        Some(&again)
    );
    // Cancelled (with who did it) ends it like done: no longer active, replaced by the next.
    let cancelled = Reinstall {
        stage: Stage::Cancelled,
        finished_at: Some(now()),
        error: Some("cancelled by token:tech at stage power".into()),
        cancelled_by: Some("token:tech".into()),
        ..again.clone()
    };
    assert!(st
        .reinstalls
        .advance_reinstall(
            &cancelled,
            Stage::Power,
            &event(Some(m.id), "reinstall.cancelled")
        )
        .await
        .expect("cancel"));
    assert_eq!(
        st.reinstalls.reinstall(m.id).await.expect("get").as_ref(),
        Some(&cancelled)
    );
    assert_eq!(
        st.reinstalls.active_reinstalls().await.expect("active"),
        vec![]
    );
    assert!(st
        .reinstalls
        .start_reinstall(&again, &event(Some(m.id), "reinstall.started"))
        .await
        .expect("after cancelled"));
    db.drop_db().await;
}

/// Bootstraps: one claim per cluster (the second finds the first, writing nothing), outcomes
/// only for the attempt that claimed and only while it is calling, a release frees the
/// cluster; verifications replace each other per machine; health reports keep their time.
async fn talos_state_claims_once(b: Backend) {
    use plinth::service::ports::talos_state::{BootstrapRecord, BootstrapState, NodeVerification};
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let m = create(&st, 45).await;
    let t = now();
    let claim = |instance: &str| BootstrapRecord {
        cluster: "prod".into(),
        attempt_id: uuid::Uuid::new_v4(),
        machine_id: Some(m.id),
        node: "cp-1".into(),
        node_address: "10.0.0.11".into(),
        instance: instance.into(),
        requested_by: "plinth".into(),
        state: BootstrapState::Calling,
        claimed_at: t,
        finished_at: None,
        detail: None,
    };
    assert_eq!(
        st.talos.cluster_bootstrap("prod").await.expect("none"),
        None
    );
    let a = claim("a");
    let before = events_of(&st, m.id, "cluster.").await;
    assert_eq!(
        st.talos
            .claim_bootstrap(&a, &event(Some(m.id), "cluster.bootstrap_claimed"))
            .await
            .expect("claim"),
        None
    );
    let b2 = claim("b");
    assert_eq!(
        st.talos
            .claim_bootstrap(&b2, &event(Some(m.id), "cluster.bootstrap_claimed"))
            .await
            .expect("second claim"),
        Some(a.clone()),
        "the second claim finds the first"
    );
    assert_eq!(events_of(&st, m.id, "cluster.").await, before + 1);
    // Only the claiming attempt writes an outcome.
    assert!(!st
        .talos
        .finish_bootstrap(
            "prod",
            b2.attempt_id,
            BootstrapState::Done,
            "x",
            t,
            &event(Some(m.id), "cluster.bootstrapped")
        )
        .await
        .expect("not b's"));
    assert!(!st
        .talos
        .release_bootstrap(
            "prod",
            b2.attempt_id,
            &event(Some(m.id), "cluster.bootstrap_refused")
        )
        .await
        .expect("not b's"));
    // A release frees the cluster; a new claim can then be made and finished once.
    assert!(st
        .talos
        .release_bootstrap(
            "prod",
            a.attempt_id,
            &event(Some(m.id), "cluster.bootstrap_refused")
        )
        .await
        .expect("release"));
    assert_eq!(
        st.talos.cluster_bootstrap("prod").await.expect("freed"),
        None
    );
    assert_eq!(
        st.talos
            .claim_bootstrap(&b2, &event(Some(m.id), "cluster.bootstrap_claimed"))
            .await
            .expect("claim"),
        None
    );
    assert!(st
        .talos
        .finish_bootstrap(
            "prod",
            b2.attempt_id,
            BootstrapState::Done,
            "bootstrapped",
            t,
            &event(Some(m.id), "cluster.bootstrapped")
        )
        .await
        .expect("finish"));
    assert!(!st
        .talos
        .finish_bootstrap(
            "prod",
            b2.attempt_id,
            BootstrapState::Done,
            "again",
            t,
            &event(Some(m.id), "cluster.bootstrapped")
        )
        .await
        .expect("once"));
    assert!(!st
        .talos
        .release_bootstrap(
            "prod",
            b2.attempt_id,
            &event(Some(m.id), "cluster.bootstrap_refused")
        )
        .await
        .expect("a done bootstrap stays"));
    let done = st
        .talos
        .cluster_bootstrap("prod")
        .await
        .expect("get")
        .expect("done");
    assert_eq!(done.state, BootstrapState::Done);
    assert_eq!(done.instance, "b");
    assert_eq!(done.detail.as_deref(), Some("bootstrapped"));
    assert_eq!(done.finished_at, Some(t));
    assert_eq!(events_of(&st, m.id, "cluster.").await, before + 4);

    let v = NodeVerification {
        machine_id: m.id,
        address: "10.0.0.11".into(),
        talos_version: "v1.11.6".into(),
        cert_sha256: "ab".repeat(32),
        verified_at: t,
    };
    st.talos
        .record_verification(&v, &event(Some(m.id), "talos.verified"))
        .await
        .expect("verify");
    let v2 = NodeVerification {
        talos_version: "v1.12.11".into(),
        ..v.clone()
    };
    st.talos
        .record_verification(&v2, &event(Some(m.id), "talos.verified"))
        .await
        .expect("again");
    assert_eq!(st.talos.verifications().await.expect("list"), vec![v2]);
    assert_eq!(st.talos.cluster_health("prod").await.expect("none"), None);
    st.talos
        .put_health("prod", "{\"a\":1}", t)
        .await
        .expect("put");
    st.talos
        .put_health("prod", "{\"a\":2}", t)
        .await
        .expect("put");
    assert_eq!(
        st.talos.cluster_health("prod").await.expect("get"),
        Some(("{\"a\":2}".to_string(), t))
    );
    db.drop_db().await;
}

/// The health ping answers on a reachable database.
async fn health_ping(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    st.health.ping().await.expect("ping");
    db.drop_db().await;
}

/// A claim in the subnet of the group-commit tests.
fn claim(ip: &str, mac: &str, state: LeaseState) -> LeaseClaim {
    support::lease_claim(ip, "10.20.0.0/24", mac, state)
}

/// Claims go through the store's group commit: many at once share transactions, and each still
/// gets the answer it would get alone. 64 MACs racing for one address: exactly one wins, and the
/// row is the winner's; 200 MACs with an address each, plus a MAC moving between two addresses
/// and a release, all at once: every distinct claim is granted, the moved MAC keeps only its
/// last address, the released address is released. An offer never ends a bound lease.
async fn concurrent_claims_are_batched_and_exclusive(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let race: Vec<_> = (0..64u32)
        .map(|i| {
            let st = st.clone();
            tokio::spawn(async move {
                let mac = format!("52:54:00:25:00:{i:02x}");
                let won = st
                    .leases
                    .claim_lease(&claim("10.20.0.150", &mac, LeaseState::Bound))
                    .await
                    .expect("claim");
                (mac, won)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in race {
        let (mac, won) = t.await.expect("join");
        if won {
            winners.push(mac);
        }
    }
    assert_eq!(winners.len(), 1, "one address, one MAC: {winners:?}");
    let row = st
        .leases
        .lease_by_ip("10.20.0.150".parse().expect("ip"))
        .await
        .expect("row")
        .expect("row");
    assert_eq!(row.mac.to_string(), winners[0]);
    assert_eq!(row.state, LeaseState::Bound);

    // A MAC with a bound lease on .151; a released-to-be lease on .152.
    let mover = "52:54:00:25:01:01";
    assert!(st
        .leases
        .claim_lease(&claim("10.20.0.151", mover, LeaseState::Bound))
        .await
        .expect("claim"));
    let leaver = "52:54:00:25:01:02";
    assert!(st
        .leases
        .claim_lease(&claim("10.20.0.152", leaver, LeaseState::Bound))
        .await
        .expect("claim"));
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let st = st.clone();
        tasks.push(tokio::spawn(async move {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 21, 0, 0)) + i);
            let mac = format!("52:54:00:26:{:02x}:{:02x}", i >> 8, i & 255);
            st.leases
                .claim_lease(&claim(&ip.to_string(), &mac, LeaseState::Bound))
                .await
                .expect("claim")
        }));
    }
    let moved = {
        let st = st.clone();
        tokio::spawn(async move {
            st.leases
                .claim_lease(&claim("10.20.0.153", mover, LeaseState::Bound))
                .await
                .expect("claim")
        })
    };
    let released = {
        let st = st.clone();
        tokio::spawn(async move {
            let now = chrono::Utc::now().timestamp_millis();
            st.leases
                .end_lease(
                    "10.20.0.152".parse().expect("ip"),
                    leaver.parse().expect("mac"),
                    LeaseState::Released,
                    now,
                    now,
                )
                .await
                .expect("end")
        })
    };
    for t in tasks {
        assert!(t.await.expect("join"), "a free address is granted");
    }
    assert!(moved.await.expect("join"));
    assert!(released.await.expect("join"));
    let of_mover = st
        .leases
        .leases_of_mac(mover.parse().expect("mac"))
        .await
        .expect("leases");
    let states: Vec<(String, LeaseState)> = of_mover
        .iter()
        .map(|l| (l.ip.to_string(), l.state))
        .collect();
    assert!(
        states.contains(&("10.20.0.153".into(), LeaseState::Bound))
            && states.contains(&("10.20.0.151".into(), LeaseState::Expired)),
        "the moved MAC keeps only its new address: {states:?}"
    );
    // An offer to the moved MAC elsewhere (a late duplicate DISCOVER) leaves its bound lease
    // alone; binding the other address ends it.
    let state_of = |ip: &'static str| {
        let st = st.clone();
        async move {
            st.leases
                .lease_by_ip(ip.parse().expect("ip"))
                .await
                .expect("row")
                .expect("row")
                .state
        }
    };
    assert!(st
        .leases
        .claim_lease(&claim("10.20.0.154", mover, LeaseState::Offered))
        .await
        .expect("claim"));
    assert_eq!(state_of("10.20.0.153").await, LeaseState::Bound);
    assert_eq!(state_of("10.20.0.154").await, LeaseState::Offered);
    assert!(st
        .leases
        .claim_lease(&claim("10.20.0.154", mover, LeaseState::Bound))
        .await
        .expect("claim"));
    assert_eq!(state_of("10.20.0.153").await, LeaseState::Expired);
    assert_eq!(state_of("10.20.0.154").await, LeaseState::Bound);
    assert_eq!(state_of("10.20.0.152").await, LeaseState::Released);
    // The released address is free for another MAC; a bound one is not.
    assert!(st
        .leases
        .claim_lease(&claim(
            "10.20.0.152",
            "52:54:00:25:01:03",
            LeaseState::Bound
        ))
        .await
        .expect("claim"));
    assert!(!st
        .leases
        .claim_lease(&claim(
            "10.20.0.154",
            "52:54:00:25:01:03",
            LeaseState::Bound
        ))
        .await
        .expect("claim"));
    db.drop_db().await;
}

/// Run `$body` with `$conn`, a fresh pool on `$db` of either dialect (created when missing),
/// closed after.
macro_rules! on_db {
    ($b:expr, $db:expr, |$conn:ident| $body:block) => {
        match $b {
            Backend::Sqlite => {
                let opts: sqlx::sqlite::SqliteConnectOptions = $db.url.parse().expect("sqlite url");
                let $conn = sqlx::SqlitePool::connect_with(opts.create_if_missing(true))
                    .await
                    .expect("sqlite");
                $body;
                $conn.close().await;
            }
            Backend::Postgres => {
                let $conn = sqlx::PgPool::connect(&$db.url).await.expect("postgres");
                $body;
                $conn.close().await;
            }
        }
    };
}

/// Migration 0021 fills `machines.search_text` of the machines written before it exactly as the
/// store writes it (`MachineSpec::search_text`): a database migrated up to 0020 with a machine in
/// it (two NICs, mixed case), then opened by the store, which runs 0021; the search finds the
/// machine by a field and by its second NIC's MAC.
async fn machine_search_text_backfill(b: Backend) {
    let db = TestDb::new(b).await;
    let dialect = match b {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(dialect);
    let before = db.dir.path().join("migrations-before-0021");
    std::fs::create_dir_all(&before).expect("mkdir");
    for e in std::fs::read_dir(&all).expect("migrations") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        if name.as_str() < "0021" {
            std::fs::copy(e.path(), before.join(&name)).expect("copy");
        }
    }
    let id = uuid::Uuid::new_v4();
    let at = now();
    on_db!(b, db, |conn| {
        sqlx::migrate::Migrator::new(before.as_path())
            .await
            .expect("migrations")
            .run(&conn)
            .await
            .expect("migrate to 0020");
        sqlx::query(
            "INSERT INTO machines (id, hostname, serial, manufacturer, model, site, rack, cluster, \
             state, created_at, updated_at) VALUES ($1, 'old-1', 'SN-Old-7', 'Dell Inc.', \
             'PowerEdge R650', 'AMS1', 'R7', 'lab', 'registered', $2, $2)",
        )
        .bind(id)
        .bind(at)
        .execute(&conn)
        .await
        .expect("machine");
        for (pos, mac, ip, boot) in [
            (1, "52:54:00:21:00:01", None, false),
            (0, "52:54:00:21:00:02", Some("10.0.0.21"), true),
        ] {
            sqlx::query(
                "INSERT INTO interfaces (machine_id, position, mac, ipv4, boot) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(id)
            .bind(pos)
            .bind(mac)
            .bind(ip)
            .bind(boot)
            .execute(&conn)
            .await
            .expect("nic");
        }
    });
    let st = db.stores().await;
    let m = st
        .machines
        .get_machine(MachineId(id))
        .await
        .expect("get")
        .expect("the machine");
    let stored: String;
    on_db!(b, db, |conn| {
        stored = sqlx::query_scalar("SELECT search_text FROM machines WHERE id = $1")
            .bind(id)
            .fetch_one(&conn)
            .await
            .expect("search_text");
    });
    assert_eq!(stored, m.spec().search_text());
    assert!(
        stored.starts_with("old-1\nsn-old-7\n\ndell inc.\npoweredge r650\nams1\nr7\nlab\n52:54:00:21:00:02\n10.0.0.21\n"),
        "{stored:?}"
    );
    for q in ["52:54:00:21:00:01", "POWEREDGE", "10.0.0.21"] {
        let page = st
            .machines
            .list_machines(&MachineFilter {
                q: Some(q.into()),
                limit: 10,
                ..Default::default()
            })
            .await
            .expect("search");
        assert_eq!(page.total, 1, "{q}");
    }
    db.drop_db().await;
}

both_backends!(
    machine_search_text_backfill,
    machines_crud,
    machines_version_conflicts,
    machines_uniqueness_conflicts,
    machines_filters_and_pages,
    machines_bmc_passwords,
    events_order_and_filters,
    tokens_lifecycle,
    leases_reads_and_expiry,
    concurrent_claims_are_batched_and_exclusive,
    bmc_capability_records,
    configs_objects_and_served,
    configs_windows,
    reinstalls_compare_and_set,
    talos_state_claims_once,
    upgrades_one_rollout_one_driver,
    health_ping,
);

/// Rollouts: one active per cluster (a second start finds the first, writing nothing); the lease
/// goes to one instance and to another only after it ran out; a node moves only from the step it
/// was read at, only for the lease holder, and leaves `pending` only while the rollout runs; an
/// abort marks the nodes in flight; a done rollout rewrites the cluster's stored versions (the
/// rest of its spec untouched) in the same transaction.
async fn upgrades_one_rollout_one_driver(b: Backend) {
    use plinth::service::ports::upgrades::{
        ClusterVersionUpdate, NodeStep, Rollout, RolloutEnd, RolloutNode, RolloutState,
        UpgradeMethod,
    };
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    st.configs
        .put_config_objects(
            &ConfigWrite {
                clusters: vec![cluster("prod", "v1.12.11")],
                ..Default::default()
            },
            &[],
        )
        .await
        .expect("cluster");
    let m1 = create(&st, 51).await;
    let m2 = create(&st, 52).await;
    let t = now();
    let rollout = |state: RolloutState| Rollout {
        id: uuid::Uuid::new_v4(),
        cluster: "prod".into(),
        to_version: "v1.13.9".into(),
        schematic_id: None,
        installer: "r.lab/installer:v1.13.9".into(),
        state,
        requested_by: "token:a".into(),
        owner: None,
        lease_until: None,
        node_timeout_seconds: 600,
        max_workers_per_rack: 1,
        snapshot: Some(serde_json::json!({"id": "s1"})),
        created_at: t,
        updated_at: t,
        finished_at: None,
        error: None,
    };
    let node = |m: &Machine, position: u32| RolloutNode {
        machine_id: m.id,
        position,
        batch: position,
        name: m.display_name(),
        role: Role::ControlPlane,
        rack: Some("r1".into()),
        address: format!("10.0.0.{}", 10 + position),
        from_version: "v1.12.11".into(),
        method: UpgradeMethod::Machine,
        installer: "r.lab/installer:v1.13.9".into(),
        step: NodeStep::Pending,
        boot_id: None,
        started_at: None,
        deadline: None,
        finished_at: None,
        seen: None,
    };
    let first = rollout(RolloutState::Running);
    let nodes = [node(&m1, 0), node(&m2, 1)];
    assert_eq!(
        st.upgrades
            .create_rollout(&first, &nodes, &event(None, "upgrade.started"))
            .await
            .expect("create"),
        None
    );
    let second = rollout(RolloutState::Running);
    let found = st
        .upgrades
        .create_rollout(&second, &nodes, &event(None, "upgrade.started"))
        .await
        .expect("second")
        .expect("the first is active");
    assert_eq!(found.id, first.id);
    let (r, n) = st
        .upgrades
        .latest_rollout("prod")
        .await
        .expect("latest")
        .expect("one");
    assert_eq!(
        (r.id, r.snapshot.clone(), n.len()),
        (first.id, first.snapshot.clone(), 2)
    );
    assert!(st
        .upgrades
        .rollout(second.id)
        .await
        .expect("read")
        .is_none());
    assert_eq!(
        st.upgrades.active_rollouts().await.expect("active").len(),
        1
    );

    // The lease: a, not b while it holds; b once it ran out; a's writes then fail.
    let lease = Duration::seconds(30);
    assert!(st
        .upgrades
        .claim_rollout(first.id, "a", t, t + lease)
        .await
        .expect("a"));
    assert!(!st
        .upgrades
        .claim_rollout(first.id, "b", t, t + lease)
        .await
        .expect("b"));
    assert!(st
        .upgrades
        .renew_rollout(first.id, "a", t + lease)
        .await
        .expect("renew"));
    let mut started = nodes[0].clone();
    started.step = NodeStep::Upgrading;
    started.boot_id = Some("boot-1".into());
    started.started_at = Some(t);
    started.deadline = Some(t + lease);
    assert!(!st
        .upgrades
        .advance_node(first.id, "b", &started, NodeStep::Pending, None)
        .await
        .expect("not b"));
    assert!(st
        .upgrades
        .advance_node(
            first.id,
            "a",
            &started,
            NodeStep::Pending,
            Some(&event(Some(m1.id), "upgrade.node_started"))
        )
        .await
        .expect("a starts"));
    assert!(!st
        .upgrades
        .advance_node(first.id, "a", &started, NodeStep::Pending, None)
        .await
        .expect("never twice from pending"));
    let later = t + lease + Duration::seconds(1);
    assert!(st
        .upgrades
        .claim_rollout(first.id, "b", later, later + lease)
        .await
        .expect("b after"));
    let mut rebooting = started.clone();
    rebooting.step = NodeStep::Rebooting;
    assert!(!st
        .upgrades
        .advance_node(first.id, "a", &rebooting, NodeStep::Upgrading, None)
        .await
        .expect("a lost it"));
    assert!(!st
        .upgrades
        .renew_rollout(first.id, "a", later + lease)
        .await
        .expect("a lost it"));
    assert!(st
        .upgrades
        .advance_node(first.id, "b", &rebooting, NodeStep::Upgrading, None)
        .await
        .expect("b moves it"));

    // Paused: the node in flight moves on, no node leaves pending; resumed: it may.
    let paused = st
        .upgrades
        .set_rollout_state(
            first.id,
            &[RolloutState::Running],
            RolloutState::Paused,
            None,
            later,
            &event(None, "upgrade.paused"),
        )
        .await
        .expect("pause")
        .expect("was running");
    assert_eq!(paused.state, RolloutState::Paused);
    assert!(st
        .upgrades
        .set_rollout_state(
            first.id,
            &[RolloutState::Running],
            RolloutState::Paused,
            None,
            later,
            &event(None, "upgrade.paused")
        )
        .await
        .expect("pause again")
        .is_none());
    let mut verifying = rebooting.clone();
    verifying.step = NodeStep::Verifying;
    assert!(st
        .upgrades
        .advance_node(first.id, "b", &verifying, NodeStep::Rebooting, None)
        .await
        .expect("in flight"));
    let mut next = nodes[1].clone();
    next.step = NodeStep::Upgrading;
    assert!(!st
        .upgrades
        .advance_node(first.id, "b", &next, NodeStep::Pending, None)
        .await
        .expect("not while paused"));
    assert!(!st
        .upgrades
        .claim_rollout(first.id, "c", later, later + lease)
        .await
        .expect("paused"));
    st.upgrades
        .set_rollout_state(
            first.id,
            &[RolloutState::Paused],
            RolloutState::Running,
            None,
            later,
            &event(None, "upgrade.resumed"),
        )
        .await
        .expect("resume")
        .expect("was paused");

    // Abort: the node in flight is marked with the step it was at; the cluster may start anew.
    let aborted = st
        .upgrades
        .set_rollout_state(
            first.id,
            &[RolloutState::Running, RolloutState::Paused],
            RolloutState::Aborted,
            Some("aborted by token:a"),
            later,
            &event(None, "upgrade.aborted"),
        )
        .await
        .expect("abort")
        .expect("was running");
    assert_eq!(
        (aborted.state, aborted.error.as_deref()),
        (RolloutState::Aborted, Some("aborted by token:a"))
    );
    let (_, n) = st
        .upgrades
        .rollout(first.id)
        .await
        .expect("read")
        .expect("there");
    assert_eq!(n[0].step, NodeStep::Aborted);
    assert!(
        n[0].seen
            .as_deref()
            .unwrap_or("")
            .contains("aborted at step verifying"),
        "{:?}",
        n[0].seen
    );
    assert_eq!(n[1].step, NodeStep::Pending);
    assert!(!st
        .upgrades
        .end_rollout(
            first.id,
            "b",
            &RolloutEnd {
                state: RolloutState::Done,
                error: None,
                at: later,
                update: None,
            },
            &event(None, "upgrade.done")
        )
        .await
        .expect("ended"));

    // A done rollout moves the cluster's stored versions, and only those.
    let third = rollout(RolloutState::Running);
    assert_eq!(
        st.upgrades
            .create_rollout(&third, &nodes, &event(None, "upgrade.started"))
            .await
            .expect("after the abort"),
        None
    );
    assert!(st
        .upgrades
        .claim_rollout(third.id, "a", later, later + lease)
        .await
        .expect("claim"));
    let update = ClusterVersionUpdate {
        cluster: "prod".into(),
        talos_version: "v1.13.9".into(),
        schematic_id: Some("0".repeat(64)),
        install_image: Some("r.lab/installer:v1.13.9".into()),
    };
    assert!(st
        .upgrades
        .end_rollout(
            third.id,
            "a",
            &RolloutEnd {
                state: RolloutState::Done,
                error: None,
                at: later,
                update: Some(update),
            },
            &event(None, "upgrade.done")
        )
        .await
        .expect("done"));
    let stored = st.configs.clusters().await.expect("clusters");
    let mut want = cluster("prod", "v1.12.11").spec;
    want.talos_version = "v1.13.9".into();
    want.schematic_id = "0".repeat(64);
    want.install_image = Some("r.lab/installer:v1.13.9".into());
    assert_eq!(stored[0].spec, want);
    let (r, _) = st
        .upgrades
        .latest_rollout("prod")
        .await
        .expect("latest")
        .expect("one");
    assert_eq!(
        (r.id, r.state, r.owner),
        (third.id, RolloutState::Done, None)
    );
    assert!(st
        .upgrades
        .active_rollouts()
        .await
        .expect("active")
        .is_empty());
    db.drop_db().await;
}

/// On SQLite every write shares one connection; an ACK waits for its lease's commit. A lease
/// commit queued behind a crowd of other writers (API writes, imports, state changes) goes ahead
/// of them: at most the writer holding the connection and the next one finish first. (A
/// current-thread runtime: every writer is queued before the claim is made.)
#[tokio::test]
async fn sqlite_lease_commits_go_ahead_of_queued_writers() {
    let db = TestDb::new(Backend::Sqlite).await;
    let st = db.stores().await;
    const WRITERS: usize = 200;
    let order = Arc::new(std::sync::Mutex::new(Vec::<&'static str>::new()));
    let mut tasks = Vec::new();
    for n in 0..WRITERS {
        let (st, order) = (st.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let token = plinth::service::NewToken {
                id: uuid::Uuid::new_v4(),
                name: format!("writer-{n}"),
                role: plinth::service::ApiRole::Viewer,
                hash: [
                    *uuid::Uuid::new_v4().as_bytes(),
                    *uuid::Uuid::new_v4().as_bytes(),
                ]
                .concat(),
                expires_at: None,
            };
            st.tokens.create_token(&token).await.expect("token");
            order.lock().expect("order").push("write");
        }));
    }
    // Let every writer reach its queue.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        order.lock().expect("order").len() < WRITERS / 2,
        "the writers finished before the claim was made: nothing was queued"
    );
    assert!(st
        .leases
        .claim_lease(&claim(
            "10.20.0.160",
            "52:54:00:aa:00:01",
            LeaseState::Bound
        ))
        .await
        .expect("claim"));
    order.lock().expect("order").push("lease");
    for t in tasks {
        t.await.expect("writer");
    }
    let order = order.lock().expect("order").clone();
    let ahead = order.iter().position(|w| *w == "lease").expect("lease");
    assert!(
        ahead <= 3,
        "{ahead} of {WRITERS} queued writes committed before the lease"
    );
    assert_eq!(order.len(), WRITERS + 1);
    db.drop_db().await;
}
