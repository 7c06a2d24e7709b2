//! The boot chain over real protocols: TFTP with curl and atftp as clients, and the HTTP boot
//! endpoints (generic script, per-machine script with discovery, image cache with Range/ETag).

use crate::support;

use std::path::Path;
use std::process::Command;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use support::{Ask as _, Backend, TestServer};

/// A server whose TFTP (on a loopback port) serves the boot files in `root`.
async fn tftp_server(root: &Path) -> TestServer {
    TestServer::start_with(
        Backend::Sqlite,
        &format!(
            "[boot]\nipxe_dir = \"{}\"\n[tftp]\nenabled = true\nlisten = \"127.0.0.1:0\"\nmax_block_size = 1468\nmax_window_size = 16\n",
            root.display()
        ),
    )
    .await
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tftp_serves_read_only_inside_its_root() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("root");
    let big = payload(1_000_000);
    std::fs::write(root.join("ipxe.efi"), &big).expect("file");
    std::fs::write(dir.path().join("secret"), b"outside").expect("outside");
    std::os::unix::fs::symlink(dir.path().join("secret"), root.join("escape")).expect("symlink");
    let server = tftp_server(&root).await;
    let addr = server.tftp_addr.expect("tftp on");
    let url = |f: &str| format!("tftp://{addr}/{f}");

    // curl, default and large block sizes.
    for blk in ["512", "1468"] {
        let out = dir.path().join(format!("curl-{blk}"));
        let st = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "60",
                "--tftp-blksize",
                blk,
                "-o",
                out.to_str().expect("p"),
                &url("ipxe.efi"),
            ])
            .status()
            .expect("curl");
        assert!(st.success(), "curl blksize {blk}");
        assert_eq!(std::fs::read(&out).expect("read"), big, "blksize {blk}");
    }
    // atftp with blksize, tsize and windowsize (RFC 7440).
    let out = dir.path().join("atftp");
    let st = Command::new("atftp")
        .args([
            "--option",
            "blksize 1468",
            "--option",
            "tsize 0",
            "--option",
            "windowsize 16",
            "-g",
            "-r",
            "ipxe.efi",
            "-l",
            out.to_str().expect("p"),
            &addr.ip().to_string(),
            &addr.port().to_string(),
        ])
        .output()
        .expect("atftp");
    assert!(
        st.status.success(),
        "atftp: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert_eq!(
        std::fs::read(&out).expect("read"),
        big,
        "atftp with windowsize"
    );

    // Refusals: traversal, a symlink out of the root, a missing file, a write.
    for bad in ["../secret", "escape", "nothere"] {
        let out = dir.path().join("bad");
        let _ = std::fs::remove_file(&out);
        let st = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "20",
                "-o",
                out.to_str().expect("p"),
                &url(bad),
            ])
            .output()
            .expect("curl");
        assert!(!st.status.success(), "{bad} must be refused");
        assert_ne!(std::fs::read(&out).unwrap_or_default(), b"outside");
    }
    let up = dir.path().join("up");
    std::fs::write(&up, b"new").expect("up");
    let st = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-T",
            up.to_str().expect("p"),
            &url("up"),
        ])
        .output()
        .expect("curl");
    assert!(!st.status.success(), "writes are refused");
    assert!(!root.join("up").exists());

    // Many clients at once.
    let mut kids = Vec::new();
    for i in 0..20 {
        let out = dir.path().join(format!("c{i}"));
        kids.push((
            out.clone(),
            Command::new("curl")
                .args([
                    "-sS",
                    "--max-time",
                    "120",
                    "--tftp-blksize",
                    "1468",
                    "-o",
                    out.to_str().expect("p"),
                    &url("ipxe.efi"),
                ])
                .spawn()
                .expect("curl"),
        ));
    }
    for (out, mut k) in kids {
        assert!(k.wait().expect("wait").success());
        assert_eq!(std::fs::read(&out).expect("read").len(), big.len());
    }
    server.finish().await;
}

/// A storm of 80 curl clients from one address (more than the 64 transfers one address may run
/// at once), all started together: every one gets the whole file, and no request was dropped as
/// `busy` (past the per-address cap a request waits for a transfer to end; before, the cap was 8
/// and the rest were dropped until curl resent them seconds later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tftp_serves_eighty_clients_of_one_address_without_dropping_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("root");
    let file = payload(100_000);
    std::fs::write(root.join("undionly.kpxe"), &file).expect("file");
    let server = tftp_server(&root).await;
    let addr = server.tftp_addr.expect("tftp on");
    let url = format!("tftp://{addr}/undionly.kpxe");
    let mut kids = Vec::new();
    for i in 0..80 {
        let out = dir.path().join(format!("c{i}"));
        kids.push((
            out.clone(),
            Command::new("curl")
                .args(["-sS", "--max-time", "120", "-o"])
                .arg(&out)
                .arg(&url)
                .spawn()
                .expect("curl"),
        ));
    }
    let mut served = 0;
    for (out, mut k) in kids {
        let ok = k.wait().expect("wait").success();
        if ok && std::fs::read(&out).expect("read") == file {
            served += 1;
        }
    }
    let metrics = get(&server, "/metrics").await.text;
    let count = |outcome: &str| -> f64 {
        let family = format!("plinth_tftp_requests_total{{outcome=\"{outcome}\"}}");
        metrics
            .lines()
            .find(|l| l.starts_with(&family))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(served, 80, "clients served whole");
    assert_eq!(count("busy"), 0.0, "no request dropped: {metrics}");
    assert_eq!(count("served"), 80.0, "one transfer each: {metrics}");
    server.finish().await;
}

async fn get(s: &TestServer, path: &str) -> support::Answer {
    s.client.get(s.url(path)).answer().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_scripts_discover_unknown_machines() {
    let s = TestServer::start(Backend::Sqlite).await;
    let g = get(&s, "/boot.ipxe").await.text;
    assert!(g.starts_with("#!ipxe"));
    assert!(
        g.contains(&format!(
            "chain --autofree --replace {}/boot/machine.ipxe?mac=${{mac:hexhyp}}",
            s.base
        )),
        "{g}"
    );

    let q = "/boot/machine.ipxe?mac=52-54-00-99-00-01&uuid=8c1d7a2e-5f3b-4d6a-9e1f-2b3c4d5e6f70&serial=SN-0099\
             &manufacturer=QEMU&product=Standard%20PC&asset=To%20Be%20Filled%20By%20O.E.M.&buildarch=x86_64&platform=efi";
    let r = get(&s, q).await;
    assert_eq!(r.status, StatusCode::OK);
    let text = r.text;
    assert!(text.contains("registered as discovered"), "{text}");
    assert!(
        text.contains("chain --autofree --replace"),
        "polls again: {text}"
    );
    // Registered as discovered, with the SMBIOS facts (placeholders dropped).
    let m: Value = s
        .req(
            Method::GET,
            "/api/v1/machines/lookup?mac=52:54:00:99:00:01",
            &s.viewer,
        )
        .answer()
        .await
        .json();
    assert_eq!(m["state"], "discovered");
    assert_eq!(m["serial"], "SN-0099");
    assert_eq!(m["smbios_uuid"], "8c1d7a2e-5f3b-4d6a-9e1f-2b3c4d5e6f70");
    assert_eq!(m["manufacturer"], "QEMU");
    assert_eq!(m["model"], "Standard PC");
    assert!(
        m["asset_tag"].is_null(),
        "placeholder asset tag not recorded"
    );
    // The same machine again: no second record.
    let _ = get(&s, q).await;
    let page: Value = s
        .req(Method::GET, "/api/v1/machines", &s.viewer)
        .answer()
        .await
        .json();
    assert_eq!(page["total"], 1);
    // Its boot timeline.
    let ev: Value = s
        .req(
            Method::GET,
            &format!(
                "/api/v1/events?machine={}&kind=boot.",
                m["id"].as_str().expect("id")
            ),
            &s.viewer,
        )
        .answer()
        .await
        .json();
    let kinds: Vec<&str> = ev
        .as_array()
        .expect("arr")
        .iter()
        .map(|e| e["kind"].as_str().expect("k"))
        .collect();
    assert_eq!(kinds, ["boot.discovered", "boot.script"]);
    assert_eq!(ev[0]["detail"]["plan"], "discovery");

    // A registered machine waits for an operator (hold), without rebooting.
    s.req(Method::POST, "/api/v1/machines", &s.operator)
        .json(&serde_json::json!({"hostname": "w1", "interfaces": [{"mac": "52:54:00:99:00:02"}]}))
        .answer()
        .await
        .expect_status(StatusCode::CREATED);
    let text = get(
        &s,
        "/boot/machine.ipxe?mac=52:54:00:99:00:02&buildarch=i386",
    )
    .await
    .text;
    assert!(
        text.contains("machine is registered: waiting for an operator"),
        "{text}"
    );
    assert!(text.contains("sleep 60"));
    // Accepted, provisioned and installed: a network boot goes to the local disk, never reinstalls.
    let id = m["id"].as_str().expect("id").to_string();
    for to in ["registered", "ready", "provisioning"] {
        let r = s
            .req(
                Method::POST,
                &format!("/api/v1/machines/{id}/state"),
                &s.operator,
            )
            .json(&serde_json::json!({"state": to}))
            .answer()
            .await;
        assert_eq!(r.status, StatusCode::OK, "{to}");
    }
    let text = get(&s, q).await.text;
    assert!(
        text.contains("window closed: SN-0099 has no open provisioning window")
            && text.contains("plinth machine provision SN-0099"),
        "{text}"
    );
    s.req(
        Method::POST,
        &format!("/api/v1/machines/{id}/state"),
        &s.operator,
    )
    .json(&serde_json::json!({"state": "installed"}))
    .answer()
    .await
    .expect_status(StatusCode::OK);
    let text = get(&s, q).await.text;
    assert!(
        text.contains("booting from the local disk\nexit\n"),
        "{text}"
    );
    // No MAC: a clear refusal, not a panic.
    assert_eq!(
        get(&s, "/boot/machine.ipxe?uuid=x").await.status,
        StatusCode::BAD_REQUEST
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_served_with_ranges_and_etags() {
    let s = TestServer::start(Backend::Sqlite).await;
    let cache = plinth::images::ImageCache::new(s.data_dir.join("images"));
    let src = s.data_dir.join("kernel-src");
    let body = payload(3_000_000);
    std::fs::write(&src, &body).expect("src");
    let schem = plinth::images::VANILLA_SCHEMATIC;
    let f = cache
        .import(schem, "v1.11.6", "kernel-amd64", &src)
        .expect("import");
    let path = format!("/images/{schem}/v1.11.6/kernel-amd64");

    let r = get(&s, &path).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-length"], "3000000");
    let etag = r.headers["etag"].to_str().expect("etag").to_string();
    assert_eq!(etag, format!("\"sha256-{}\"", f.sha256));
    assert_eq!(r.body, body);

    let r = s
        .client
        .head(s.url(&path))
        .answer()
        .await
        .expect_status(StatusCode::OK);
    assert_eq!(r.headers["content-length"], "3000000");
    assert_eq!(r.headers["accept-ranges"], "bytes");

    let r = s
        .client
        .get(s.url(&path))
        .header("Range", "bytes=1000-1999")
        .answer()
        .await
        .expect_status(StatusCode::PARTIAL_CONTENT);
    assert_eq!(r.headers["content-range"], "bytes 1000-1999/3000000");
    assert_eq!(r.body, &body[1000..2000]);
    let r = s
        .client
        .get(s.url(&path))
        .header("Range", "bytes=-10")
        .answer()
        .await;
    assert_eq!(r.body, &body[body.len() - 10..]);
    let r = s
        .client
        .get(s.url(&path))
        .header("Range", "bytes=5000000-")
        .answer()
        .await
        .expect_status(StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(r.headers["content-range"], "bytes */3000000");
    s.client
        .get(s.url(&path))
        .header("If-None-Match", &etag)
        .answer()
        .await
        .expect_status(StatusCode::NOT_MODIFIED);

    for bad in [
        format!("/images/{schem}/v1.11.6/initramfs-amd64.xz"),
        format!("/images/{schem}/v1.11.6/..%2F..%2Fplinth.db"),
        "/images/../../v1.11.6/kernel-amd64".to_string(),
        format!("/images/{schem}/latest/kernel-amd64"),
    ] {
        assert_eq!(get(&s, &bad).await.status, StatusCode::NOT_FOUND, "{bad}");
    }
    s.finish().await;
}
