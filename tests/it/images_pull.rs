//! Talos images from an Image Factory: `plinth image pull` with progress, verification (an error
//! page is never cached), and the server's on-demand pull, single-flight: two hundred concurrent
//! requests for an image that is not cached cause one upstream download. The factory is a real
//! HTTP server on loopback written in the test, serving generated kernel and initramfs bytes slowly
//! enough that the requests overlap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use reqwest::{Method, StatusCode};
use sha2::{Digest, Sha256};

use crate::support::{Ask as _, Backend, TestServer};
use crate::talos_configs::{apply_dir, schemas, write_inventory};

const VERSION: &str = "v1.12.11";

#[derive(Clone, Default)]
pub(crate) struct Factory {
    pub(crate) hits: Arc<Mutex<HashMap<String, usize>>>,
    served: Arc<AtomicUsize>,
}

pub(crate) fn kernel() -> Vec<u8> {
    let mut k: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    k[0x202..0x206].copy_from_slice(b"HdrS");
    k
}

pub(crate) fn initramfs() -> Vec<u8> {
    let mut x: Vec<u8> = (0..1_500_000u32)
        .map(|i| (i.wrapping_mul(40_503) >> 7) as u8)
        .collect();
    x[..6].copy_from_slice(&[0xFD, b'7', b'z', b'X', b'Z', 0x00]);
    x
}

async fn image(
    State(f): State<Factory>,
    Path((_schematic, version, name)): Path<(String, String, String)>,
) -> Response {
    *f.hits
        .lock()
        .expect("hits")
        .entry(format!("{version}/{name}"))
        .or_default() += 1;
    let body = match (version.as_str(), name.as_str()) {
        (VERSION, "kernel-amd64") => kernel(),
        (VERSION, "initramfs-amd64.xz") => initramfs(),
        ("v9.9.9", "kernel-amd64") => {
            return (StatusCode::OK, "<html>rate limited</html>").into_response()
        }
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    f.served.fetch_add(1, Ordering::SeqCst);
    // Slow enough (about a second) that concurrent requests overlap the download.
    let chunks: Vec<Vec<u8>> = body.chunks(64 * 1024).map(<[u8]>::to_vec).collect();
    let stream = futures::stream::iter(chunks).then(|c| async move {
        tokio::time::sleep(Duration::from_millis(15)).await;
        Ok::<_, std::io::Error>(c)
    });
    (
        [(axum::http::header::CONTENT_LENGTH, body.len().to_string())],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

use futures::StreamExt as _;

pub(crate) async fn factory() -> (String, Factory, tokio::task::JoinHandle<()>) {
    let f = Factory::default();
    let app = axum::Router::new()
        .route(
            "/image/{schematic}/{version}/{name}",
            axum::routing::get(image),
        )
        .with_state(f.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    let h = tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (url, f, h)
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_pull_verifies_and_keeps_what_is_cached() {
    let (url, f, h) = factory().await;
    let dir = tempfile::tempdir().expect("tmp");
    let schematic = plinth::images::VANILLA_SCHEMATIC;
    let (data, factory_url) = (dir.path().to_path_buf(), url.clone());
    let run = move |version: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_plinth"))
            .args(["--data-dir"])
            .arg(&data)
            .args([
                "image",
                "pull",
                "--factory",
                &factory_url,
                "--version",
                version,
            ])
            .output()
            .expect("plinth")
    };
    let out = tokio::task::spawn_blocking({
        let run = run.clone();
        move || run(VERSION)
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "pulled {schematic}/{VERSION}/kernel-amd64 (3000000 bytes, sha256 {})",
            sha(&kernel())
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "pulled {schematic}/{VERSION}/initramfs-amd64.xz (1500000 bytes, sha256 {})",
            sha(&initramfs())
        )),
        "{stdout}"
    );
    let cached = std::fs::read(
        dir.path()
            .join(format!("images/{schematic}/{VERSION}/kernel-amd64")),
    )
    .expect("cached");
    assert_eq!(sha(&cached), sha(&kernel()));

    // Again: nothing downloaded.
    let before = f.served.load(Ordering::SeqCst);
    let out = tokio::task::spawn_blocking({
        let run = run.clone();
        move || run(VERSION)
    })
    .await
    .expect("join");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("cached "),
        "{out:?}"
    );
    assert_eq!(f.served.load(Ordering::SeqCst), before);
    // The same with --json: one object per file, and nothing downloaded.
    let out = tokio::task::spawn_blocking({
        let (data, factory_url) = (dir.path().to_path_buf(), url.clone());
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_plinth"))
                .args(["image", "pull", "--json", "--factory", &factory_url])
                .args(["--version", VERSION, "--data-dir"])
                .arg(&data)
                .output()
                .expect("plinth")
        }
    })
    .await
    .expect("join");
    assert!(out.status.success(), "{out:?}");
    let files: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let files = files.as_array().expect("array");
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files
            .iter()
            .all(|f| f["downloaded"] == false && f["sha256"].is_string()),
        "{files:?}"
    );
    assert_eq!(f.served.load(Ordering::SeqCst), before);

    // A version the factory does not have, and an error page served as 200: refused, nothing
    // cached, no partial files left.
    for (v, want) in [("v1.0.1", "HTTP 404"), ("v9.9.9", "not a Linux kernel")] {
        let out = tokio::task::spawn_blocking({
            let run = run.clone();
            let v = v.to_string();
            move || run(&v)
        })
        .await
        .expect("join");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{v}: {err}");
        let vdir = dir.path().join(format!("images/{schematic}/{v}"));
        let left: Vec<_> = std::fs::read_dir(&vdir)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            left.is_empty(),
            "{v}: nothing cached, no partial file: {left:?}"
        );
    }
    h.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_pull_is_single_flight() {
    let (url, f, h) = factory().await;
    let extra = format!(
        "[talos]\nschema_dir = \"{}\"\n[images]\nfactory_url = \"{url}\"\n[boot]\nimages_listen = \"127.0.0.1:0\"\n",
        schemas().display()
    );
    let srv = TestServer::start_with(Backend::Sqlite, &extra).await;
    let tmp = tempfile::tempdir().expect("tmp");
    let secrets = tmp.path().join("s.yaml");
    std::fs::write(
        &secrets,
        plinth::talos::secrets::SecretsBundle::generate()
            .expect("b")
            .to_yaml()
            .expect("y"),
    )
    .expect("w");
    write_inventory(tmp.path(), &secrets, None);
    apply_dir(&srv, &extra, &tmp.path().join("inv")).await;
    let st: serde_json::Value = srv
        .req(Method::GET, "/api/v1/machines/node-1/config", &srv.viewer)
        .answer()
        .await
        .json();
    let schematic = st["schematic_id"].as_str().expect("schematic").to_string();

    // Both doors pull through the one single-flight look-up: the main port and the image door.
    let doors = [
        srv.base.clone(),
        srv.images_base.clone().expect("image door"),
    ];

    // A version no declared cluster uses is never fetched.
    for door in &doors {
        let r = srv
            .client
            .get(format!("{door}/images/{schematic}/v1.11.6/kernel-amd64"))
            .answer()
            .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{door}");
    }
    assert!(f.hits.lock().expect("hits").is_empty());

    // Two hundred machines at once ask for the kernel that is not cached yet, half of them
    // through the image door. They come from eight source addresses (as machines do from their
    // own), so the doors' per-client connection cap does not turn them away.
    let want = sha(&kernel());
    let clients: Vec<reqwest::Client> = (1..=8u8)
        .map(|n| {
            reqwest::Client::builder()
                .local_address(std::net::IpAddr::from([127, 0, 1, n]))
                .build()
                .expect("client")
        })
        .collect();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (c, u) = (
            clients[i % clients.len()].clone(),
            format!("{}/images/{schematic}/{VERSION}/kernel-amd64", doors[i % 2]),
        );
        tasks.push(tokio::spawn(async move {
            let r = c.get(u).answer().await;
            (r.status, sha(&r.body))
        }));
    }
    for t in tasks {
        let (status, got) = t.await.expect("join");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(got, want);
    }
    let hits = f.hits.lock().expect("hits").clone();
    assert_eq!(
        hits.get(&format!("{VERSION}/kernel-amd64")),
        Some(&1),
        "{hits:?}"
    );
    h.abort();
    srv.finish().await;
}
