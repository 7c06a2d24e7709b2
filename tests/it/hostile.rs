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

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

/// Holds idle TCP connections to the main port and the image door and sends TFTP read requests it
/// never acknowledges (asking `timeout=255`), from the addresses it is given; prints `ready` and
/// what it opened, then holds everything until its stdin closes.
const ATTACKER: &str = r#"
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
server, srcs, per_door, rrqs = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
held, opened = [], {8080: 0, 8081: 0}
for port in (8080, 8081):
    for i in range(per_door):
        s = socket.socket()
        s.bind((srcs[i % len(srcs)], 0))
        s.settimeout(3)
        try:
            s.connect((server, port))
            opened[port] += 1
        except OSError:
            pass
        held.append(s)
for i in range(rrqs):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((srcs[i % len(srcs)], 0))
    u.sendto(b"\x00\x01ipxe.efi\x00octet\x00timeout\x00255\x00blksize\x001468\x00", (server, 69))
    held.append(u)
print("ready", opened[8080], opened[8081], rrqs, flush=True)
sys.stdin.read()
"#;

/// Finding 3: at a 1,024-descriptor limit, 1,100 idle TCP connections or 1,100 unanswered TFTP
/// read requests stopped HTTP, the image door, TFTP and DHCP. Plinth runs here in a network
/// namespace under `prlimit --nofile=256:256` (it cannot raise it), as the DHCP server of the
/// segment; from the client namespace, an attacker holds 400 idle connections to each HTTP door
/// and sends 400 unanswered TFTP requests (each more than the whole limit) from two addresses.
/// Then, from another address of the same segment: DHCP gives a lease, `/healthz` answers 200,
/// the image door answers, TFTP serves a file whole, and no request met a store that could not
/// open a descriptor (TFTP's `unavailable` outcome). Before, the main port accepted idle
/// connections until no descriptor was left and never closed them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_silent_tftp_clients_past_the_descriptor_limit_take_nothing_down() {
    use std::io::BufRead;
    use std::process::Stdio;
    let lab_mac = "52:54:00:4e:00:01";
    let mut lab = crate::support::netns::NetLab::new("10.78.0.1/24", lab_mac);
    for a in ["10.78.0.11/24", "10.78.0.12/24", "10.78.0.50/24"] {
        let st = std::process::Command::new("ip")
            .args(["-n", &lab.cli, "addr", "add", a, "dev", &lab.cli_if])
            .status()
            .expect("ip");
        assert!(st.success());
    }
    let dir = tempfile::tempdir().expect("tmp");
    let ipxe = dir.path().join("ipxe");
    std::fs::create_dir(&ipxe).expect("ipxe dir");
    let file: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(ipxe.join("ipxe.efi"), &file).expect("file");
    crate::support::write_key(&dir.path().join("secret.key"));
    let config = dir.path().join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            r#"data_dir = "{data}"
[http]
listen = "10.78.0.1:8080"
[secrets]
key_file = "{key}"
[boot]
ipxe_dir = "{ipxe}"
images_listen = "10.78.0.1:8081"
[tftp]
enabled = true
listen = "10.78.0.1:69"
[dhcp]
enabled = true
interfaces = ["{iface}"]
boot_url = "http://10.78.0.1:8080"
[[dhcp.subnet]]
cidr = "10.78.0.0/24"
mode = "authoritative"
server_ip = "10.78.0.1"
pool = ["10.78.0.100-10.78.0.150"]
routers = ["10.78.0.1"]
lease_seconds = 600
"#,
            data = dir.path().join("data").display(),
            key = dir.path().join("secret.key").display(),
            ipxe = ipxe.display(),
            iface = lab.srv_if,
        ),
    )
    .expect("config");
    // Plinth, at 256 descriptors it cannot raise.
    let mut cmd = lab.cmd(&lab.srv.clone(), "prlimit");
    cmd.args(["--nofile=256:256", BIN, "serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "plinth=info,warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = lab.spawn(cmd);
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("serving HTTP on") || line.contains("descriptor budget") {
                let _ = tx.send(line.clone());
            }
            if std::env::var_os("PLINTH_TEST_VERBOSE").is_some() {
                eprintln!("plinth: {line}");
            }
        }
    });
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("serving HTTP on")) {
        seen.push(
            rx.recv_timeout(Duration::from_secs(60))
                .expect("plinth starts"),
        );
    }
    let budget = seen
        .iter()
        .find(|l| l.contains("descriptor budget"))
        .cloned()
        .unwrap_or_default();
    assert!(budget.contains("descriptors=256"), "{seen:?}");
    eprintln!("{budget}");
    // The attacker.
    let mut cmd = lab.cmd(&lab.cli.clone(), "python3");
    cmd.args([
        "-c",
        ATTACKER,
        "10.78.0.1",
        "10.78.0.11,10.78.0.12",
        "400",
        "400",
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    let attacker = lab.spawn(cmd);
    let mut line = String::new();
    std::io::BufReader::new(attacker.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("attacker output");
    assert!(line.starts_with("ready"), "{line}");
    eprintln!("attacker: {}", line.trim());
    let _hold = attacker.stdin.take();
    let (cli, cli_if) = (lab.cli.clone(), lab.cli_if.clone());
    let curl = |args: &[&str]| -> (String, Vec<u8>) {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &cli, "curl", "-s", "--max-time", "60"])
            .args(["--interface", "10.78.0.50", "-w", "\n%{http_code}"])
            .args(args)
            .output()
            .expect("curl");
        let mut body = out.stdout;
        let at = body.iter().rposition(|&b| b == b'\n').unwrap_or(0);
        let code = String::from_utf8_lossy(&body[at..]).trim().to_string();
        body.truncate(at);
        (code, body)
    };
    // HTTP: the main port and the image door answer.
    let (code, body) = curl(&["http://10.78.0.1:8080/healthz"]);
    assert_eq!(code, "200", "{}", String::from_utf8_lossy(&body));
    let (code, _) = curl(&["http://10.78.0.1:8081/images/none/v0/kernel-amd64"]);
    assert!(code.starts_with('4'), "image door answered {code}");
    // TFTP serves the file whole.
    let (_, got) = curl(&["--tftp-blksize", "1468", "tftp://10.78.0.1/ipxe.efi"]);
    assert!(got == file, "TFTP: {} of {} bytes", got.len(), file.len());
    // DHCP answers: busybox udhcpc gets a lease.
    let st = std::process::Command::new("ip")
        .args(["netns", "exec", &cli, "busybox", "udhcpc", "-i", &cli_if])
        .args([
            "-n",
            "-q",
            "-f",
            "-t",
            "4",
            "-T",
            "2",
            "-A",
            "1",
            "-s",
            "/bin/true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("udhcpc");
    assert!(st.success(), "udhcpc got no lease");
    // Plinth is still serving, and says what it refused.
    let (code, metrics) = curl(&["http://10.78.0.1:8080/metrics"]);
    assert_eq!(code, "200");
    let metrics = String::from_utf8_lossy(&metrics);
    for family in [
        "plinth_http_connections_refused_total",
        "plinth_images_connections_refused_total",
        "plinth_tftp_requests_total{outcome=\"busy\"}",
    ] {
        let n: f64 = metrics
            .lines()
            .find(|l| l.starts_with(family))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        eprintln!("{family} {n}");
        assert!(n > 0.0, "{family}: {metrics}");
    }
    assert!(
        !metrics.contains("outcome=\"unavailable\""),
        "the store ran out of descriptors: {metrics}"
    );
    drop(_hold);
    lab.stop_all();
}
