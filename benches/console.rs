//! Console benchmark (not a test): time to answer the machine table and a machine's page at
//! 10,000 machines, on SQLite and on PostgreSQL (DATABASE_URL or the local server), measured from
//! the client over loopback (so it includes HTTP and HTML), beside the API's JSON list of the same
//! page size as the reference: the ratio says what rendering the page costs over the API. The
//! free-text search is timed three ways: a serial prefix (100 machines match), a MAC fragment (a
//! few hundred match) and a text that matches none (the whole column is read, and counted).
//!
//! Run: `cargo bench --bench console` (set `PLINTH_BENCH_MACHINES` to change the count).

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use reqwest::Method;
use support::{Backend, TestServer};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary(label: &str, mut v: Vec<Duration>) -> (String, Duration) {
    v.sort();
    let p50 = pct(&v, 0.5);
    (
        format!(
            "{label:<40} n={:<4} p50={:>8.2?} p95={:>8.2?} max={:>8.2?}",
            v.len(),
            p50,
            pct(&v, 0.95),
            v.last().copied().unwrap_or_default()
        ),
        p50,
    )
}

async fn run(backend: Backend, n: usize) -> Vec<String> {
    let s = TestServer::start(backend).await;
    let mut out = vec![format!("== {backend:?}, {n} machines ==")];
    let mut csv = String::from("hostname,mac,serial,asset_tag,site,rack,rack_unit,role\n");
    for i in 0..n {
        csv.push_str(&format!(
            "node-{i:05},52:55:{:02x}:{:02x}:{:02x}:01,SN{i:08},AT{i:06},s{},r{:02},{},worker\n",
            i >> 16,
            (i >> 8) & 255,
            i & 255,
            i % 3,
            i % 50,
            i % 42 + 1
        ));
    }
    let r = s
        .req(Method::POST, "/api/v1/machines/import", &s.operator)
        .header("content-type", "text/csv")
        .body(csv)
        .send()
        .await
        .expect("import");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);

    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let cookie = s.console_session(&s.viewer).await;
    let page = |path: String| {
        let (client, cookie, url) = (client.clone(), cookie.clone(), s.url(&path));
        async move {
            let t = Instant::now();
            let r = client
                .get(url)
                .header("cookie", cookie)
                .send()
                .await
                .expect("get");
            assert_eq!(r.status(), 200, "{path}");
            let _ = r.bytes().await.expect("body");
            t.elapsed()
        }
    };
    let ids: Vec<String> = {
        let v: serde_json::Value = s
            .req(Method::GET, "/api/v1/machines?limit=1000", &s.viewer)
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|m| m["id"].as_str().expect("id").to_string())
            .collect()
    };
    let (mut first, mut deep, mut sorted, mut search, mut machine, mut api) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut by_mac, mut nothing) = (vec![], vec![]);
    for i in 0..100 {
        first.push(page("/console/machines".into()).await);
        deep.push(page(format!("/console/machines?page={}", n / 50 - 1)).await);
        sorted.push(page("/console/machines?sort=location&desc=1&state=registered".into()).await);
        search.push(page(format!("/console/machines?q=SN0000{:02}", i % 100)).await);
        by_mac.push(page(format!("/console/machines?q=:{:02x}:01", i % 40)).await);
        nothing.push(page(format!("/console/machines?q=no-such-machine-{i}")).await);
        machine.push(page(format!("/console/machines/{}", ids[(i * 37) % ids.len()])).await);
        let t = Instant::now();
        let r = s
            .req(Method::GET, "/api/v1/machines?limit=50", &s.viewer)
            .send()
            .await
            .expect("api");
        let _ = r.bytes().await;
        api.push(t.elapsed());
    }
    let (line, reference) = summary("API JSON list, 50 rows (reference)", api);
    out.push(line);
    for (label, v) in [
        ("console machines, first page", first),
        ("console machines, last page", deep),
        ("console machines, sorted+filtered", sorted),
        ("console machines, free-text search", search),
        ("console machines, search by MAC part", by_mac),
        ("console machines, search matching none", nothing),
        ("console machine page", machine),
    ] {
        let (line, p50) = summary(label, v);
        out.push(format!(
            "{line}  ratio to API p50 {:.2}",
            p50.as_secs_f64() / reference.as_secs_f64().max(1e-9)
        ));
    }
    s.finish().await;
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
