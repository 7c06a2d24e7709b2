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
