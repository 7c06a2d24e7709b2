//! The boot timeline's writer on both databases: a burst of steps lands whole, in order, as the
//! machine's events, and `append_events` writes a batch in one transaction.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use plinth::domain::{Interface, MacAddr, MachineSpec};
use plinth::service::inventory::Inventory;
use plinth::service::timeline::{Step, Timeline};
use plinth::service::{EventFilter, InventoryStore, NewEvent, SecretBox};
use support::{Backend, TestDb};
use tokio_util::sync::CancellationToken;

async fn store(db: &TestDb) -> Arc<dyn InventoryStore> {
    plinth::store::open(&plinth::store::StoreOptions {
        url: db.url.clone(),
        max_connections: 4,
        migrate: true,
    })
    .await
    .expect("store")
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
    let st = store(&db).await;
    let secrets = SecretBox::from_text(&SecretBox::generate_key_text()).expect("key");
    let inv = Inventory::new(st.clone(), secrets);
    let mac: MacAddr = "52:54:00:7e:00:01".parse().expect("mac");
    let m = inv
        .create(
            MachineSpec {
                hostname: Some("tl-1".into()),
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
        .expect("create");

    // More steps than one batch, faster than the writer's gathering window.
    let stop = CancellationToken::new();
    let timeline = Timeline::start(st.clone(), stop.clone());
    const STEPS: usize = 700;
    for n in 0..STEPS {
        timeline.record(Step {
            kind: "dhcp.offer",
            mac: Some(mac),
            ip: None,
            detail: serde_json::json!({ "n": n }),
        });
    }
    let start = Instant::now();
    let events = loop {
        let ev = st
            .list_events(&kind_filter(m.id, "dhcp.offer"))
            .await
            .expect("events");
        if ev.len() >= STEPS || start.elapsed() > Duration::from_secs(60) {
            break ev;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.cancel();
    assert_eq!(timeline.dropped(), 0);
    let order: Vec<u64> = events
        .iter()
        .map(|e| e.detail["n"].as_u64().expect("n"))
        .collect();
    assert_eq!(order, (0..STEPS as u64).collect::<Vec<_>>());
    assert!(events.iter().all(|e| e.actor == "boot"));

    // A batch is one transaction, in order; an empty batch writes nothing.
    st.append_events(&[]).await.expect("empty batch");
    let batch: Vec<NewEvent> = (0..3)
        .map(|n| NewEvent {
            machine_id: Some(m.id),
            kind: "tftp.read".into(),
            actor: "boot".into(),
            detail: serde_json::json!({ "n": n }),
        })
        .collect();
    st.append_events(&batch).await.expect("batch");
    let tftp = st
        .list_events(&kind_filter(m.id, "tftp."))
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

both_backends!(a_burst_of_steps_lands_whole_and_in_order);
