//! Inventory benchmark (not a test): registration throughput and list/look-up latency at 10,000
//! machines, over the real HTTP API, on SQLite and on PostgreSQL (DATABASE_URL or the local server).
//!
//! Run: `cargo bench --bench inventory` (set `PLINTH_BENCH_MACHINES` to change the count).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use support::{Backend, TestServer};
use tokio::sync::Semaphore;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary(label: &str, mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "{label:<34} n={:<6} p50={:>8.2?} p95={:>8.2?} p99={:>8.2?} max={:>8.2?}",
        v.len(),
        pct(&v, 0.5),
        pct(&v, 0.95),
        pct(&v, 0.99),
        v.last().copied().unwrap_or_default()
    )
}

fn spec(i: usize) -> serde_json::Value {
    json!({
        "hostname": format!("node-{i:05}"),
        "serial": format!("SN{i:08}"),
        "asset_tag": format!("AT{i:06}"),
        "rack": format!("r{:02}", i % 50),
        "rack_unit": i % 42 + 1,
        "role": if i % 10 == 0 { "control-plane" } else { "worker" },
        "cluster": format!("c{}", i % 5),
        "interfaces": [
            {"mac": format!("52:54:{:02x}:{:02x}:{:02x}:01", i >> 16, (i >> 8) & 255, i & 255), "ipv4": format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255), "boot": true},
            {"mac": format!("52:54:{:02x}:{:02x}:{:02x}:02", i >> 16, (i >> 8) & 255, i & 255)}
        ],
        "disks": [{"serial": format!("D{i}"), "size_bytes": 960197124096_u64, "type": "nvme"}],
    })
}

async fn run(backend: Backend, n: usize) -> Vec<String> {
    let s = Arc::new(TestServer::start(backend).await);
    let mut out = vec![format!("== {backend:?}, {n} machines ==")];

    // Registration: one POST per machine, 16 in flight.
    let sem = Arc::new(Semaphore::new(16));
    let started = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let permit = sem.clone().acquire_owned().await.expect("sem");
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = s
                .req(Method::POST, "/api/v1/machines", &s.operator)
                .json(&spec(i))
                .send()
                .await
                .expect("post");
            assert_eq!(r.status(), 201, "{:?}", r.text().await);
            drop(permit);
            t.elapsed()
        }));
    }
    let mut lat = Vec::with_capacity(n);
    for h in handles {
        lat.push(h.await.expect("join"));
    }
    let secs = started.elapsed().as_secs_f64();
    out.push(format!(
        "register (POST, 16 concurrent)     {:.0} machines/s ({secs:.1} s)",
        n as f64 / secs
    ));
    out.push(summary("register latency", lat));

    // Bulk import of another n machines as one CSV transaction.
    let mut csv = String::from("hostname,mac,serial,rack,rack_unit,role\n");
    for i in n..2 * n {
        csv.push_str(&format!(
            "node-{i:05},52:55:{:02x}:{:02x}:{:02x}:01,SN{i:08},r{:02},{},worker\n",
            i >> 16,
            (i >> 8) & 255,
            i & 255,
            i % 50,
            i % 42 + 1
        ));
    }
    let t = Instant::now();
    let r = s
        .req(Method::POST, "/api/v1/machines/import", &s.operator)
        .header("content-type", "text/csv")
        .body(csv)
        .send()
        .await
        .expect("import");
    assert_eq!(r.status(), 200);
    let secs = t.elapsed().as_secs_f64();
    out.push(format!(
        "import (one CSV transaction)        {:.0} machines/s ({secs:.2} s)",
        n as f64 / secs
    ));

    // List latency at 2n machines: first pages, a deep page, filters, free text, look-ups.
    let mut first = Vec::new();
    let mut filtered = Vec::new();
    let mut text = Vec::new();
    let mut lookup = Vec::new();
    let mut walk = Vec::new();
    for i in 0..200 {
        let t = Instant::now();
        let r = s
            .req(Method::GET, "/api/v1/machines?limit=100", &s.viewer)
            .send()
            .await
            .expect("list");
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
        first.push(t.elapsed());
        let t = Instant::now();
        let r = s
            .req(
                Method::GET,
                &format!("/api/v1/machines?rack=r{:02}&role=worker&limit=100", i % 50),
                &s.viewer,
            )
            .send()
            .await
            .expect("list");
        let _ = r.bytes().await;
        filtered.push(t.elapsed());
        let t = Instant::now();
        let r = s
            .req(
                Method::GET,
                &format!("/api/v1/machines?q=SN0000{:02}&limit=100", i % 100),
                &s.viewer,
            )
            .send()
            .await
            .expect("list");
        let _ = r.bytes().await;
        text.push(t.elapsed());
        let j = (i * 37) % n;
        let t = Instant::now();
        let r = s
            .req(
                Method::GET,
                &format!(
                    "/api/v1/machines/lookup?mac=52:54:{:02x}:{:02x}:{:02x}:01",
                    j >> 16,
                    (j >> 8) & 255,
                    j & 255
                ),
                &s.viewer,
            )
            .send()
            .await
            .expect("lookup");
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
        lookup.push(t.elapsed());
    }
    // Walk every page once (keyset pagination stays flat with depth).
    let mut cursor = String::new();
    loop {
        let t = Instant::now();
        let page: serde_json::Value = s
            .req(
                Method::GET,
                &format!("/api/v1/machines?limit=500&cursor={cursor}"),
                &s.viewer,
            )
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        walk.push(t.elapsed());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    out.push(summary("list first page (100)", first));
    out.push(summary("list rack+role filter (100)", filtered));
    out.push(summary("list free text (100)", text));
    out.push(summary("look-up by MAC", lookup));
    out.push(summary("walk all pages (500 each)", walk));
    match Arc::try_unwrap(s) {
        Ok(s) => s.finish().await,
        Err(_) => eprintln!("server still referenced; left running until exit"),
    }
    out
}

fn main() {
    let n: usize = std::env::var("PLINTH_BENCH_MACHINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for backend in [Backend::Sqlite, Backend::Postgres] {
        for line in rt.block_on(run(backend, n)) {
            println!("{line}");
        }
    }
}
