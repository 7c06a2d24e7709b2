//! Events name machines as people do (issue 16, item 9): the event log, the live stream and the
//! CLI's `machine events` carry the machine's host name, else its serial, else its boot MAC, else its SMBIOS
//! UUID, beside its id. Before, events named machines by UUID only.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{self, Ask as _, Backend, TestServer};

async fn create(s: &TestServer, body: Value) -> String {
    let m = s
        .req(Method::POST, "/api/v1/machines", &s.operator)
        .json(&body)
        .answer()
        .await
        .expect_status(StatusCode::CREATED)
        .json();
    m["id"].as_str().expect("id").to_string()
}

async fn events_of(s: &TestServer, id: &str) -> Vec<Value> {
    s.req(
        Method::GET,
        &format!("/api/v1/events?machine={id}"),
        &s.operator,
    )
    .answer()
    .await
    .expect_status(StatusCode::OK)
    .json()
    .as_array()
    .expect("events")
    .clone()
}

/// The first event of the live stream from the start, for one machine.
async fn first_streamed(s: &TestServer, id: &str) -> Value {
    let mut resp = s
        .req(
            Method::GET,
            &format!("/api/v1/events/stream?machine={id}&after=0"),
            &s.operator,
        )
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .expect("an event within 20 s")
            .expect("stream body")
            .expect("stream open");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        if let Some(data) = buf
            .split("\n\n")
            .flat_map(str::lines)
            .find_map(|l| l.strip_prefix("data:"))
        {
            if let Ok(v) = serde_json::from_str::<Value>(data.trim()) {
                return v;
            }
        }
    }
}

async fn events_name_machines_by_host_name_mac_or_uuid(b: Backend) {
    let s = TestServer::start(b).await;
    let named = create(
        &s,
        json!({"hostname": "ev-1", "interfaces": [{"mac": "52:54:00:ee:00:01", "boot": true}]}),
    )
    .await;
    let by_mac = create(
        &s,
        json!({"interfaces": [{"mac": "52:54:00:ee:00:03"}, {"mac": "52:54:00:ee:00:02", "boot": true}]}),
    )
    .await;
    let by_uuid = create(
        &s,
        json!({"smbios_uuid": "4c4c4544-0031-3510-8052-b4c04f4e3199"}),
    )
    .await;
    for (id, want) in [
        (&named, "ev-1"),
        // The boot NIC, not the first.
        (&by_mac, "52:54:00:ee:00:02"),
        (&by_uuid, "4c4c4544-0031-3510-8052-b4c04f4e3199"),
    ] {
        let list = events_of(&s, id).await;
        assert!(!list.is_empty(), "{id}");
        for e in &list {
            assert_eq!(e["machine"], want, "{e}");
            assert_eq!(e["machine_id"], id.as_str(), "the id stays: {e}");
        }
        let streamed = first_streamed(&s, id).await;
        assert_eq!(streamed["machine"], want, "{streamed}");
    }

    // The CLI's `machine events` prints the name, not the id.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_plinth"))
        .args([
            "machine",
            "events",
            "ev-1",
            "--server",
            &s.url(""),
            "--token",
            &s.operator,
        ])
        .output()
        .expect("run plinth");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines()
            .any(|l| l.contains("machine.created") && l.contains(" ev-1 ")),
        "{text}"
    );
    assert!(!text.contains(&named), "{text}");

    // A machine removed since: its events keep the id, and no name is made up.
    let v = s
        .req(
            Method::GET,
            &format!("/api/v1/machines/{by_uuid}"),
            &s.operator,
        )
        .answer()
        .await
        .json()["version"]
        .clone();
    s.req(
        Method::DELETE,
        &format!("/api/v1/machines/{by_uuid}"),
        &s.operator,
    )
    .header("If-Match", format!("\"{v}\""))
    .answer()
    .await
    .expect_status(StatusCode::NO_CONTENT);
    let all = s
        .req(Method::GET, "/api/v1/events?limit=1000", &s.operator)
        .answer()
        .await
        .expect_status(StatusCode::OK)
        .json();
    let gone: Vec<&Value> = all
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["machine_id"] == by_uuid.as_str())
        .collect();
    assert!(gone.len() >= 2, "created and deleted: {gone:?}");
    for e in gone {
        assert!(e.get("machine").is_none(), "{e}");
    }
    s.finish().await;
}

both_backends!(events_name_machines_by_host_name_mac_or_uuid);
