//! Plinth's Talos API client against the Talos API service of the tests on loopback: gRPC over
//! mutual TLS with certificates signed from a cluster's OS CA, the node's certificate verified and
//! fingerprinted, roles enforced by the node, Bootstrap refused the second time as Talos does,
//! foreign certificates on either side refused, faults and slow answers turned into errors that
//! name node, call and cause, retries only where they are safe.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use plinth::domain::Role;
use plinth::service::ports::talos_api::{
    BootstrapOptions, ClusterNodes, StatusCode, TalosApi, TalosApiFailure, TalosCredentials,
    TalosNode as Node,
};
use plinth::talos::generate::{generate, GenerateOptions};
use plinth::talos::pki::{talos_client_cert, CaPem};
use plinth::talos::secrets::SecretsBundle;
use plinth::talos::TalosVersion;
use plinth::talos_api::{ClientSettings, TalosApiClient};
use tonic::Code;

use crate::support::talos_node::{NodeOptions, SharedCluster, TalosNode};

/// A bundle, its OS CA, and the machine config of a node of each role.
pub struct Lab {
    pub bundle: SecretsBundle,
    pub os: CaPem,
}

impl Lab {
    pub fn new() -> Lab {
        let bundle = SecretsBundle::generate().expect("bundle");
        let os = CaPem::from_base64(
            bundle.certs.os.crt.as_deref().expect("crt"),
            &bundle.certs.os.key,
            "os",
        )
        .expect("os ca");
        Lab { bundle, os }
    }

    pub fn config(&self, role: Role) -> String {
        let opts =
            GenerateOptions::new("lab", "https://10.0.0.10:6443", TalosVersion::new(1, 11, 6));
        generate(&self.bundle, role, &opts)
            .expect("generate")
            .to_yaml()
            .expect("yaml")
    }

    pub fn named(hostname: &str) -> NodeOptions {
        NodeOptions {
            hostname: Some(hostname.into()),
            ..Default::default()
        }
    }

    pub fn creds(&self, role: &str) -> Arc<TalosCredentials> {
        let c = talos_client_cert(&self.os, role, Utc::now(), chrono::Duration::minutes(10))
            .expect("client cert");
        Arc::new(TalosCredentials {
            ca_pem: c.ca_pem,
            cert_pem: c.cert_pem,
            key_pem: c.key_pem,
            role: role.into(),
            expires_at: c.not_after,
        })
    }

    pub fn node(&self, addr: SocketAddr, role: &str) -> Node {
        Node {
            endpoint: addr,
            credentials: self.creds(role),
        }
    }
}

fn quick() -> TalosApiClient {
    TalosApiClient::new(ClientSettings {
        connect_timeout: Duration::from_secs(2),
        call_timeout: Duration::from_secs(2),
        attempts: 3,
        backoff: Duration::from_millis(50),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_bootstrap_services_and_etcd_over_mutual_tls() {
    let lab = Lab::new();
    let cluster = SharedCluster::default();
    let cp = TalosNode::start(
        "127.0.0.2:0".parse().expect("addr"),
        &lab.config(Role::ControlPlane),
        Lab::named("cp-1"),
        cluster.clone(),
    )
    .await;
    let api = quick();
    let admin = lab.node(cp.addr, "os:admin");

    let v = api.version(&admin).await.expect("version");
    assert_eq!(v.tag, "v1.11.6");
    assert_eq!(
        v.cert_sha256, cp.cert_sha256,
        "the fingerprint of what the node presented"
    );

    // Before the bootstrap etcd waits; the members cannot be listed.
    let services = api.services(&admin).await.expect("services");
    let etcd = services.iter().find(|s| s.id == "etcd").expect("etcd");
    assert_eq!((etcd.state.as_str(), etcd.healthy), ("Preparing", None));
    let e = api.etcd_members(&admin).await.expect_err("no etcd yet");
    assert_eq!(
        e.failure,
        TalosApiFailure::Refused(StatusCode::Unavailable),
        "{e}"
    );

    // A reader may look but not bootstrap (the node's RBAC, as machined's).
    let reader = lab.node(cp.addr, "os:reader");
    api.version(&reader).await.expect("reader reads");
    let e = api
        .bootstrap(&reader, BootstrapOptions::default())
        .await
        .expect_err("reader cannot bootstrap");
    assert!(e.is_refused(StatusCode::PermissionDenied), "{e}");
    assert_eq!(cp.bootstraps(), 0);

    api.bootstrap(&admin, BootstrapOptions::default())
        .await
        .expect("bootstrap");
    assert_eq!(cp.bootstraps(), 1);
    // The second is refused the way Talos refuses it: the data directory is not empty.
    let e = api
        .bootstrap(&admin, BootstrapOptions::default())
        .await
        .expect_err("second bootstrap");
    assert!(e.is_refused(StatusCode::AlreadyExists), "{e}");
    assert!(e.cause.contains("etcd data directory is not empty"), "{e}");
    assert!(e.request_sent);
    assert_eq!(cp.bootstraps(), 1);

    let members = api.etcd_members(&admin).await.expect("members");
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].hostname, "cp-1");
    let st = api.etcd_status(&reader).await.expect("status");
    assert_eq!(st.leader, members[0].id);
    let services = api.services(&reader).await.expect("services");
    let etcd = services.iter().find(|s| s.id == "etcd").expect("etcd");
    assert_eq!((etcd.state.as_str(), etcd.healthy), ("Running", Some(true)));

    // Talos' cluster check over the one node passes, line by line.
    let check = api
        .cluster_health(
            &reader,
            &ClusterNodes {
                control_planes: vec!["127.0.0.2".into()],
                workers: vec![],
            },
            Duration::from_secs(5),
        )
        .await
        .expect("health");
    assert!(check.passed, "{check:?}");
    assert!(
        check
            .progress
            .iter()
            .any(|l| l == "waiting for etcd to be healthy: OK"),
        "{check:?}"
    );

    // Every call carried the role it was made with; nothing else reached the node.
    let calls = cp.calls();
    assert!(calls
        .iter()
        .any(|(m, r)| m.ends_with("/Bootstrap") && r == &["os:reader".to_string()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_certificates_are_refused_on_both_sides() {
    let lab = Lab::new();
    // Something listening on the port with a certificate of another CA.
    let foreign = TalosNode::start(
        "127.0.0.3:0".parse().expect("addr"),
        &lab.config(Role::ControlPlane),
        NodeOptions {
            foreign: true,
            ..Default::default()
        },
        SharedCluster::default(),
    )
    .await;
    let api = quick();
    let e = api
        .version(&lab.node(foreign.addr, "os:admin"))
        .await
        .expect_err("foreign server certificate");
    assert_eq!(e.failure, TalosApiFailure::Untrusted, "{e}");
    assert!(!e.request_sent);
    let text = e.to_string();
    assert!(
        text.contains("machine.MachineService/Version")
            && text.contains(&foreign.addr.to_string())
            && text.contains("not trusted"),
        "names node, call and cause: {text}"
    );

    // A genuine node refuses a client whose certificate another cluster's CA signed.
    let cluster = SharedCluster::default();
    let ours = TalosNode::start(
        "127.0.0.3:0".parse().expect("addr"),
        &lab.config(Role::ControlPlane),
        Lab::named("cp-1"),
        cluster.clone(),
    )
    .await;
    let other = Lab::new();
    let mut creds = (*other.creds("os:admin")).clone();
    creds.ca_pem = lab.os.crt.clone();
    let e = api
        .version(&Node {
            endpoint: ours.addr,
            credentials: Arc::new(creds),
        })
        .await
        .expect_err("foreign client certificate");
    assert!(
        matches!(
            e.failure,
            TalosApiFailure::Untrusted | TalosApiFailure::Unreachable
        ),
        "{e}"
    );
    assert!(ours.rejected_handshakes() >= 1);
    assert!(ours.calls().is_empty(), "{:?}", ours.calls());

    // A worker (its certificate from the control plane's trustd) cannot bootstrap: refused
    // before anything happens.
    let worker = TalosNode::start(
        "127.0.0.3:0".parse().expect("addr"),
        &lab.config(Role::Worker),
        Lab::named("w-1"),
        cluster,
    )
    .await;
    let e = api
        .bootstrap(
            &lab.node(worker.addr, "os:admin"),
            BootstrapOptions::default(),
        )
        .await
        .expect_err("worker");
    assert!(e.is_refused(StatusCode::FailedPrecondition), "{e}");
    assert_eq!(worker.bootstrap_refusals().len(), 1);
    assert_eq!(ours.bootstraps() + worker.bootstraps(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_failing_nodes_time_out_and_reads_are_retried() {
    let lab = Lab::new();
    let node = TalosNode::start(
        "127.0.0.4:0".parse().expect("addr"),
        &lab.config(Role::ControlPlane),
        Lab::named("cp-1"),
        SharedCluster::default(),
    )
    .await;
    let api = quick();
    let admin = lab.node(node.addr, "os:admin");

    // Two unavailable answers, then a good one: a read is retried with back-off.
    node.fail(
        "ServiceList",
        2,
        Code::Unavailable,
        "machined is restarting",
    );
    api.services(&admin).await.expect("third attempt");
    // Three: it gives up, saying how often it tried.
    node.fail(
        "ServiceList",
        3,
        Code::Unavailable,
        "machined is restarting",
    );
    let e = api.services(&admin).await.expect_err("three failures");
    assert!(e.cause.contains("after 3 attempts"), "{e}");
    assert!(e.cause.contains("machined is restarting"), "{e}");

    // A slow answer is a timeout, retried for reads...
    node.delay("Version", 1, Duration::from_secs(4));
    let v = api.version(&admin).await.expect("second attempt is quick");
    assert_eq!(v.tag, "v1.11.6");
    // ... never for Bootstrap once the request may have reached the node.
    node.delay("Bootstrap", 1, Duration::from_secs(4));
    let e = api
        .bootstrap(&admin, BootstrapOptions::default())
        .await
        .expect_err("slow bootstrap");
    assert_eq!(e.failure, TalosApiFailure::Timeout, "{e}");
    assert!(e.request_sent);
    let bootstraps = node
        .calls()
        .iter()
        .filter(|(m, _)| m.ends_with("/Bootstrap"))
        .count();
    assert_eq!(bootstraps, 1, "one attempt only");

    // Nothing listening: unreachable, the request never sent.
    let closed = std::net::TcpListener::bind("127.0.0.4:0").expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let e = api
        .bootstrap(&lab.node(addr, "os:admin"), BootstrapOptions::default())
        .await
        .expect_err("nothing there");
    assert_eq!(e.failure, TalosApiFailure::Unreachable, "{e}");
    assert!(!e.request_sent);
    assert!(
        e.cause.contains("after 3 attempts"),
        "connect failures are retried: {e}"
    );
}
