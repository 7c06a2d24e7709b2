//! A hostile provisioning network (issue 15, "bounded resources"): what an anonymous client can
//! make Plinth hold is bounded. Metric label sets, connections, TFTP transfers, descriptors,
//! discovered machines and events, each checked against a running Plinth with real sockets.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{Ask as _, Backend, TestServer};

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
    srv.metrics()
        .await
        .lines()
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
    srv.get_json("/api/v1/machines?state=discovered&limit=1", &srv.viewer)
        .await["total"]
        .as_i64()
        .expect("total")
}

/// A machine registered through the API by the operator: its id.
async fn register(srv: &TestServer, body: serde_json::Value) -> String {
    srv.req(reqwest::Method::POST, "/api/v1/machines", &srv.operator)
        .json(&body)
        .answer()
        .await
        .expect_status(reqwest::StatusCode::CREATED)
        .json()["id"]
        .as_str()
        .expect("id")
        .to_string()
}

/// A client whose requests leave from `local` (a loopback address of the flood's network).
fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(Some(local.parse().expect("ip")))
        .build()
        .expect("client")
}

/// GET each of `urls` with `client`, `at_once` at a time: the answers' statuses (0: no answer).
async fn flood(client: &reqwest::Client, urls: Vec<String>, at_once: usize) -> Vec<u16> {
    use futures::StreamExt;
    futures::stream::iter(urls)
        .map(|url| {
            let c = client.clone();
            async move {
                c.get(url)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            }
        })
        .buffer_unordered(at_once)
        .collect()
        .await
}

/// The API's events of `query` (`machine=...&kind=...`), read by the viewer.
async fn events(srv: &TestServer, query: &str) -> Vec<serde_json::Value> {
    srv.get_json(&format!("/api/v1/events?{query}&limit=1000"), &srv.viewer)
        .await
        .as_array()
        .expect("list")
        .clone()
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
    register(
        &srv,
        serde_json::json!({
            "hostname": "known-1",
            "interfaces": [{"mac": "52:54:00:0f:00:01", "boot": true}]
        }),
    )
    .await;
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
    let other = client_from("127.0.9.1");
    let r = other
        .get(srv.url("/boot/machine.ipxe?mac=52-54-00-0f-00-02&buildarch=x86_64"))
        .send()
        .await
        .expect("other network");
    assert_eq!(r.status(), 200);
    assert_eq!(discovered(&srv).await, rows + 1);
    // The refusals are counted, not written as events.
    let metrics = srv.metrics().await;
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

/// Finding 6 (events): 20,000 refused config fetches buried a machine's boot timeline, one event
/// each. A flood of 600 refused fetches for one machine from one address now writes one
/// `config.refused` event (the ones after it within the minute are counted into the next one's
/// `suppressed`), another address gets its own, and the machine's timeline stays readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refused_config_fetches_writes_a_bounded_number_of_events() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let id = register(
        &srv,
        serde_json::json!({"hostname": "victim", "interfaces": [{"mac": "52:54:00:4f:00:09"}]}),
    )
    .await;
    let urls = (0..600u32)
        .map(|i| srv.url(&format!("/config/{id}?token=guess-{i}&uuid=x")))
        .collect();
    let statuses = flood(&client_from("127.0.0.1"), urls, 32).await;
    assert!(statuses.iter().all(|s| *s == 404), "{statuses:?}");
    let other = srv.url(&format!("/config/{id}?token=guess&uuid=x"));
    assert_eq!(
        flood(&client_from("127.0.0.2"), vec![other], 1).await,
        [404]
    );
    let events = events(&srv, &format!("machine={id}&kind=config.refused")).await;
    let mut from: Vec<&str> = events
        .iter()
        .filter_map(|e| e["detail"]["from"].as_str())
        .collect();
    from.sort();
    assert_eq!(from, ["127.0.0.1", "127.0.0.2"], "{events:?}");
    for e in &events {
        assert_eq!(e["detail"]["reason"], "no open provisioning window", "{e}");
    }
    let timeline = srv
        .get_json(&format!("/api/v1/machines/{id}/timeline"), &srv.viewer)
        .await;
    let steps = timeline.as_array().map_or(0, Vec::len);
    assert!(steps <= 5, "the timeline holds {steps} entries: {timeline}");
    srv.finish().await;
}

/// Finding 6 (events), boot scripts: `GET /boot/machine.ipxe?mac=M` needs nothing but a MAC, and
/// every request wrote a `boot.script` event. 400 requests for one machine from one address now
/// write a burst of them (at most 10, and one more every 6 s); another address has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_boot_script_requests_writes_a_bounded_number_of_events() {
    let srv = TestServer::start(Backend::Sqlite).await;
    let id = register(
        &srv,
        serde_json::json!({"hostname": "known", "interfaces": [{"mac": "52:54:00:4f:00:0a"}]}),
    )
    .await;
    let url = srv.url("/boot/machine.ipxe?mac=52-54-00-4f-00-0a&buildarch=x86_64&platform=efi");
    let statuses = flood(&client_from("127.0.0.1"), vec![url.clone(); 400], 16).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(flood(&client_from("127.0.0.2"), vec![url], 1).await, [200]);
    let events = events(&srv, &format!("machine={id}&kind=boot.")).await;
    let from = |ip: &str| {
        events
            .iter()
            .filter(|e| {
                e["detail"]["from"]
                    .as_str()
                    .is_some_and(|f| f.starts_with(ip))
            })
            .count()
    };
    let (flooded, other) = (from("127.0.0.1"), from("127.0.0.2"));
    eprintln!("400 script requests wrote {flooded} events; another address {other}");
    assert!((1..=15).contains(&flooded), "{flooded} events: {events:?}");
    assert_eq!(other, 1, "{events:?}");
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
    // It holds everything until its stdin (this pipe) closes.
    let attacker = lab.spawn_as_is(cmd);
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

/// Sends DHCPDISCOVERs from a new MAC each (`02:aa:` and a counter) at a steady rate, broadcast
/// out of the interface it is given, until its stdin closes (at most three million).
const FLOODER: &str = r#"
import select, socket, struct, sys, time
ifname, rate = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
s.bind(("0.0.0.0", 6868))
tail = b"\0" * 10 + b"\0" * 192 + b"\x63\x82\x53\x63" + bytes([53, 1, 1, 255])
n, start = 0, time.monotonic()
print("ready", flush=True)
while n < 3000000:
    for _ in range(100):
        c = struct.pack(">I", n)
        pkt = bytes([1, 1, 6, 0]) + c + b"\0\0\x80\0" + b"\0" * 16 + b"\x02\xaa" + c + tail
        try:
            s.sendto(pkt, ("255.255.255.255", 67))
        except OSError:
            pass
        n += 1
    if select.select([sys.stdin], [], [], 0)[0]:
        break
    due = start + n / rate
    now = time.monotonic()
    if due > now:
        time.sleep(due - now)
print("sent", n, flush=True)
"#;

/// Finding 5: past 100,000 MACs the per-MAC flood guard rescanned its whole map on every packet
/// under one mutex, and at 6,000 DISCOVER/s none of a reserved machine's DISCOVERs was answered.
/// Plinth serves a segment from a network namespace; from the client namespace a flooder sends
/// DISCOVERs from a new MAC each at 8,000 a second. Once Plinth has received more than 100,000
/// of them, and while the flood goes on, busybox udhcpc on the reserved machine's NIC gets its
/// reserved address three times over, and the flood is counted as limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_mac_flood_past_100000_macs_leaves_dhcp_answering() {
    use std::io::BufRead;
    use std::process::Stdio;
    let mac = "52:54:00:4f:00:01";
    let mut lab = crate::support::netns::NetLab::new("10.80.0.1/24", mac);
    let st = std::process::Command::new("ip")
        .args([
            "-n",
            &lab.cli,
            "addr",
            "add",
            "10.80.0.2/24",
            "dev",
            &lab.cli_if,
        ])
        .status()
        .expect("ip");
    assert!(st.success());
    let dir = tempfile::tempdir().expect("tmp");
    crate::support::write_key(&dir.path().join("secret.key"));
    let config = dir.path().join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            r#"data_dir = "{data}"
[http]
listen = "10.80.0.1:8080"
[secrets]
key_file = "{key}"
[dhcp]
enabled = true
interfaces = ["{iface}"]
boot_url = "http://10.80.0.1:8080"
[[dhcp.subnet]]
cidr = "10.80.0.0/24"
mode = "authoritative"
server_ip = "10.80.0.1"
pool = ["10.80.0.100-10.80.0.200"]
routers = ["10.80.0.1"]
lease_seconds = 600
"#,
            data = dir.path().join("data").display(),
            key = dir.path().join("secret.key").display(),
            iface = lab.srv_if,
        ),
    )
    .expect("config");
    crate::dhcp::register(
        &dir.path().join("data"),
        &dir.path().join("secret.key"),
        "reserved-1",
        mac,
        Some("10.80.0.42"),
    )
    .await;
    let mut cmd = lab.cmd(&lab.srv.clone(), BIN);
    cmd.args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = lab.spawn(cmd);
    crate::support::lan::wait_for_line(child, "serving HTTP on", Duration::from_secs(60));
    let (cli, cli_if) = (lab.cli.clone(), lab.cli_if.clone());
    let metric = |name: &str| -> f64 {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &cli, "curl", "-sf", "--max-time", "20"])
            .arg("http://10.80.0.1:8080/metrics")
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let udhcpc = || -> Option<String> {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &cli, "busybox", "udhcpc", "-i", &cli_if])
            .args(["-n", "-q", "-f", "-t", "5", "-T", "2", "-A", "1"])
            .args(["-s", "/bin/true"])
            .output()
            .expect("udhcpc");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out.status
            .success()
            .then(|| {
                text.lines()
                    .find(|l| l.contains("obtained"))
                    .map(str::to_string)
            })
            .flatten()
    };
    assert!(
        udhcpc().is_some_and(|l| l.contains("10.80.0.42")),
        "before the flood"
    );
    let mut cmd = lab.cmd(&cli, "python3");
    cmd.args(["-c", FLOODER, &cli_if, "8000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let flooder = lab.spawn_as_is(cmd);
    let mut out = std::io::BufReader::new(flooder.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("flooder output");
    assert!(line.starts_with("ready"), "{line}");
    let stop = flooder.stdin.take();
    // Until Plinth has taken in more than 100,000 of the flood's DISCOVERs (bounded).
    let mut received = 0.0;
    for _ in 0..120 {
        received = metric("plinth_dhcp_received_total");
        if received > 100_000.0 {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(received > 100_000.0, "Plinth received {received} DISCOVERs");
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(udhcpc());
    }
    let after = metric("plinth_dhcp_received_total");
    let limited = metric("plinth_dhcp_dropped_total{reason=\"unknown_flood\"}");
    drop(stop);
    line.clear();
    out.read_line(&mut line).expect("flooder output");
    eprintln!(
        "flood: {} ; Plinth received {received} before the reserved machine asked, {after} after; \
         {limited} dropped as an unknown flood; leases {leases:?}",
        line.trim()
    );
    assert!(
        after > received,
        "the flood went on while the machine asked"
    );
    for l in &leases {
        assert!(
            l.as_deref().is_some_and(|l| l.contains("10.80.0.42")),
            "the reserved machine got its address during the flood: {leases:?}"
        );
    }
    assert!(limited > 0.0, "the flood was limited");
    lab.stop_all();
}

/// A namespace (and whatever runs in it) deleted on drop.
struct ExtraNs(String);

impl Drop for ExtraNs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

/// Finding 4: with `dhcp.interfaces = []` ("all interfaces") the arrival interface was not
/// tracked: a DISCOVER on the management LAN got a provisioning address, and the provisioning
/// client got nothing because replies left through the default route. Plinth's namespace here has
/// two LANs: provisioning (10.81.0.0/24, the configured subnet) and management (10.82.0.0/24,
/// no subnet, and the default route). udhcpc on the management LAN gets no lease (its DISCOVERs
/// reach Plinth and are counted as `no_subnet`); udhcpc on the provisioning LAN gets a lease from
/// the provisioning pool, its answers leaving through the interface they arrived on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_all_interfaces_dhcp_answers_only_on_the_lan_of_a_subnet() {
    use std::process::Stdio;
    let ip = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .expect("ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let mut lab = crate::support::netns::NetLab::new("10.81.0.1/24", "52:54:00:4f:01:01");
    let mgmt = ExtraNs(format!("{}m", lab.cli));
    let (srv_m, cli_m) = (format!("{}m", lab.srv_if), format!("{}m", lab.cli_if));
    ip(&["netns", "add", &mgmt.0]);
    ip(&[
        "link", "add", &srv_m, "netns", &lab.srv, "type", "veth", "peer", "name", &cli_m, "netns",
        &mgmt.0,
    ]);
    ip(&["-n", &lab.srv, "addr", "add", "10.82.0.1/24", "dev", &srv_m]);
    ip(&[
        "-n",
        &mgmt.0,
        "link",
        "set",
        &cli_m,
        "address",
        "52:54:00:4f:02:01",
    ]);
    for (ns, dev) in [(&lab.srv, &srv_m), (&mgmt.0, &cli_m)] {
        ip(&["-n", ns, "link", "set", "lo", "up"]);
        ip(&["-n", ns, "link", "set", dev, "up"]);
    }
    // Plinth's default route leads to the management LAN, as on a server whose uplink it is.
    ip(&[
        "-n",
        &lab.srv,
        "route",
        "add",
        "default",
        "via",
        "10.82.0.254",
        "dev",
        &srv_m,
    ]);
    let dir = tempfile::tempdir().expect("tmp");
    crate::support::write_key(&dir.path().join("secret.key"));
    let config = dir.path().join("plinth.toml");
    std::fs::write(
        &config,
        format!(
            r#"data_dir = "{data}"
[http]
listen = "10.81.0.1:8080"
[secrets]
key_file = "{key}"
[dhcp]
enabled = true
interfaces = []
boot_url = "http://10.81.0.1:8080"
[[dhcp.subnet]]
cidr = "10.81.0.0/24"
mode = "authoritative"
server_ip = "10.81.0.1"
pool = ["10.81.0.100-10.81.0.150"]
routers = ["10.81.0.1"]
lease_seconds = 600
"#,
            data = dir.path().join("data").display(),
            key = dir.path().join("secret.key").display(),
        ),
    )
    .expect("config");
    let mut cmd = lab.cmd(&lab.srv.clone(), BIN);
    cmd.args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = lab.spawn(cmd);
    crate::support::lan::wait_for_line(child, "serving HTTP on", Duration::from_secs(60));
    let udhcpc = |ns: &str, ifname: &str| -> (bool, String) {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns, "busybox", "udhcpc", "-i", ifname])
            .args(["-n", "-q", "-f", "-t", "3", "-T", "1", "-A", "1"])
            .args(["-s", "/bin/true"])
            .output()
            .expect("udhcpc");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let no_subnet = || -> (f64, String) {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &lab.srv, "curl", "-sf", "--max-time", "20"])
            .arg("http://10.81.0.1:8080/metrics")
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let dhcp: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("plinth_dhcp_"))
            .collect();
        let n = dhcp
            .iter()
            .find(|l| l.starts_with("plinth_dhcp_dropped_total{reason=\"no_subnet\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0);
        (n, dhcp.join("\n"))
    };
    let (got, text) = udhcpc(&mgmt.0, &cli_m);
    assert!(!got, "the management LAN got a lease: {text}");
    let (refused, dhcp) = no_subnet();
    assert!(
        refused >= 1.0,
        "the management LAN's DISCOVERs reached Plinth: {dhcp}"
    );
    let (got, text) = udhcpc(&lab.cli, &lab.cli_if);
    assert!(got, "the provisioning LAN got no lease: {text}");
    assert!(
        text.contains("lease of 10.81.0.1"),
        "from the provisioning pool: {text}"
    );
    lab.stop_all();
    drop(mgmt);
}
