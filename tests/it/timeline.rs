//! The boot timeline's writer on both databases: a burst of steps lands whole, in order, as the
//! machines' events, one machine's steps past its budget are counted instead of written, `append_events` writes a batch in one transaction, and steps known only by
//! address follow the address to its new holder.

use crate::support;

use std::time::{Duration, Instant};

use plinth::domain::{Interface, MacAddr, Machine, MachineSpec};
use plinth::service::inventory::Inventory;
use plinth::service::provisioning::timeline::{Step, Timeline};
use plinth::service::provisioning::Identities;
use plinth::service::{EventFilter, NewEvent, SecretBox};
use support::{Backend, TestDb};
use tokio_util::sync::CancellationToken;

/// A machine with one boot interface.
async fn machine(inv: &Inventory, hostname: &str, mac: MacAddr) -> Machine {
    inv.create(
        MachineSpec {
            hostname: Some(hostname.into()),
            interfaces: vec![Interface {
                mac,
                ipv4: None,
                boot: true,
                name: None,
            }],
            ..Default::default()
        },
        "test",
    )
    .await
    .expect("create")
}

fn kind_filter(id: plinth::domain::MachineId, kind: &str) -> EventFilter {
    EventFilter {
        machine_id: Some(id),
        kind_prefix: Some(kind.into()),
        after_id: None,
        limit: 10_000,
    }
}

async fn a_burst_of_steps_lands_whole_and_in_order(b: Backend) {
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let secrets = SecretBox::from_text(&SecretBox::generate_key_text()).expect("key");
    let inv = plinth::app::inventory(&st, secrets);
    // 35 machines, each within its budget of 20 steps of a kind.
    const MACHINES: usize = 35;
    let mut macs = Vec::new();
    let mut machines = Vec::new();
    for i in 0..MACHINES {
        let mac: MacAddr = format!("52:54:00:7e:00:{:02x}", i + 1)
            .parse()
            .expect("mac");
        machines.push(machine(&inv, &format!("tl-{i}"), mac).await);
        macs.push(mac);
    }
    let m = &machines[0];

    // More steps than one batch, faster than the writer's gathering window.
    let stop = CancellationToken::new();
    let timeline = Timeline::start(
        st.events.clone(),
        Identities::new(st.machines.clone(), st.leases.clone()),
        stop.clone(),
    );
    const STEPS: usize = 700;
    for n in 0..STEPS {
        timeline.record(Step {
            kind: "dhcp.offer",
            mac: Some(macs[n % MACHINES]),
            ip: None,
            machine: None,
            detail: serde_json::json!({ "n": n }),
        });
    }
    let all = EventFilter {
        machine_id: None,
        kind_prefix: Some("dhcp.offer".into()),
        after_id: None,
        limit: 10_000,
    };
    let start = Instant::now();
    let events = loop {
        let ev = st.events.list_events(&all).await.expect("events");
        if ev.len() >= STEPS || start.elapsed() > Duration::from_secs(60) {
            break ev;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(timeline.dropped(), 0);
    let order: Vec<u64> = events
        .iter()
        .map(|e| e.detail["n"].as_u64().expect("n"))
        .collect();
    assert_eq!(order, (0..STEPS as u64).collect::<Vec<_>>());
    assert!(events.iter().all(|e| e.actor == "boot"));

    // Past its budget, one machine's steps of a kind are counted, not written: a flood of
    // spoofed TFTP reads or DISCOVERs with its MAC cannot bury its timeline.
    for n in 0..100 {
        timeline.record(Step {
            kind: "tftp.read",
            mac: Some(macs[0]),
            ip: None,
            machine: None,
            detail: serde_json::json!({ "n": n }),
        });
    }
    let start = Instant::now();
    while timeline.suppressed() < 80 && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(timeline.suppressed(), 80);
    let reads = st
        .events
        .list_events(&kind_filter(m.id, "tftp.read"))
        .await
        .expect("events");
    assert_eq!(reads.len(), 20, "the burst of one machine's reads");
    stop.cancel();

    // A batch is one transaction, in order; an empty batch writes nothing.
    st.events.append_events(&[]).await.expect("empty batch");
    let batch: Vec<NewEvent> = (0..3)
        .map(|n| NewEvent {
            machine_id: Some(m.id),
            kind: "http.image".into(),
            actor: "boot".into(),
            detail: serde_json::json!({ "n": n }),
        })
        .collect();
    st.events.append_events(&batch).await.expect("batch");
    let tftp = st
        .events
        .list_events(&kind_filter(m.id, "http.image"))
        .await
        .expect("events");
    assert_eq!(
        tftp.iter()
            .map(|e| e.detail["n"].as_u64().expect("n"))
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    db.drop_db().await;
}

/// Steps known only by address (TFTP, HTTP) belong to the machine holding that address: after an
/// address passes to another machine, its steps are the new holder's from the new holder's ACK on,
/// even while the writer still remembers the old holder.
async fn an_address_passing_to_another_machine_takes_its_steps_along(b: Backend) {
    use plinth::service::LeaseState;
    let db = TestDb::new(b).await;
    let st = db.stores().await;
    let secrets = SecretBox::from_text(&SecretBox::generate_key_text()).expect("key");
    let inv = plinth::app::inventory(&st, secrets);
    let mut ids = Vec::new();
    let macs: Vec<MacAddr> = ["52:54:00:7e:01:01", "52:54:00:7e:01:02"]
        .iter()
        .map(|m| m.parse().expect("mac"))
        .collect();
    for (n, mac) in macs.iter().enumerate() {
        ids.push(machine(&inv, &format!("tl-move-{n}"), *mac).await.id);
    }
    let ip: std::net::Ipv4Addr = "10.66.0.9".parse().expect("ip");
    let lease = |mac: MacAddr| {
        support::lease_claim(
            &ip.to_string(),
            "10.66.0.0/24",
            &mac.to_string(),
            LeaseState::Bound,
        )
    };
    let stop = CancellationToken::new();
    let timeline = Timeline::start(
        st.events.clone(),
        Identities::new(st.machines.clone(), st.leases.clone()),
        stop.clone(),
    );
    let wait_for = |id, kind: &'static str, n: usize| {
        let st = st.clone();
        async move {
            let start = Instant::now();
            loop {
                let ev = st
                    .events
                    .list_events(&kind_filter(id, kind))
                    .await
                    .expect("events");
                if ev.len() >= n || start.elapsed() > Duration::from_secs(30) {
                    return ev.len();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let step = |kind: &'static str, mac: Option<MacAddr>| Step {
        kind,
        mac,
        ip: Some(ip),
        machine: None,
        detail: serde_json::json!({}),
    };
    // The first machine's lease and boot.
    assert!(st.leases.claim_lease(&lease(macs[0])).await.expect("claim"));
    timeline.record(step("dhcp.ack", Some(macs[0])));
    timeline.record(step("tftp.read", None));
    assert_eq!(wait_for(ids[0], "tftp.read", 1).await, 1);
    // The address expires and passes to the second machine, which boots from it.
    let now = chrono::Utc::now().timestamp_millis();
    st.leases
        .end_lease(ip, macs[0], LeaseState::Expired, now, now)
        .await
        .expect("end");
    assert!(st.leases.claim_lease(&lease(macs[1])).await.expect("claim"));
    timeline.record(step("dhcp.ack", Some(macs[1])));
    timeline.record(step("tftp.read", None));
    timeline.record(step("http.image", None));
    assert_eq!(wait_for(ids[1], "http.image", 1).await, 1);
    assert_eq!(wait_for(ids[1], "tftp.read", 1).await, 1);
    assert_eq!(
        st.events
            .list_events(&kind_filter(ids[0], "tftp.read"))
            .await
            .expect("events")
            .len(),
        1,
        "the first machine keeps only its own step"
    );
    stop.cancel();
    assert_eq!(timeline.dropped(), 0);
    db.drop_db().await;
}

both_backends!(
    a_burst_of_steps_lands_whole_and_in_order,
    an_address_passing_to_another_machine_takes_its_steps_along
);
