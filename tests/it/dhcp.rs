//! DHCP with real clients: Plinth runs as the authoritative server in a network namespace, busybox
//! `udhcpc` asks from another one over a veth pair, as BIOS PXE, UEFI PXE, UEFI HTTP boot, iPXE and
//! a plain client.

use crate::support::netns;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use netns::NetLab;
use plinth::domain::{Interface, MachineSpec};
use plinth::service::SecretBox;

const BIN: &str = env!("CARGO_BIN_EXE_plinth");

fn write_config(dir: &Path, iface: &str) -> std::path::PathBuf {
    let cfg = format!(
        r#"data_dir = "{data}"
[http]
listen = "127.0.0.1:0"
[secrets]
key_file = "{key}"
[dhcp]
enabled = true
interfaces = ["{iface}"]
boot_url = "http://10.77.0.1:8080"
[[dhcp.subnet]]
cidr = "10.77.0.0/24"
mode = "authoritative"
server_ip = "10.77.0.1"
pool = ["10.77.0.100-10.77.0.150"]
routers = ["10.77.0.1"]
dns = ["10.77.0.53"]
domain = "lab.test"
lease_seconds = 600
"#,
        data = dir.join("data").display(),
        key = dir.join("secret.key").display(),
    );
    crate::support::write_key(&dir.join("secret.key"));
    let p = dir.join("plinth.toml");
    std::fs::write(&p, cfg).expect("config");
    p
}

/// Start Plinth in the server namespace and wait for its announcement.
fn start_plinth(lab: &mut NetLab, config: &Path) {
    let mut cmd = lab.cmd(&lab.srv.clone(), BIN);
    cmd.args(["serve", "--config", config.to_str().expect("p")])
        .env("RUST_LOG", "plinth=debug,warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = lab.spawn(cmd);
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("serving HTTP on") {
                let _ = tx.send(line.clone());
            }
            if std::env::var_os("PLINTH_TEST_VERBOSE").is_some() {
                eprintln!("plinth: {line}");
            }
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("plinth starts");
    assert!(line.contains("DHCP pls") || line.contains(":67"), "{line}");
}

/// Run udhcpc once in the client namespace; the variables its script saw.
fn udhcpc(lab: &NetLab, dir: &Path, extra: &[&str]) -> Option<HashMap<String, String>> {
    let out = dir.join(format!("lease-{}.env", rand_suffix()));
    let script = dir.join("udhcpc.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$1\" = bound ] && env > {}\nexit 0\n",
            out.display()
        ),
    )
    .expect("script");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let status = lab
        .cmd(&lab.cli, "busybox")
        .args([
            "udhcpc",
            "-i",
            &lab.cli_if,
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
            script.to_str().expect("p"),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("udhcpc runs");
    if !status.success() {
        return None;
    }
    let text = std::fs::read_to_string(&out).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn rand_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

pub(crate) async fn register(data: &Path, key: &Path, hostname: &str, mac: &str, ip: Option<&str>) {
    let url = format!("sqlite://{}", data.join("plinth.db").display());
    std::fs::create_dir_all(data).expect("data dir");
    let store = plinth::store::open(&plinth::store::StoreOptions {
        url,
        max_connections: 1,
        migrate: true,
    })
    .await
    .expect("store");
    let inv = plinth::app::inventory(
        &store,
        SecretBox::from_text(&std::fs::read_to_string(key).expect("key")).expect("key"),
    );
    let spec = MachineSpec {
        hostname: Some(hostname.into()),
        interfaces: vec![Interface {
            mac: mac.parse().expect("mac"),
            ipv4: ip.map(|i| i.parse().expect("ip")),
            boot: true,
            name: None,
        }],
        ..Default::default()
    };
    inv.create(spec, "test").await.expect("register");
}

async fn leases_of(data: &Path, mac: &str) -> Vec<plinth::service::Lease> {
    let url = format!("sqlite://{}", data.join("plinth.db").display());
    let store = plinth::store::open(&plinth::store::StoreOptions {
        url,
        max_connections: 1,
        migrate: false,
    })
    .await
    .expect("store");
    store
        .leases
        .leases_of_mac(mac.parse().expect("mac"))
        .await
        .expect("leases")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udhcpc_gets_addresses_and_boot_files_per_firmware() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut lab = NetLab::new("10.77.0.1/24", "52:54:00:77:00:01");
    let config = write_config(dir.path(), &lab.srv_if);
    let data = dir.path().join("data");
    // A registered machine with a reserved address; the other MACs are unknown.
    register(
        &data,
        &dir.path().join("secret.key"),
        "cp-1",
        "52:54:00:77:00:01",
        Some("10.77.0.42"),
    )
    .await;
    start_plinth(&mut lab, &config);

    // UEFI x86-64 PXE, registered: its reserved address and ipxe.efi over TFTP.
    let env = udhcpc(
        &lab,
        dir.path(),
        &["-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007"],
    )
    .expect("lease");
    assert_eq!(env["ip"], "10.77.0.42");
    assert_eq!(
        env.get("boot_file").map(String::as_str),
        Some("ipxe.efi"),
        "{env:?}"
    );
    assert_eq!(env.get("siaddr").map(String::as_str), Some("10.77.0.1"));
    assert_eq!(env.get("serverid").map(String::as_str), Some("10.77.0.1"));
    assert_eq!(env.get("router").map(String::as_str), Some("10.77.0.1"));
    assert_eq!(env.get("dns").map(|d| d.trim()), Some("10.77.0.53"));
    assert_eq!(env.get("domain").map(String::as_str), Some("lab.test"));
    assert_eq!(env.get("lease").map(String::as_str), Some("600"));

    // Unknown machines: pool addresses, boot file by firmware.
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "52:54:00:77:00:02",
            &["-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000"],
            "undionly.kpxe",
        ),
        (
            "52:54:00:77:00:03",
            &["-V", "PXEClient:Arch:00011:UNDI:003000", "-x", "0x5d:000b"],
            "ipxe-arm64.efi",
        ),
        (
            "52:54:00:77:00:04",
            &["-V", "HTTPClient:Arch:00016:UNDI:003001", "-x", "0x5d:0010"],
            "http://10.77.0.1:8080/ipxe/ipxe.efi",
        ),
        (
            "52:54:00:77:00:05",
            &[
                "-V",
                "PXEClient:Arch:00007:UNDI:003016",
                "-x",
                "0x5d:0007",
                "-x",
                "0x4d:69505845",
            ],
            "http://10.77.0.1:8080/boot.ipxe",
        ),
    ];
    let mut pool_ips = Vec::new();
    for (mac, args, boot) in cases {
        lab.set_client_mac(mac);
        let env = udhcpc(&lab, dir.path(), args).unwrap_or_else(|| panic!("{mac} got no lease"));
        let ip: std::net::Ipv4Addr = env["ip"].parse().expect("ip");
        assert!(
            (100..=150).contains(&ip.octets()[3]) && ip.octets()[..3] == [10, 77, 0],
            "{mac}: {ip}"
        );
        assert_eq!(
            env.get("boot_file").map(String::as_str),
            Some(*boot),
            "{mac}: {env:?}"
        );
        pool_ips.push(ip);
    }
    let mut uniq = pool_ips.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(
        uniq.len(),
        pool_ips.len(),
        "no address given twice: {pool_ips:?}"
    );

    // A plain client (an installed OS) gets an address and no boot file.
    lab.set_client_mac("52:54:00:77:00:06");
    let env = udhcpc(&lab, dir.path(), &[]).expect("plain lease");
    assert!(!env.contains_key("boot_file"), "{env:?}");

    // Leases are durable: restart Plinth, and a known client keeps its address.
    lab.stop_all();
    start_plinth(&mut lab, &config);
    lab.set_client_mac("52:54:00:77:00:02");
    let env = udhcpc(
        &lab,
        dir.path(),
        &["-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000"],
    )
    .expect("lease again");
    assert_eq!(
        env["ip"].parse::<std::net::Ipv4Addr>().expect("ip"),
        pool_ips[0],
        "same address after a restart"
    );
    lab.stop_all();

    let leases = leases_of(&data, "52:54:00:77:00:02").await;
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].state, plinth::service::LeaseState::Bound);
    assert_eq!(leases[0].ip, pool_ips[0]);
    let reserved = leases_of(&data, "52:54:00:77:00:01").await;
    assert_eq!(reserved[0].ip.to_string(), "10.77.0.42");
}
