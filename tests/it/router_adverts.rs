//! IPv6 router advertisements of a subnet with `ipv6_ra` (`plinth::dhcp::ra`), against a real
//! router solicitation sender: `rdisc6` (Debian ndisc6) in a client namespace on the segment.
//! The advertisement must configure nothing (router lifetime 0, no DHCPv6 flags, no prefix) unless
//! prefixes are configured, must leave the client's kernel without an IPv6 default route, and
//! must be sent only on the interfaces Plinth serves DHCP on. Every namespace and process is
//! removed on drop (processes by PID); every wait is bounded.
//!
//! Needs root (namespaces, a raw ICMPv6 socket) and `rdisc6`.

use crate::support;

use std::time::{Duration, Instant};

use support::lan::{Host, Lan};
use support::peers::{metrics, sample, start_plinth};
use support::{Backend, TestDb};

const SUBNETS: &str = r#"boot_url = "http://10.77.0.1:8080"
[[dhcp.subnet]]
cidr = "10.77.0.0/24"
server_ip = "10.77.0.1"
pool = ["10.77.0.100-10.77.0.150"]
ipv6_ra = true
PREFIXES
[[dhcp.subnet]]
cidr = "10.77.1.0/24"
server_ip = "10.77.1.1"
pool = ["10.77.1.100-10.77.1.150"]
ipv6_ra = true
"#;

/// `rdisc6` on `host`'s interface: one solicitation, retried (the client's link-local address
/// may still be tentative at first), its output; bounded to about 12 s.
fn rdisc6(lan: &Lan, host: &Host, ifname: &str) -> (bool, String) {
    let out = lan
        .cmd(host, "rdisc6")
        .args(["-1", "-r", "6", "-w", "2000", ifname])
        .output()
        .expect("rdisc6 (Debian ndisc6)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A field of rdisc6's report, e.g. "Router lifetime".
fn field<'a>(report: &'a str, name: &str) -> Option<&'a str> {
    report
        .lines()
        .find(|l| l.trim_start().starts_with(name))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim())
}

fn ip6(lan: &Lan, host: &Host, args: &[&str]) -> String {
    let out = lan
        .cmd(host, "ip")
        .arg("-6")
        .args(args)
        .output()
        .expect("ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Wait (bounded) until `host`'s link-local address has passed duplicate address detection:
/// before that it cannot send (rdisc6's solicitation, Plinth's advertisement).
fn wait_link_local(lan: &Lan, host: &Host, ifname: &str) {
    let start = Instant::now();
    loop {
        let a = ip6(lan, host, &["addr", "show", "dev", ifname, "scope", "link"]);
        if a.contains("fe80::") && !a.contains("tentative") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no usable link-local address on {ifname}: {a}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn advertised(with_prefix: bool) {
    let tmp = tempfile::tempdir().expect("tmp");
    let db = TestDb::new(Backend::Sqlite).await;
    let mut lan = Lan::new(if with_prefix { "rap" } else { "ra" });
    let mut other = Lan::new("rao");
    let srv = lan.host(&["10.77.0.1/24"], None);
    let cli = lan.host(&[], None);
    // A second link of the server's, with an `ipv6_ra` subnet's address, that Plinth does not
    // serve DHCP on (start_plinth's `interfaces` names only the first).
    other.plug(&srv, "side0", &["10.77.1.1/24"]);
    let far = other.host(&[], None);
    let prefixes = if with_prefix {
        "ipv6_ra_prefixes = [\"fd00:77::/64\"]"
    } else {
        ""
    };
    let p = start_plinth(
        &mut lan,
        &srv,
        &tmp.path().join("p"),
        &db.url,
        &SUBNETS.replace("PREFIXES", prefixes),
    );

    wait_link_local(&lan, &srv, &srv.ifname);
    wait_link_local(&lan, &srv, "side0");
    wait_link_local(&lan, &cli, &cli.ifname);
    wait_link_local(&other, &far, &far.ifname);
    let (ok, report) = rdisc6(&lan, &cli, &cli.ifname);
    assert!(
        ok,
        "no router advertisement answered the solicitation:\n{report}"
    );
    assert_eq!(
        field(&report, "Router lifetime"),
        Some("0 (0x00000000) seconds"),
        "{report}"
    );
    assert_eq!(
        field(&report, "Stateful address conf."),
        Some("No"),
        "{report}"
    );
    assert_eq!(
        field(&report, "Stateful other conf."),
        Some("No"),
        "{report}"
    );
    let from = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("from "))
        .unwrap_or_else(|| panic!("no sender: {report}"));
    assert!(
        from.starts_with("fe80::"),
        "sent from a link-local address: {report}"
    );
    if with_prefix {
        assert_eq!(field(&report, "Prefix"), Some("fd00:77::/64"), "{report}");
        // The client's kernel configures an address from it (SLAAC), and still no route.
        let start = Instant::now();
        while !ip6(&lan, &cli, &["addr", "show", "dev", &cli.ifname]).contains("fd00:77:")
            && start.elapsed() < Duration::from_secs(15)
        {
            std::thread::sleep(Duration::from_millis(200));
        }
        let addrs = ip6(&lan, &cli, &["addr", "show", "dev", &cli.ifname]);
        assert!(addrs.contains("fd00:77:"), "SLAAC from the prefix: {addrs}");
    } else {
        assert_eq!(
            field(&report, "Prefix"),
            None,
            "no prefix unless configured: {report}"
        );
        let addrs = ip6(
            &lan,
            &cli,
            &["addr", "show", "dev", &cli.ifname, "scope", "global"],
        );
        assert!(addrs.trim().is_empty(), "no address from Plinth: {addrs}");
    }
    let routes = ip6(&lan, &cli, &["route", "show", "default"]);
    assert!(
        routes.trim().is_empty(),
        "no default route from Plinth: {routes}"
    );

    // The link Plinth does not serve DHCP on gets nothing, though its address is in a subnet
    // with ipv6_ra.
    let (ok, report) = rdisc6(&other, &far, &far.ifname);
    assert!(
        !ok,
        "a router advertisement on a link DHCP does not serve:\n{report}"
    );

    let m = metrics(&lan, &p);
    assert!(
        sample(&m, "plinth_ra_sent_total", "kind", "solicited") >= 1.0,
        "the answer is counted: {m:?}"
    );
    assert!(lan.alive(p.idx), "plinth still runs");
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_advertisements_answer_solicitations_and_configure_nothing() {
    advertised(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_advertisements_offer_configured_prefixes_only() {
    advertised(true).await;
}
