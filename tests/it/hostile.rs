//! A hostile provisioning network (issue 15, "bounded resources"): what an anonymous client can
//! make Plinth hold is bounded. Metric label sets, connections, TFTP transfers, descriptors,
//! discovered machines and events, each checked against a running Plinth with real sockets.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{Backend, TestServer};

/// Send one raw request with `method` and read the answer's status line.
fn raw_status(addr: &str, method: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Series of `plinth_http_requests_total` in one scrape of `/metrics`.
async fn request_series(srv: &TestServer) -> Vec<String> {
    let text = reqwest::get(srv.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .filter(|l| l.starts_with("plinth_http_requests_total{"))
        .map(str::to_string)
        .collect()
}

/// Finding 2: every distinct method (and path) a client invents became a label set of its own,
/// on the main port and the image door alike. 300 invented methods on unknown and known paths
/// of both doors now add a handful of series, all labelled `other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_methods_and_paths_do_not_grow_the_metrics() {
    let srv =
        TestServer::start_with(Backend::Sqlite, "[boot]\nimages_listen = \"127.0.0.1:0\"").await;
    let main = srv.base.trim_start_matches("http://").to_string();
    let door = srv
        .images_base
        .clone()
        .expect("image door")
        .trim_start_matches("http://")
        .to_string();
    let image = format!(
        "/images/{}/v1.10.0/kernel-amd64",
        plinth::images::VANILLA_SCHEMATIC
    );
    let before = request_series(&srv).await.len();
    let addrs = [main.clone(), door.clone()];
    let image_path = image.clone();
    tokio::task::spawn_blocking(move || {
        for i in 0..300 {
            let method = format!("M{i}X");
            let path = format!("/no/such/{i}");
            for addr in &addrs {
                let line = raw_status(addr, &method, &path);
                assert!(line.starts_with("HTTP/1.1 4"), "{method} {path}: {line}");
                let line = raw_status(addr, &method, &image_path);
                assert!(line.starts_with("HTTP/1.1 4"), "{method} image: {line}");
            }
        }
    })
    .await
    .expect("requests");
    let series = request_series(&srv).await;
    assert!(
        series.len() <= before + 12,
        "{} series after 1,200 requests with 300 methods:\n{}",
        series.len(),
        series.join("\n")
    );
    assert!(
        series
            .iter()
            .any(|l| l.contains("method=\"other\"") && l.contains("route=\"other\"")),
        "{}",
        series.join("\n")
    );
    assert!(
        !series
            .iter()
            .any(|l| l.contains("M17X") || l.contains("/no/such")),
        "{}",
        series.join("\n")
    );
    srv.finish().await;
}

/// Machines in `discovered`, as the API counts them.
async fn discovered(srv: &TestServer) -> i64 {
    let page: serde_json::Value = srv
        .req(
            reqwest::Method::GET,
            "/api/v1/machines?state=discovered&limit=1",
            &srv.viewer,
        )
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    page["total"].as_i64().expect("total")
}

/// Finding 6 (discovered machines): every boot request of an unknown MAC registered a machine
/// (5,000 in 7 s). A flood of 5,000 random MACs from one network now registers at most its
/// source's burst plus its rate over the flood's duration; the rest are told to come back later
/// (429). A known machine still gets its script during the flood, and another network still
/// gets to register its machines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_mac_flood_registers_a_bounded_number_of_machines() {
    use futures::StreamExt;
    let srv = TestServer::start(Backend::Sqlite).await;
    let limits = plinth::service::provisioning::DiscoveryLimits::default();
    let known = srv
        .req(reqwest::Method::POST, "/api/v1/machines", &srv.operator)
        .json(&serde_json::json!({
            "hostname": "known-1",
            "interfaces": [{"mac": "52:54:00:0f:00:01", "boot": true}]
        }))
        .send()
        .await
        .expect("create");
    assert_eq!(known.status(), 201, "{:?}", known.text().await);
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    let flood = futures::stream::iter(0..5000u32)
        .map(|i| {
            let url = srv.url(&format!(
                "/boot/machine.ipxe?mac=02-{:02x}-{:02x}-{:02x}-{:02x}-00&buildarch=x86_64",
                (i >> 24) as u8,
                (i >> 16) as u8,
                (i >> 8) as u8,
                i as u8
            ));
            let client = client.clone();
            async move { client.get(url).send().await.map(|r| r.status().as_u16()) }
        })
        .buffer_unordered(32);
    // A known machine during the flood.
    let known_script = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = client
            .get(srv.url("/boot/machine.ipxe?mac=52-54-00-0f-00-01&buildarch=x86_64"))
            .send()
            .await
            .expect("known");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    };
    let (statuses, (known_status, known_body)) =
        tokio::join!(flood.collect::<Vec<_>>(), known_script);
    let elapsed = started.elapsed();
    assert_eq!(known_status, 200, "{known_body}");
    let ok = statuses.iter().filter(|s| matches!(s, Ok(200))).count();
    let deferred = statuses.iter().filter(|s| matches!(s, Ok(429))).count();
    assert_eq!(ok + deferred, 5000, "{:?}", &statuses[..10]);
    let rows = discovered(&srv).await;
    eprintln!("flood: {rows} of 5000 unknown MACs registered, {deferred} deferred, in {elapsed:?}");
    let bound =
        limits.per_source_burst + limits.per_source_per_second * elapsed.as_secs_f64().ceil();
    assert!(
        (rows as f64) <= bound && rows as usize == ok,
        "{rows} machines discovered ({ok} answered 200) in {elapsed:?}; bound {bound}"
    );
    // Another source network is not starved by the flood's.
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 9, 1]))
        .build()
        .expect("client");
    let r = other
        .get(srv.url("/boot/machine.ipxe?mac=52-54-00-0f-00-02&buildarch=x86_64"))
        .send()
        .await
        .expect("other network");
    assert_eq!(r.status(), 200);
    assert_eq!(discovered(&srv).await, rows + 1);
    // The refusals are counted, not written as events.
    let metrics = reqwest::get(srv.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(&format!("plinth_discoveries_refused_total {deferred}")),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("discover"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    srv.finish().await;
}
