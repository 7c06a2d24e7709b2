//! Network namespaces for tests: a server namespace and a client namespace joined by a veth pair,
//! created by the test and deleted (with every process started in them, by PID) on drop.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static SEQ: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces and a veth pair: `srv_if` (with `srv_addr`) in `srv`, `cli_if` in `cli`.
pub struct NetLab {
    pub srv: String,
    pub cli: String,
    pub srv_if: String,
    pub cli_if: String,
    children: Vec<Child>,
}

impl NetLab {
    /// `srv_cidr` e.g. "10.77.0.1/24"; `cli_mac` the client NIC's MAC.
    pub fn new(srv_cidr: &str, cli_mac: &str) -> NetLab {
        let n = std::process::id() % 100_000 * 100 + SEQ.fetch_add(1, Ordering::SeqCst) % 100;
        let lab = NetLab {
            srv: format!("plinth-s{n}"),
            cli: format!("plinth-c{n}"),
            srv_if: format!("pls{n}"),
            cli_if: format!("plc{n}"),
            children: Vec::new(),
        };
        ip(&["netns", "add", &lab.srv]);
        ip(&["netns", "add", &lab.cli]);
        ip(&[
            "link",
            "add",
            &lab.srv_if,
            "netns",
            &lab.srv,
            "type",
            "veth",
            "peer",
            "name",
            &lab.cli_if,
            "netns",
            &lab.cli,
        ]);
        ip(&["-n", &lab.srv, "addr", "add", srv_cidr, "dev", &lab.srv_if]);
        ip(&[
            "-n",
            &lab.cli,
            "link",
            "set",
            &lab.cli_if,
            "address",
            cli_mac,
        ]);
        for (ns, dev) in [(&lab.srv, &lab.srv_if), (&lab.cli, &lab.cli_if)] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        lab
    }

    /// A command that runs inside namespace `ns`.
    pub fn cmd(&self, ns: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]);
        c
    }

    /// Start a long-running process in a namespace, its stdin from /dev/null; it is killed on
    /// drop.
    pub fn spawn(&mut self, mut cmd: Command) -> &mut Child {
        cmd.stdin(Stdio::null());
        self.spawn_as_is(cmd)
    }

    /// Start a long-running process in a namespace with the stdin `cmd` was given (a pipe the
    /// test holds, for a process that runs until its stdin closes); it is killed on drop.
    pub fn spawn_as_is(&mut self, mut cmd: Command) -> &mut Child {
        let child = cmd.spawn().expect("spawn in netns");
        self.children.push(child);
        self.children.last_mut().expect("child")
    }

    /// Kill the processes started so far (by PID) and wait for them.
    pub fn stop_all(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.children.clear();
    }

    /// SIGKILL one process started earlier (index in start order).
    pub fn kill9(&mut self, idx: usize) {
        if let Some(c) = self.children.get_mut(idx) {
            let _ = Command::new("kill")
                .args(["-9", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }

    /// Change the client NIC's MAC.
    pub fn set_client_mac(&self, mac: &str) {
        ip(&["-n", &self.cli, "link", "set", &self.cli_if, "down"]);
        ip(&["-n", &self.cli, "link", "set", &self.cli_if, "address", mac]);
        ip(&["-n", &self.cli, "link", "set", &self.cli_if, "up"]);
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        self.stop_all();
        for ns in [&self.srv, &self.cli] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
