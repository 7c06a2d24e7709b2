//! A small Ethernet segment for tests with several DHCP peers: one namespace holds a Linux bridge
//! (the "switch"), every host is its own namespace plugged into it with a veth pair. Everything is
//! created by the test and deleted on drop: processes first (SIGKILL by PID, then reaped), then
//! the namespaces, which takes their veths and the bridge with them.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Run `ip` with `args`; panics with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One host on the segment.
#[derive(Clone, Debug)]
pub struct Host {
    /// Namespace name.
    pub ns: String,
    /// Its interface on the segment.
    pub ifname: String,
}

/// A bridge namespace and the hosts plugged into it.
pub struct Lan {
    tag: String,
    switch: String,
    hosts: Vec<Host>,
    children: Vec<Child>,
}

impl Lan {
    /// An empty segment; `tag` (a few letters) keeps names of parallel tests apart.
    pub fn new(tag: &str) -> Lan {
        let n = std::process::id() % 10_000 * 100 + SEQ.fetch_add(1, Ordering::SeqCst) % 100;
        let tag = format!("{tag}{n}");
        let switch = format!("pl-{tag}-sw");
        ip(&["netns", "add", &switch]);
        let lan = Lan {
            tag,
            switch,
            hosts: Vec::new(),
            children: Vec::new(),
        };
        ip(&["-n", &lan.switch, "link", "add", "br0", "type", "bridge"]);
        // Forward at once: no STP listening delay on the test segment.
        ip(&[
            "-n",
            &lan.switch,
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ]);
        ip(&["-n", &lan.switch, "link", "set", "br0", "up"]);
        lan
    }

    /// Plug a new host (namespace) into the segment with the given addresses (CIDR notation, may be
    /// empty) and MAC (None: random).
    pub fn host(&mut self, addrs: &[&str], mac: Option<&str>) -> Host {
        let i = self.hosts.len();
        let h = Host {
            ns: format!("pl-{}-h{i}", self.tag),
            ifname: format!("eth{i}"),
        };
        let port = format!("p{i}");
        ip(&["netns", "add", &h.ns]);
        ip(&[
            "link",
            "add",
            &h.ifname,
            "netns",
            &h.ns,
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &self.switch,
        ]);
        ip(&["-n", &self.switch, "link", "set", &port, "master", "br0"]);
        ip(&["-n", &self.switch, "link", "set", &port, "up"]);
        if let Some(m) = mac {
            ip(&["-n", &h.ns, "link", "set", &h.ifname, "address", m]);
        }
        for a in addrs {
            ip(&["-n", &h.ns, "addr", "add", a, "dev", &h.ifname]);
        }
        ip(&["-n", &h.ns, "link", "set", "lo", "up"]);
        ip(&["-n", &h.ns, "link", "set", &h.ifname, "up"]);
        self.hosts.push(h.clone());
        h
    }

    /// Plug `host` (a namespace of another segment) into this one too, as interface `ifname`
    /// with `addrs`. The veth goes with the namespaces on drop.
    pub fn plug(&mut self, host: &Host, ifname: &str, addrs: &[&str]) {
        let port = format!("x{}", self.hosts.len());
        ip(&[
            "link",
            "add",
            ifname,
            "netns",
            &host.ns,
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &self.switch,
        ]);
        ip(&["-n", &self.switch, "link", "set", &port, "master", "br0"]);
        ip(&["-n", &self.switch, "link", "set", &port, "up"]);
        for a in addrs {
            ip(&["-n", &host.ns, "addr", "add", a, "dev", ifname]);
        }
        ip(&["-n", &host.ns, "link", "set", ifname, "up"]);
    }

    /// A command that runs inside `host`'s namespace.
    pub fn cmd(&self, host: &Host, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &host.ns, program]);
        c
    }

    /// Start a long-running process; it is killed (by PID) on drop. Returns its index.
    pub fn spawn(&mut self, mut cmd: Command) -> usize {
        let child = cmd.stdin(Stdio::null()).spawn().expect("spawn in netns");
        self.children.push(child);
        self.children.len() - 1
    }

    /// The child started as number `idx`.
    pub fn child(&mut self, idx: usize) -> &mut Child {
        &mut self.children[idx]
    }

    /// Is child `idx` still running?
    pub fn alive(&mut self, idx: usize) -> bool {
        matches!(self.children[idx].try_wait(), Ok(None))
    }

    /// SIGKILL and reap every process started so far.
    pub fn stop_all(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.children.clear();
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        self.stop_all();
        for h in &self.hosts {
            let _ = Command::new("ip").args(["netns", "del", &h.ns]).status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.switch])
            .status();
    }
}

/// Follow a child's stderr on a thread: wait (bounded) for a line containing `needle` and return
/// it; keep draining afterwards so the child never blocks on a full pipe. Lines are echoed when
/// PLINTH_TEST_VERBOSE is set; lines containing "panicked" are always echoed.
pub fn wait_for_line(child: &mut Child, needle: &str, timeout: Duration) -> String {
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    let wanted = needle.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(&wanted) {
                let _ = tx.send(line.clone());
            }
            if std::env::var_os("PLINTH_TEST_VERBOSE").is_some() || line.contains("panicked") {
                eprintln!("peer: {line}");
            }
        }
    });
    rx.recv_timeout(timeout)
        .unwrap_or_else(|_| panic!("no line containing `{needle}` within {timeout:?}"))
}

impl Lan {
    /// Plug the test's own (root) namespace into the segment with `cidr`, so processes on the
    /// segment can reach services the test runs or forwards. The veth goes with the switch
    /// namespace on drop.
    pub fn uplink(&mut self, cidr: &str) -> String {
        let name = format!("pl{}u", self.tag);
        let port = "pu";
        ip(&[
            "link",
            "add",
            &name,
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            &self.switch,
        ]);
        ip(&["-n", &self.switch, "link", "set", port, "master", "br0"]);
        ip(&["-n", &self.switch, "link", "set", port, "up"]);
        ip(&["addr", "add", cidr, "dev", &name]);
        ip(&["link", "set", &name, "up"]);
        name
    }
}

/// Forward TCP connections from `listen` (an address of the uplink) to `upstream`, on the test's
/// runtime; returns the bound address. Lets processes in namespaces reach a database that listens
/// on the host's loopback.
pub async fn tcp_forward(
    listen: std::net::Ipv4Addr,
    upstream: String,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind((listen, 0))
        .await
        .expect("bind forwarder");
    let addr = l.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = l.accept().await {
            let up = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(up).await {
                    // Small protocol messages: without this, Nagle and delayed ACKs add ~40 ms
                    // to every database round trip.
                    let _ = inbound.set_nodelay(true);
                    let _ = out.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    (addr, task)
}

/// `scheme://user@host:port/db?q` with host:port replaced; and the original host:port.
pub fn rehost_url(url: &str, to: std::net::SocketAddr) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("scheme://");
    let (auth, after) = match rest.split_once('@') {
        Some((a, b)) => (format!("{a}@"), b),
        None => (String::new(), rest),
    };
    let cut = after.find(['/', '?']).unwrap_or(after.len());
    let hostport = &after[..cut];
    let hostport = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:5432")
    };
    (format!("{scheme}://{auth}{to}{}", &after[cut..]), hostport)
}
