//! The image door (`[boot].images_listen`: `/images/` served with sendfile) against real clients:
//! curl for whole downloads, ranges, HEAD, ETags, keep-alive, HTTP/1.0, oversized heads and
//! request bodies; a raw socket for pipelined requests, malformed and slow heads. The main port
//! answers the same requests alike.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};
use support::{Ask as _, Backend, TestServer};

const SCHEM: &str = plinth::images::VANILLA_SCHEMATIC;
const LEN: usize = 5_000_000;

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 13 + i / 509) as u8).collect()
}

/// curl with `args`; (status code of the last transfer, headers, body).
fn curl(args: &[&str]) -> (u16, String, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tmp");
    let (h, b) = (dir.path().join("h"), dir.path().join("b"));
    let out = Command::new("curl")
        .args(["-s", "--max-time", "30", "-D"])
        .arg(&h)
        .arg("-o")
        .arg(&b)
        .args(["-w", "%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs");
    let code = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (
        code,
        std::fs::read_to_string(&h).unwrap_or_default(),
        std::fs::read(&b).unwrap_or_default(),
    )
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Send `bytes` on a fresh connection and read until the server closes it; panics if it is still
/// open after 30 s (the door's head timeout is 10 s, its idle timeout 60 s).
fn raw(addr: &str, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(bytes).expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("the door did not close the connection: {e}"));
    out
}

/// Split raw responses whose heads carry Content-Length: (status line, head, body) each; the
/// answers numbered in `heads_only` (to HEAD requests) carry no body.
fn responses(mut bytes: &[u8], heads_only: &[usize]) -> Vec<(String, String, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let status = head.lines().next().unwrap_or_default().to_string();
        let len: usize = if heads_only.contains(&out.len()) || status.contains(" 304 ") {
            0
        } else {
            header(&head, "content-length").map_or(0, |v| v.parse().expect("length"))
        };
        let body_end = (end + 4 + len).min(bytes.len());
        out.push((status, head, bytes[end + 4..body_end].to_vec()));
        bytes = &bytes[body_end..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_door_serves_images_with_sendfile() {
    let s =
        TestServer::start_with(Backend::Sqlite, "[boot]\nimages_listen = \"127.0.0.1:0\"").await;
    let door = s.images_base.clone().expect("the image door is on");
    let addr = door.trim_start_matches("http://").to_string();
    let cache = plinth::images::ImageCache::new(s.data_dir.join("images"));
    let src = s.data_dir.join("initramfs-src");
    let body = payload(LEN);
    std::fs::write(&src, &body).expect("src");
    let f = cache
        .import(SCHEM, "v1.11.6", "initramfs-amd64.xz", &src)
        .expect("import");
    let path = format!("/images/{SCHEM}/v1.11.6/initramfs-amd64.xz");
    let url = format!("{door}{path}");

    // Whole file, byte-exact, with the headers the main port sends.
    let (code, head, got) = curl(&[&url]);
    assert_eq!(code, 200, "{head}");
    assert_eq!(
        hex::encode(Sha256::digest(&got)),
        f.sha256,
        "sha256 of the download"
    );
    assert_eq!(header(&head, "content-length"), Some("5000000"));
    let etag = format!("\"sha256-{}\"", f.sha256);
    assert_eq!(header(&head, "etag"), Some(etag.as_str()));
    assert_eq!(header(&head, "accept-ranges"), Some("bytes"));
    let modified = header(&head, "last-modified")
        .expect("Last-Modified")
        .to_string();
    let (_, main_head, _) = curl(&["-I", &s.url(&path)]);
    assert_eq!(header(&main_head, "last-modified"), Some(modified.as_str()));
    assert_eq!(header(&main_head, "etag"), Some(etag.as_str()));

    // HEAD: the same head (that no body follows is checked on a pipelined connection below).
    let (code, head, _) = curl(&["-I", &url]);
    assert_eq!(code, 200, "{head}");
    assert_eq!(header(&head, "content-length"), Some("5000000"));
    assert_eq!(header(&head, "etag"), Some(etag.as_str()));

    // Ranges.
    for (range, from, to) in [
        ("1000-1999", 1000, 2000),
        ("-10", LEN - 10, LEN),
        ("4999990-", LEN - 10, LEN),
    ] {
        let (code, head, got) = curl(&["-r", range, &url]);
        assert_eq!(code, 206, "{range}: {head}");
        assert_eq!(
            header(&head, "content-range"),
            Some(format!("bytes {from}-{}/{LEN}", to - 1).as_str())
        );
        assert!(got == body[from..to], "{range}: wrong bytes");
    }
    let (code, head, _) = curl(&["-r", "6000000-", &url]);
    assert_eq!(code, 416, "{head}");
    assert_eq!(header(&head, "content-range"), Some("bytes */5000000"));

    // If-None-Match.
    let (code, head, got) = curl(&["-H", &format!("If-None-Match: {etag}"), &url]);
    assert_eq!((code, got.len()), (304, 0), "{head}");
    let (code, _, _) = curl(&["-H", "If-None-Match: \"other\"", "-r", "0-0", &url]);
    assert_eq!(code, 206);

    // Keep-alive: two downloads on one connection (curl reports 0 new connections for the second).
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{num_connects}\\n",
        ])
        .args([&url, &url])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200 1\n200 0\n");

    // HTTP/1.0: answered, then closed.
    let (code, head, got) = curl(&["--http1.0", "-r", "0-99", &url]);
    assert_eq!(code, 206, "{head}");
    assert_eq!(got, &body[..100]);
    assert_eq!(header(&head, "connection"), Some("close"));

    // Pipelined: three requests in one write, answered in order on one connection.
    let req = |range: &str, last: bool| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: t\r\nRange: bytes={range}\r\n{}\r\n",
            if last { "Connection: close\r\n" } else { "" }
        )
    };
    let all = format!(
        "{}HEAD {path} HTTP/1.1\r\nHost: t\r\n\r\n{}",
        req("0-9", false),
        req("10-19", true)
    );
    let bytes = raw(&addr, all.as_bytes());
    let got = responses(&bytes, &[1]);
    assert_eq!(got.len(), 3, "{}", String::from_utf8_lossy(&bytes));
    assert!(got[0].0.starts_with("HTTP/1.1 206"), "{}", got[0].0);
    assert_eq!(got[0].2, &body[0..10]);
    assert!(got[1].0.starts_with("HTTP/1.1 200"), "{}", got[1].0);
    assert!(got[2].0.starts_with("HTTP/1.1 206"), "{}", got[2].0);
    assert_eq!(got[2].2, &body[10..20]);

    // Refusals: malformed head (400, closed), too large a head (431), a request body (400, closed
    // without reading the next request), another method (405), other paths (404).
    let bytes = raw(&addr, b"NOT HTTP AT ALL\r\n\r\nGET / HTTP/1.1\r\n\r\n");
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    assert_eq!(responses(&bytes, &[]).len(), 1, "{text}");
    let big = format!("X-Big: {}", "a".repeat(20_000));
    let (code, _, _) = curl(&["-H", &big, &url]);
    assert_eq!(code, 431);
    let (code, head, _) = curl(&["-X", "POST", "--data", "abc", &url]);
    assert_eq!(code, 400, "{head}");
    assert_eq!(header(&head, "connection"), Some("close"));
    let chunked = format!(
        "PUT {path} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET {path} HTTP/1.1\r\nHost: t\r\n\r\n"
    );
    let bytes = raw(&addr, chunked.as_bytes());
    let got = responses(&bytes, &[]);
    assert_eq!(got.len(), 1, "{}", String::from_utf8_lossy(&bytes));
    assert!(got[0].0.starts_with("HTTP/1.1 400"), "{}", got[0].0);
    let (code, head, _) = curl(&["-X", "DELETE", &url]);
    assert_eq!(code, 405);
    assert_eq!(header(&head, "allow"), Some("GET, HEAD"));
    for bad in [
        "/boot.ipxe".to_string(),
        "/api/v1/machines".to_string(),
        format!("/images/{SCHEM}/v1.11.6/kernel-amd64"),
        format!("/images/{SCHEM}/v1.11.6/..%2F..%2Fplinth.db"),
        format!("/images/{SCHEM}/latest/initramfs-amd64.xz"),
    ] {
        let (code, _, _) = curl(&["--path-as-is", &format!("{door}{bad}")]);
        assert_eq!(code, 404, "{bad}");
        let (main, _, _) = curl(&["--path-as-is", &s.url(&bad)]);
        if bad.starts_with("/images/") {
            assert_eq!(main, 404, "main port: {bad}");
        }
    }

    // A head that arrives in pieces is waited for and answered; one that never completes is
    // dropped without an answer: the server closes the connection after its head timeout (10 s),
    // before its idle timeout (60 s) or the client's read timeout (30 s) could end it.
    let mut slow = TcpStream::connect(&addr).expect("connect");
    slow.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n").as_bytes())
        .expect("write");
    slow.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut one = [0_u8; 1];
    let early = slow.read(&mut one);
    assert!(
        early.as_ref().is_err_and(|e| matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )),
        "a partial head is waited for, neither answered nor closed: {early:?}"
    );
    slow.write_all(b"Range: bytes=0-9\r\nConnection: close\r\n\r\n")
        .expect("write");
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut bytes = Vec::new();
    slow.read_to_end(&mut bytes)
        .expect("the answer, then close");
    let got = responses(&bytes, &[]);
    assert_eq!(got.len(), 1, "{}", String::from_utf8_lossy(&bytes));
    assert!(got[0].0.starts_with("HTTP/1.1 206"), "{}", got[0].0);
    assert_eq!(got[0].2, &body[0..10]);
    let bytes = raw(
        &addr,
        format!("GET {path} HTTP/1.1\r\nHost: t\r\n").as_bytes(),
    );
    assert!(bytes.is_empty(), "{}", String::from_utf8_lossy(&bytes));

    // The door's requests are in the metrics, under the route the main port uses.
    let m = s.client.get(s.url("/metrics")).answer().await.text;
    assert!(
        m.lines()
            .any(|l| l.starts_with("plinth_http_requests_total{")
                && l.contains("route=\"/images/{schematic}/{version}/{file}\"")
                && l.contains("status=\"206\"")),
        "{m}"
    );

    // Shutting down ends the door too, with a connection still open.
    let idle = TcpStream::connect(&addr).expect("connect");
    s.finish().await;
    drop(idle);
    assert!(
        TcpStream::connect(&addr).is_err(),
        "the door still listens after shutdown"
    );
}
