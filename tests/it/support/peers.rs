//! Real DHCP peers around a Plinth process: Plinth itself started in a namespace (its HTTP port read
//! back from its announcement), perfdhcp runs with their parsed reports, `/metrics` scraped from
//! inside the namespace, the lease table read straight from the database, and a UDP agent: this
//! test binary re-executed inside a namespace, holding one socket and speaking a line protocol on
//! stdin/stdout, so packets built with dhcproto in the test go out from a namespace's interface.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::Duration;

use super::lan::{wait_for_line, Host, Lan};

pub const BIN: &str = env!("CARGO_BIN_EXE_plinth");

/// Environment variable that turns the re-executed test binary (`support::reexec`) into the agent.
pub const AGENT_ENV: &str = "PLINTH_NETNS_AGENT";

/// A Plinth process on the segment.
pub struct Plinth {
    pub idx: usize,
    pub http_port: u16,
    pub host: Host,
}

/// Write a config and start `plinth serve` in `host`; waits (bounded) for its announcement.
pub fn start_plinth(lan: &mut Lan, host: &Host, dir: &Path, db_url: &str, dhcp: &str) -> Plinth {
    std::fs::create_dir_all(dir).expect("dir");
    // A key already there (instances sharing one database share their key) is kept.
    if !dir.join("secret.key").exists() {
        super::write_key(&dir.join("secret.key"));
    }
    let cfg = format!(
        "data_dir = \"{data}\"\n[database]\nurl = \"{db_url}\"\nmax_connections = 8\n[http]\nlisten = \"127.0.0.1:0\"\n\
         [secrets]\nkey_file = \"{key}\"\n[dhcp]\nenabled = true\ninterfaces = [\"{ifname}\"]\n{dhcp}\n",
        data = dir.display(),
        key = dir.join("secret.key").display(),
        ifname = host.ifname,
    );
    let path = dir.join("plinth.toml");
    std::fs::write(&path, cfg).expect("config");
    let mut cmd = lan.cmd(host, BIN);
    cmd.args(["serve", "--config", path.to_str().expect("utf-8 path")])
        .env(
            "RUST_LOG",
            std::env::var("PLINTH_PEER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let idx = lan.spawn(cmd);
    let line = wait_for_line(lan.child(idx), "serving HTTP on", Duration::from_secs(60));
    let port = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP port in `{line}`"));
    Plinth {
        idx,
        http_port: port,
        host: host.clone(),
    }
}

/// `GET /metrics` from inside the namespace; the `plinth_dhcp_*`, `plinth_store_commit*` and
/// `plinth_ra_*` samples by full name with labels.
pub fn metrics(lan: &Lan, p: &Plinth) -> HashMap<String, f64> {
    let out = lan
        .cmd(&p.host, "curl")
        .args([
            "-sf",
            "--max-time",
            "10",
            &format!("http://127.0.0.1:{}/metrics", p.http_port),
        ])
        .output()
        .expect("curl");
    assert!(out.status.success(), "GET /metrics failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            ["plinth_dhcp_", "plinth_store_commit", "plinth_ra_"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// One sample, 0 when absent.
pub fn sample(m: &HashMap<String, f64>, name: &str, label: &str, value: &str) -> f64 {
    m.get(&format!("{name}{{{label}=\"{value}\"}}"))
        .copied()
        .unwrap_or(0.0)
}

/// A perfdhcp run's figures.
#[derive(Debug, Default)]
pub struct PerfReport {
    pub exit: i32,
    /// Per exchange ("DISCOVER-OFFER", "REQUEST-ACK"): field -> value.
    pub stats: HashMap<String, HashMap<String, String>>,
    /// (client id, address) of every ACK, from `-x l` (perfdhcp leaves the id empty for v4).
    pub acked: Vec<(String, Ipv4Addr)>,
    pub text: String,
}

impl PerfReport {
    pub fn num(&self, exchange: &str, field: &str) -> f64 {
        self.stats
            .get(exchange)
            .and_then(|s| s.get(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("perfdhcp report lacks {exchange}/{field}:\n{}", self.text))
    }
}

/// Parse perfdhcp's final report.
pub fn parse_perfdhcp(text: &str, exit: i32) -> PerfReport {
    let mut r = PerfReport {
        exit,
        text: text.to_string(),
        ..Default::default()
    };
    let mut section = String::new();
    let mut leases = false;
    for line in text.lines() {
        let l = line.trim();
        if let Some(name) = l
            .strip_prefix("***Statistics for: ")
            .and_then(|s| s.strip_suffix("***"))
        {
            section = name.to_string();
            leases = false;
            continue;
        }
        if let Some(name) = l
            .strip_prefix("***Leases for ")
            .and_then(|s| s.strip_suffix("***"))
        {
            section = name.to_string();
            leases = section == "REQUEST-ACK";
            continue;
        }
        if l.starts_with("***") {
            section.clear();
            leases = false;
            continue;
        }
        if leases {
            if let Some((id, addr)) = l.split_once(',') {
                if let Ok(ip) = addr.split(',').next().unwrap_or("").parse() {
                    r.acked.push((id.to_string(), ip));
                }
            }
            continue;
        }
        if section.is_empty() {
            continue;
        }
        if let Some((k, v)) = l.split_once(':') {
            r.stats
                .entry(section.clone())
                .or_default()
                .insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    r
}

/// Run perfdhcp in `host` with `args` (bounded by `limit`); its parsed report.
pub fn perfdhcp(lan: &Lan, host: &Host, args: &[&str], limit: Duration) -> PerfReport {
    let mut cmd = lan.cmd(host, "timeout");
    cmd.arg("--signal=INT")
        .arg(format!("{}", limit.as_secs().max(1)))
        .arg("/usr/sbin/perfdhcp")
        .args(args)
        .stdin(Stdio::null());
    let out = cmd.output().expect("perfdhcp runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_perfdhcp(&text, out.status.code().unwrap_or(-1))
}

/// One lease row as stored.
#[derive(Clone, Debug)]
pub struct LeaseRow {
    pub ip: Ipv4Addr,
    pub mac: String,
    pub state: String,
    pub circuit: Option<String>,
    pub remote: Option<String>,
    pub giaddr: Option<String>,
}

/// Every row of `dhcp_leases`.
pub async fn lease_rows(url: &str) -> Vec<LeaseRow> {
    use sqlx::Row;
    const Q: &str =
        "SELECT ip, mac, state, relay_circuit_id, relay_remote_id, giaddr FROM dhcp_leases";
    macro_rules! rows {
        ($pool:expr) => {{
            let pool = $pool;
            let rows = sqlx::query(Q).fetch_all(&pool).await.expect("lease rows");
            pool.close().await;
            rows.iter()
                .map(|r| LeaseRow {
                    ip: Ipv4Addr::from(
                        u32::try_from(r.get::<i64, _>("ip")).expect("ip fits in u32"),
                    ),
                    mac: r.get("mac"),
                    state: r.get("state"),
                    circuit: r.get("relay_circuit_id"),
                    remote: r.get("relay_remote_id"),
                    giaddr: r.get("giaddr"),
                })
                .collect()
        }};
    }
    if url.starts_with("sqlite:") {
        rows!(sqlx::SqlitePool::connect(url).await.expect("sqlite"))
    } else {
        rows!(sqlx::PgPool::connect(url).await.expect("postgres"))
    }
}

/// Bound leases: each address once (the primary key), each MAC once, as a MAC -> address map.
pub fn bound_by_mac(rows: &[LeaseRow]) -> HashMap<String, Ipv4Addr> {
    let mut by_mac = HashMap::new();
    for r in rows.iter().filter(|r| r.state == "bound") {
        if let Some(other) = by_mac.insert(r.mac.clone(), r.ip) {
            panic!("{} holds two bound leases: {other} and {}", r.mac, r.ip);
        }
    }
    by_mac
}

/// A UDP socket living in a namespace, driven from the test.
pub struct Agent {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Agent {
    /// Start the agent in `host`: one UDP socket on 0.0.0.0:`port`, SO_BROADCAST, bound to the
    /// host's interface.
    pub fn start(lan: &Lan, host: &Host, port: u16) -> Agent {
        let exe = std::env::current_exe().expect("test binary");
        let mut cmd = lan.cmd(host, exe.to_str().expect("utf-8 path"));
        cmd.args(super::reexec::ARGS)
            .env(AGENT_ENV, format!("{} {port}", host.ifname))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("agent starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut a = Agent {
            child,
            stdin,
            stdout,
        };
        assert_eq!(a.reply(), "ready", "agent did not come up");
        a
    }

    fn reply(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("agent output");
            assert!(n > 0, "agent exited");
            if let Some(rest) = line.trim_end().strip_prefix("@@ ") {
                return rest.to_string();
            }
        }
    }

    /// Send one datagram.
    pub fn send(&mut self, to: SocketAddr, bytes: &[u8]) {
        writeln!(self.stdin, "send {to} {}", hex::encode(bytes)).expect("to agent");
        let r = self.reply();
        assert_eq!(r, "ok", "send to {to}: {r}");
    }

    /// The next datagram within `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Option<(SocketAddr, Vec<u8>)> {
        writeln!(self.stdin, "recv {}", timeout.as_millis()).expect("to agent");
        let r = self.reply();
        let rest = r.strip_prefix("pkt ")?;
        let (from, hexed) = rest.split_once(' ').expect("pkt FROM HEX");
        Some((
            from.parse().expect("from"),
            hex::decode(hexed).expect("hex"),
        ))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent side: runs inside the namespace (entered through `support::reexec`).
pub fn agent_main(spec: &str) {
    use socket2::{Domain, Protocol, Socket, Type};
    let (ifname, port) = spec.split_once(' ').expect("IFNAME PORT");
    let port: u16 = port.parse().expect("port");
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
    s.set_reuse_address(true).expect("reuse");
    s.set_broadcast(true).expect("broadcast");
    s.bind_device(Some(ifname.as_bytes()))
        .expect("SO_BINDTODEVICE");
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())
        .expect("bind");
    let sock: std::net::UdpSocket = s.into();
    let out = std::io::stdout();
    let say = |m: &str| {
        let mut o = out.lock();
        let _ = writeln!(o, "@@ {m}");
        let _ = o.flush();
    };
    say("ready");
    let mut buf = vec![0u8; 2048];
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("send") => {
                let to: SocketAddr = parts.next().and_then(|t| t.parse().ok()).expect("to");
                let bytes = hex::decode(parts.next().unwrap_or("")).expect("hex");
                match sock.send_to(&bytes, to) {
                    Ok(_) => say("ok"),
                    Err(e) => say(&format!("err {e}")),
                }
            }
            Some("recv") => {
                let ms: u64 = parts.next().and_then(|t| t.parse().ok()).expect("ms");
                sock.set_read_timeout(Some(Duration::from_millis(ms.max(1))))
                    .expect("timeout");
                match sock.recv_from(&mut buf) {
                    Ok((n, from)) => say(&format!("pkt {from} {}", hex::encode(&buf[..n]))),
                    Err(_) => say("timeout"),
                }
            }
            _ => say("err unknown command"),
        }
    }
}

/// A temporary directory for one peer's files.
pub fn dir_in(base: &Path, name: &str) -> PathBuf {
    let d = base.join(name);
    std::fs::create_dir_all(&d).expect("dir");
    d
}
