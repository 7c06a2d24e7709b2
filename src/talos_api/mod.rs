//! The Talos API client: gRPC (tonic, prost) over mutual TLS to a node's apid on TCP 50000,
//! implementing the `talos api` port of `crate::service::ports::talos_api`.
//!
//! Each call opens its own connection: TCP with a connect timeout, then TLS 1.2/1.3 (rustls,
//! ring) presenting the caller's client certificate and accepting the node only if its
//! certificate chains to the cluster's OS CA and names the node's address (as talosctl checks
//! it); the node's certificate is kept to report its fingerprint. The HTTP/2 connection is handed
//! to tonic already established, so a failure is classified where it happens: nothing answering
//! (unreachable), a foreign certificate (untrusted), a slow answer (timeout), an error status
//! (refused, with its code). Reads are retried with doubling back-off when the node is not
//! reachable; `Bootstrap` is retried only when the request cannot have reached the node.
//!
//! Calls go straight to the node (no `nodes` metadata, so apid does not proxy). Nothing is
//! written to disk and no key is logged. This module imports `crate::service::ports` (the trait
//! it implements) and `crate::talos` (certificate fingerprints); never `store`, `http` or a front
//! door.

pub mod proto;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint};

use crate::service::ports::talos_api::{
    BootstrapOptions, ClusterCheck, ClusterNodes, EtcdMember, EtcdMemberStatus, InstallOutcome,
    NodeVersion, ServiceStatus, SnapshotStream, StatusCode, TalosApi, TalosApiError,
    TalosApiFailure, TalosNode, UploadStream, INSTALL_LINES,
};
use proto::cluster::cluster_service_client::ClusterServiceClient;
use proto::common::Metadata;
use proto::machine::image_service_client::ImageServiceClient;
use proto::machine::lifecycle_service_client::LifecycleServiceClient;
use proto::machine::machine_service_client::MachineServiceClient;

/// Timeouts and retries of the client.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// TCP connect and TLS handshake, each.
    pub connect_timeout: Duration,
    /// One call, from request to the last byte of the answer (health checks add their wait).
    pub call_timeout: Duration,
    /// Attempts of a retried call (1: no retry).
    pub attempts: u32,
    /// Pause before the second attempt, doubled before each further one.
    pub backoff: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(20),
            attempts: 3,
            backoff: Duration::from_millis(500),
        }
    }
}

/// The gRPC client of Talos' apid.
#[derive(Clone, Debug, Default)]
pub struct TalosApiClient {
    settings: ClientSettings,
}

const VERSION: &str = "machine.MachineService/Version";
const BOOTSTRAP: &str = "machine.MachineService/Bootstrap";
const SERVICE_LIST: &str = "machine.MachineService/ServiceList";
const ETCD_MEMBER_LIST: &str = "machine.MachineService/EtcdMemberList";
const ETCD_STATUS: &str = "machine.MachineService/EtcdStatus";
const HEALTH_CHECK: &str = "cluster.ClusterService/HealthCheck";
const READ: &str = "machine.MachineService/Read";
const UPGRADE: &str = "machine.MachineService/Upgrade";
const REBOOT: &str = "machine.MachineService/Reboot";
const IMAGE_PULL: &str = "machine.ImageService/Pull";
const LIFECYCLE_UPGRADE: &str = "machine.LifecycleService/Upgrade";

/// The file whose content changes with every boot (what talosctl reads to tell a reboot).
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// Longest boot id read: it is a UUID; anything longer is not one.
const BOOT_ID_MAX: usize = 64;
/// Messages of a pull or an install read at most (a node streaming without end is cut off).
const STREAM_MESSAGES_MAX: usize = 100_000;

/// The containerd Talos keeps its own images in (`talosctl upgrade --namespace system`).
fn system_containerd() -> proto::common::ContainerdInstance {
    proto::common::ContainerdInstance {
        driver: proto::common::ContainerDriver::Containerd as i32,
        namespace: proto::common::ContainerdNamespace::NsSystem as i32,
    }
}
const ETCD_SNAPSHOT: &str = "machine.MachineService/EtcdSnapshot";
const ETCD_RECOVER: &str = "machine.MachineService/EtcdRecover";
/// The longest a snapshot upload (`EtcdRecover`) may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// An established connection: the channel and the node's certificate fingerprint.
struct Connection {
    channel: Channel,
    cert_sha256: String,
    /// Cuts the connection (every read and write fails from then on).
    cut: CutHandle,
}

/// Cuts a connection from outside: the HTTP/2 connection then fails and closes, so a call whose
/// request stream is under way ends with an error on the node's side, never with a clean end of
/// its stream (dropping a client-streaming call leaves hyper's body task sending to the end).
#[derive(Clone, Default)]
struct CutHandle(Arc<Mutex<CutState>>);

#[derive(Default)]
struct CutState {
    cut: bool,
    wakers: Vec<std::task::Waker>,
}

impl CutHandle {
    fn cut(&self) {
        if let Ok(mut s) = self.0.lock() {
            s.cut = true;
            for w in s.wakers.drain(..) {
                w.wake();
            }
        }
    }

    /// `Err` once cut; else remember who to wake.
    fn check(&self, cx: &std::task::Context<'_>) -> io::Result<()> {
        match self.0.lock() {
            Ok(s) if s.cut => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the call was abandoned",
            )),
            Ok(mut s) => {
                if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    // At most the reader's and the writer's.
                    if s.wakers.len() >= 4 {
                        s.wakers.remove(0);
                    }
                    s.wakers.push(cx.waker().clone());
                }
                Ok(())
            }
            Err(_) => Ok(()),
        }
    }
}

/// A stream that fails every operation once its `CutHandle` is cut.
struct Cuttable<S> {
    inner: S,
    cut: CutHandle,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Cuttable<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        if let Err(e) = self.cut.check(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Cuttable<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        if let Err(e) = self.cut.check(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        if let Err(e) = self.cut.check(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Whether a failed attempt may be tried again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Reads: whenever the node was unreachable or slow.
    Idempotent,
    /// Only when the request cannot have been sent (the connection failed).
    ConnectOnly,
}

fn status_code(code: tonic::Code) -> Option<StatusCode> {
    use tonic::Code as C;
    Some(match code {
        C::Ok => return None,
        C::Cancelled => StatusCode::Cancelled,
        C::Unknown => StatusCode::Unknown,
        C::InvalidArgument => StatusCode::InvalidArgument,
        C::DeadlineExceeded => StatusCode::DeadlineExceeded,
        C::NotFound => StatusCode::NotFound,
        C::AlreadyExists => StatusCode::AlreadyExists,
        C::PermissionDenied => StatusCode::PermissionDenied,
        C::ResourceExhausted => StatusCode::ResourceExhausted,
        C::FailedPrecondition => StatusCode::FailedPrecondition,
        C::Aborted => StatusCode::Aborted,
        C::OutOfRange => StatusCode::OutOfRange,
        C::Unimplemented => StatusCode::Unimplemented,
        C::Internal => StatusCode::Internal,
        C::Unavailable => StatusCode::Unavailable,
        C::DataLoss => StatusCode::DataLoss,
        C::Unauthenticated => StatusCode::Unauthenticated,
    })
}

fn error(
    node: &TalosNode,
    call: &'static str,
    failure: TalosApiFailure,
    cause: impl Into<String>,
) -> TalosApiError {
    TalosApiError {
        node: node.to_string(),
        call,
        failure,
        cause: cause.into(),
        request_sent: true,
    }
}

/// A status from the node (or from tonic, for a connection that broke mid-call).
fn from_status(node: &TalosNode, call: &'static str, s: &tonic::Status) -> TalosApiError {
    let text = if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        s.message().to_string()
    };
    // tonic reports a connection that broke under the call as Unavailable/Unknown with a
    // transport source, or as Cancelled when the node closed it before answering (a node that
    // refuses our client certificate does so after the TLS 1.3 handshake has completed on our
    // side); the node itself never sets a source.
    if std::error::Error::source(s).is_some()
        && matches!(
            s.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
        )
    {
        return error(
            node,
            call,
            TalosApiFailure::Unreachable,
            format!("connection lost: {text}"),
        );
    }
    match status_code(s.code()) {
        Some(code) => error(
            node,
            call,
            TalosApiFailure::Refused(code),
            format!("refused ({code}): {text}"),
        ),
        None => error(node, call, TalosApiFailure::Malformed, text),
    }
}

/// The node-level error apid may put into a reply's metadata.
fn metadata_error(
    node: &TalosNode,
    call: &'static str,
    meta: Option<&Metadata>,
) -> Result<(), TalosApiError> {
    let Some(m) = meta else { return Ok(()) };
    if m.error.is_empty() && m.status.as_ref().is_none_or(|s| s.code == 0) {
        return Ok(());
    }
    let code = m
        .status
        .as_ref()
        .and_then(|s| status_code(tonic::Code::from(s.code)));
    let text = if m.error.is_empty() {
        m.status
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_default()
    } else {
        m.error.clone()
    };
    Err(match code {
        Some(c) => error(
            node,
            call,
            TalosApiFailure::Refused(c),
            format!("refused ({c}): {text}"),
        ),
        None => error(node, call, TalosApiFailure::Malformed, text),
    })
}

/// The one message of a single-node reply.
fn only<M>(
    node: &TalosNode,
    call: &'static str,
    messages: Vec<M>,
    meta: impl Fn(&M) -> Option<&Metadata>,
) -> Result<M, TalosApiError> {
    let Some(first) = messages.into_iter().next() else {
        return Err(error(
            node,
            call,
            TalosApiFailure::Malformed,
            "the reply holds no message",
        ));
    };
    metadata_error(node, call, meta(&first))?;
    Ok(first)
}

/// Why a TLS handshake failed, in words, and whether it is the node's certificate.
fn classify_tls(e: &io::Error) -> (TalosApiFailure, String) {
    let inner = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .cloned();
    match inner {
        Some(rustls::Error::InvalidCertificate(c)) => (
            TalosApiFailure::Untrusted,
            format!("the node's certificate is not trusted: {c:?} (it must chain to the cluster's Talos OS CA and name the node's address)"),
        ),
        Some(rustls::Error::AlertReceived(a)) => (
            TalosApiFailure::Untrusted,
            format!("the node refused our client certificate (TLS alert {a:?}): it does not trust the cluster's OS CA"),
        ),
        Some(other) => (TalosApiFailure::Untrusted, format!("TLS: {other}")),
        None => (TalosApiFailure::Unreachable, format!("TLS handshake: {e}")),
    }
}

impl TalosApiClient {
    /// A client with these timeouts and retries.
    pub fn new(settings: ClientSettings) -> Self {
        TalosApiClient { settings }
    }

    fn tls_config(
        &self,
        node: &TalosNode,
        call: &'static str,
    ) -> Result<Arc<rustls::ClientConfig>, TalosApiError> {
        let creds = &node.credentials;
        let bad = |what: &str| {
            error(
                node,
                call,
                TalosApiFailure::Malformed,
                format!("client credentials: {what}"),
            )
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(creds.ca_pem.as_bytes()) {
            let ca = ca.map_err(|e| bad(&format!("OS CA certificate: {e}")))?;
            roots
                .add(ca)
                .map_err(|e| bad(&format!("OS CA certificate: {e}")))?;
        }
        let chain = CertificateDer::pem_slice_iter(creds.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&format!("client certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(creds.key_pem.as_bytes())
            .map_err(|e| bad(&format!("client key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| bad(&e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// TCP, then TLS, then an HTTP/2 channel over that one connection.
    async fn connect(
        &self,
        node: &TalosNode,
        call: &'static str,
    ) -> Result<Connection, TalosApiError> {
        let config = self.tls_config(node, call)?;
        let addr: SocketAddr = node.endpoint;
        let t = self.settings.connect_timeout;
        let tcp = match tokio::time::timeout(t, TcpStream::connect(addr)).await {
            Err(_) => {
                return Err(error(
                    node,
                    call,
                    TalosApiFailure::Unreachable,
                    format!("no TCP connection within {t:?}"),
                ))
            }
            Ok(Err(e)) => {
                return Err(error(
                    node,
                    call,
                    TalosApiFailure::Unreachable,
                    format!("TCP connect: {e}"),
                ))
            }
            Ok(Ok(s)) => s,
        };
        let _ = tcp.set_nodelay(true);
        let connector = tokio_rustls::TlsConnector::from(config);
        let name = ServerName::IpAddress(addr.ip().into());
        let tls: TlsStream<TcpStream> =
            match tokio::time::timeout(t, connector.connect(name, tcp)).await {
                Err(_) => {
                    return Err(error(
                        node,
                        call,
                        TalosApiFailure::Timeout,
                        format!("no TLS handshake within {t:?}"),
                    ))
                }
                Ok(Err(e)) => {
                    let (failure, cause) = classify_tls(&e);
                    return Err(error(node, call, failure, cause));
                }
                Ok(Ok(s)) => s,
            };
        let cert_sha256 = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| crate::talos::pki::cert_fingerprint(c.as_ref()))
            .unwrap_or_default();
        // Hand tonic the connection we made; it asks once.
        let cut = CutHandle::default();
        let slot = Arc::new(Mutex::new(Some(Cuttable {
            inner: tls,
            cut: cut.clone(),
        })));
        let connector = tower::service_fn(move |_uri: tonic::transport::Uri| {
            let slot = slot.clone();
            async move {
                let stream = slot.lock().ok().and_then(|mut s| s.take()).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotConnected, "the connection was used")
                })?;
                Ok::<_, io::Error>(TokioIo::new(stream))
            }
        });
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| error(node, call, TalosApiFailure::Malformed, e.to_string()))?
            .connect_with_connector(connector)
            .await
            .map_err(|e| {
                error(
                    node,
                    call,
                    TalosApiFailure::Unreachable,
                    format!("HTTP/2: {e}"),
                )
            })?;
        Ok(Connection {
            channel,
            cert_sha256,
            cut,
        })
    }

    /// Connect and run `f` under the call timeout, with retries as `retry` allows.
    async fn run<T, F, Fut>(
        &self,
        node: &TalosNode,
        call: &'static str,
        retry: Retry,
        timeout: Duration,
        f: F,
    ) -> Result<T, TalosApiError>
    where
        F: Fn(Connection) -> Fut,
        Fut: Future<Output = Result<T, TalosApiError>>,
    {
        let attempts = self.settings.attempts.max(1);
        let mut pause = self.settings.backoff;
        let mut attempt = 1;
        loop {
            let (result, sent) = match self.connect(node, call).await {
                Err(e) => (
                    Err(TalosApiError {
                        request_sent: false,
                        ..e
                    }),
                    false,
                ),
                Ok(conn) => match tokio::time::timeout(timeout, f(conn)).await {
                    Ok(r) => (r, true),
                    Err(_) => (
                        Err(error(
                            node,
                            call,
                            TalosApiFailure::Timeout,
                            format!("no answer within {timeout:?}"),
                        )),
                        true,
                    ),
                },
            };
            let e = match result {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let transient = matches!(
                e.failure,
                TalosApiFailure::Unreachable
                    | TalosApiFailure::Timeout
                    | TalosApiFailure::Refused(StatusCode::Unavailable)
            );
            let may = transient && (retry == Retry::Idempotent || !sent);
            if !may || attempt >= attempts {
                if attempt > 1 {
                    return Err(TalosApiError {
                        cause: format!("{} (after {attempt} attempts)", e.cause),
                        ..e
                    });
                }
                return Err(e);
            }
            tracing::debug!(node = %node, call, attempt, error = %e.cause, "Talos API: retrying");
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2);
            attempt += 1;
        }
    }
}

#[async_trait]
impl TalosApi for TalosApiClient {
    async fn version(&self, node: &TalosNode) -> Result<NodeVersion, TalosApiError> {
        let t = self.settings.call_timeout;
        self.run(node, VERSION, Retry::Idempotent, t, |c| async move {
            let reply = MachineServiceClient::new(c.channel)
                .version(())
                .await
                .map_err(|s| from_status(node, VERSION, &s))?
                .into_inner();
            let v = only(node, VERSION, reply.messages, |m| m.metadata.as_ref())?;
            let info = v.version.unwrap_or_default();
            if info.tag.is_empty() {
                return Err(error(
                    node,
                    VERSION,
                    TalosApiFailure::Malformed,
                    "the reply names no version",
                ));
            }
            Ok(NodeVersion {
                tag: info.tag,
                sha: info.sha,
                arch: info.arch,
                platform: v.platform.map(|p| p.name).unwrap_or_default(),
                cert_sha256: c.cert_sha256,
            })
        })
        .await
    }

    async fn bootstrap(
        &self,
        node: &TalosNode,
        options: BootstrapOptions,
    ) -> Result<(), TalosApiError> {
        let t = self.settings.call_timeout;
        self.run(node, BOOTSTRAP, Retry::ConnectOnly, t, |c| async move {
            let reply = MachineServiceClient::new(c.channel)
                .bootstrap(proto::machine::BootstrapRequest {
                    recover_etcd: options.recover_etcd,
                    recover_skip_hash_check: options.recover_skip_hash_check,
                })
                .await
                .map_err(|s| from_status(node, BOOTSTRAP, &s))?
                .into_inner();
            // An empty list is a plain success on the node itself; a message may carry an error.
            if let Some(m) = reply.messages.first() {
                metadata_error(node, BOOTSTRAP, m.metadata.as_ref())?;
            }
            Ok(())
        })
        .await
    }

    async fn services(&self, node: &TalosNode) -> Result<Vec<ServiceStatus>, TalosApiError> {
        let t = self.settings.call_timeout;
        self.run(node, SERVICE_LIST, Retry::Idempotent, t, |c| async move {
            let reply = MachineServiceClient::new(c.channel)
                .service_list(())
                .await
                .map_err(|s| from_status(node, SERVICE_LIST, &s))?
                .into_inner();
            let list = only(node, SERVICE_LIST, reply.messages, |m| m.metadata.as_ref())?;
            Ok(list
                .services
                .into_iter()
                .map(|s| {
                    let health = s.health.unwrap_or_default();
                    ServiceStatus {
                        id: s.id,
                        state: s.state,
                        healthy: (!health.unknown).then_some(health.healthy),
                        message: health.last_message,
                    }
                })
                .collect())
        })
        .await
    }

    async fn etcd_members(&self, node: &TalosNode) -> Result<Vec<EtcdMember>, TalosApiError> {
        let t = self.settings.call_timeout;
        self.run(
            node,
            ETCD_MEMBER_LIST,
            Retry::Idempotent,
            t,
            |c| async move {
                let reply = MachineServiceClient::new(c.channel)
                    .etcd_member_list(proto::machine::EtcdMemberListRequest { query_local: false })
                    .await
                    .map_err(|s| from_status(node, ETCD_MEMBER_LIST, &s))?
                    .into_inner();
                let m = only(node, ETCD_MEMBER_LIST, reply.messages, |m| {
                    m.metadata.as_ref()
                })?;
                Ok(m.members
                    .into_iter()
                    .map(|m| EtcdMember {
                        id: m.id,
                        hostname: m.hostname,
                        peer_urls: m.peer_urls,
                        client_urls: m.client_urls,
                        is_learner: m.is_learner,
                    })
                    .collect())
            },
        )
        .await
    }

    async fn etcd_status(&self, node: &TalosNode) -> Result<EtcdMemberStatus, TalosApiError> {
        let t = self.settings.call_timeout;
        self.run(node, ETCD_STATUS, Retry::Idempotent, t, |c| async move {
            let reply = MachineServiceClient::new(c.channel)
                .etcd_status(())
                .await
                .map_err(|s| from_status(node, ETCD_STATUS, &s))?
                .into_inner();
            let m = only(node, ETCD_STATUS, reply.messages, |m| m.metadata.as_ref())?;
            let s = m.member_status.ok_or_else(|| {
                error(
                    node,
                    ETCD_STATUS,
                    TalosApiFailure::Malformed,
                    "the reply has no member status",
                )
            })?;
            Ok(EtcdMemberStatus {
                member_id: s.member_id,
                leader: s.leader,
                raft_index: s.raft_index,
                raft_term: s.raft_term,
                db_size: s.db_size,
                errors: s.errors,
                is_learner: s.is_learner,
            })
        })
        .await
    }

    async fn cluster_health(
        &self,
        node: &TalosNode,
        nodes: &ClusterNodes,
        wait: Duration,
    ) -> Result<ClusterCheck, TalosApiError> {
        // The node gives up after `wait`; the call allows for the answer to arrive.
        let t = wait + self.settings.call_timeout;
        let request = proto::cluster::HealthCheckRequest {
            wait_timeout: prost_types::Duration::try_from(wait).ok(),
            cluster_info: Some(proto::cluster::ClusterInfo {
                control_plane_nodes: nodes.control_planes.clone(),
                worker_nodes: nodes.workers.clone(),
                force_endpoint: String::new(),
            }),
        };
        self.run(node, HEALTH_CHECK, Retry::Idempotent, t, |c| {
            let request = request.clone();
            async move {
                let mut stream = ClusterServiceClient::new(c.channel)
                    .health_check(request)
                    .await
                    .map_err(|s| from_status(node, HEALTH_CHECK, &s))?
                    .into_inner();
                let mut progress = Vec::new();
                loop {
                    match stream.message().await {
                        Ok(Some(p)) => {
                            metadata_error(node, HEALTH_CHECK, p.metadata.as_ref())?;
                            // Bounded: a node that streams forever is cut off by the timeout.
                            if progress.len() < 1000 {
                                progress.push(p.message);
                            }
                        }
                        Ok(None) => {
                            return Ok(ClusterCheck {
                                passed: true,
                                progress,
                                error: None,
                            })
                        }
                        // Checks that ran and did not pass: the node's verdict, not a failure
                        // to ask.
                        Err(s) if !progress.is_empty() => {
                            return Ok(ClusterCheck {
                                passed: false,
                                progress,
                                error: Some(from_status(node, HEALTH_CHECK, &s).cause),
                            })
                        }
                        Err(s) => return Err(from_status(node, HEALTH_CHECK, &s)),
                    }
                }
            }
        })
        .await
    }

    async fn boot_id(&self, node: &TalosNode) -> Result<String, TalosApiError> {
        let t = self.settings.call_timeout;
        self.run(node, READ, Retry::Idempotent, t, |c| async move {
            let mut stream = MachineServiceClient::new(c.channel)
                .read(proto::machine::ReadRequest {
                    path: BOOT_ID_PATH.into(),
                })
                .await
                .map_err(|s| from_status(node, READ, &s))?
                .into_inner();
            let mut bytes = Vec::new();
            while let Some(d) = stream
                .message()
                .await
                .map_err(|s| from_status(node, READ, &s))?
            {
                metadata_error(node, READ, d.metadata.as_ref())?;
                bytes.extend_from_slice(&d.bytes);
                if bytes.len() > BOOT_ID_MAX {
                    return Err(error(
                        node,
                        READ,
                        TalosApiFailure::Malformed,
                        format!("{BOOT_ID_PATH} is longer than {BOOT_ID_MAX} bytes"),
                    ));
                }
            }
            let id = String::from_utf8_lossy(&bytes).trim().to_string();
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
                return Err(error(
                    node,
                    READ,
                    TalosApiFailure::Malformed,
                    format!("{BOOT_ID_PATH} does not hold a boot id"),
                ));
            }
            Ok(id)
        })
        .await
    }

    async fn upgrade_legacy(&self, node: &TalosNode, image: &str) -> Result<String, TalosApiError> {
        // The node pulls and checks the image before it answers.
        let t = self.settings.call_timeout * 15;
        self.run(node, UPGRADE, Retry::ConnectOnly, t, |c| async move {
            #[allow(deprecated)]
            let reply = MachineServiceClient::new(c.channel)
                .upgrade(proto::machine::UpgradeRequest {
                    image: image.to_string(),
                    preserve: false,
                    stage: false,
                    force: false,
                    reboot_mode: proto::machine::upgrade_request::RebootMode::Default as i32,
                })
                .await
                .map_err(|s| from_status(node, UPGRADE, &s))?
                .into_inner();
            let m = only(node, UPGRADE, reply.messages, |m| m.metadata.as_ref())?;
            Ok(m.ack)
        })
        .await
    }

    async fn pull_image(
        &self,
        node: &TalosNode,
        image: &str,
        wait: Duration,
    ) -> Result<String, TalosApiError> {
        self.run(node, IMAGE_PULL, Retry::Idempotent, wait, |c| async move {
            let mut stream = ImageServiceClient::new(c.channel)
                .pull(proto::machine::ImageServicePullRequest {
                    containerd: Some(system_containerd()),
                    image_ref: image.to_string(),
                })
                .await
                .map_err(|s| from_status(node, IMAGE_PULL, &s))?
                .into_inner();
            let mut name = None;
            let mut seen = 0usize;
            while let Some(m) = stream
                .message()
                .await
                .map_err(|s| from_status(node, IMAGE_PULL, &s))?
            {
                seen += 1;
                if seen > STREAM_MESSAGES_MAX {
                    return Err(error(
                        node,
                        IMAGE_PULL,
                        TalosApiFailure::Malformed,
                        format!("more than {STREAM_MESSAGES_MAX} progress messages"),
                    ));
                }
                if let Some(proto::machine::image_service_pull_response::Response::Name(n)) =
                    m.response
                {
                    name = Some(n);
                }
            }
            name.filter(|n| !n.is_empty()).ok_or_else(|| {
                error(
                    node,
                    IMAGE_PULL,
                    TalosApiFailure::Malformed,
                    "the pull ended without naming the pulled image",
                )
            })
        })
        .await
    }

    async fn lifecycle_upgrade(
        &self,
        node: &TalosNode,
        image: &str,
        wait: Duration,
    ) -> Result<InstallOutcome, TalosApiError> {
        use proto::machine::lifecycle_service_install_progress::Response as Progress;
        self.run(
            node,
            LIFECYCLE_UPGRADE,
            Retry::ConnectOnly,
            wait,
            |c| async move {
                let mut stream = LifecycleServiceClient::new(c.channel)
                    .upgrade(proto::machine::LifecycleServiceUpgradeRequest {
                        containerd: Some(system_containerd()),
                        source: Some(proto::machine::InstallArtifactsSource {
                            image_name: image.to_string(),
                        }),
                    })
                    .await
                    .map_err(|s| from_status(node, LIFECYCLE_UPGRADE, &s))?
                    .into_inner();
                let mut lines: std::collections::VecDeque<String> =
                    std::collections::VecDeque::new();
                let mut seen = 0usize;
                let mut exit = None;
                while let Some(m) = stream
                    .message()
                    .await
                    .map_err(|s| from_status(node, LIFECYCLE_UPGRADE, &s))?
                {
                    seen += 1;
                    if seen > STREAM_MESSAGES_MAX {
                        return Err(error(
                            node,
                            LIFECYCLE_UPGRADE,
                            TalosApiFailure::Malformed,
                            format!("more than {STREAM_MESSAGES_MAX} progress messages"),
                        ));
                    }
                    match m.progress.and_then(|p| p.response) {
                        Some(Progress::Message(text)) => {
                            if lines.len() == INSTALL_LINES {
                                lines.pop_front();
                            }
                            // One line of the installer's output: bounded.
                            lines.push_back(text.chars().take(500).collect());
                        }
                        Some(Progress::ExitCode(code)) => exit = Some(code),
                        None => {}
                    }
                }
                let exit_code = exit.ok_or_else(|| {
                    error(
                        node,
                        LIFECYCLE_UPGRADE,
                        TalosApiFailure::Malformed,
                        "the upgrade stream ended without the installer's exit code",
                    )
                })?;
                Ok(InstallOutcome {
                    exit_code,
                    messages: lines.into_iter().collect(),
                })
            },
        )
        .await
    }

    async fn reboot(&self, node: &TalosNode) -> Result<(), TalosApiError> {
        let t = self.settings.call_timeout;
        self.run(node, REBOOT, Retry::ConnectOnly, t, |c| async move {
            let reply = MachineServiceClient::new(c.channel)
                .reboot(proto::machine::RebootRequest {
                    mode: proto::machine::reboot_request::Mode::Default as i32,
                })
                .await
                .map_err(|s| from_status(node, REBOOT, &s))?
                .into_inner();
            if let Some(m) = reply.messages.first() {
                metadata_error(node, REBOOT, m.metadata.as_ref())?;
            }
            Ok(())
        })
        .await
    }

    async fn etcd_snapshot(&self, node: &TalosNode) -> Result<SnapshotStream, TalosApiError> {
        let t = self.settings.call_timeout;
        // Retried until the node starts streaming; the stream itself is never restarted.
        let stream = self
            .run(node, ETCD_SNAPSHOT, Retry::Idempotent, t, |c| async move {
                MachineServiceClient::new(c.channel)
                    .etcd_snapshot(proto::machine::EtcdSnapshotRequest {})
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| from_status(node, ETCD_SNAPSHOT, &s))
            })
            .await?;
        // Each message must arrive within the call timeout: a node that stalls ends the stream
        // with an error instead of holding it open forever.
        let node = node.clone();
        Ok(Box::pin(futures::stream::unfold(
            Some((stream, node)),
            move |state| async move {
                let (mut stream, node) = state?;
                match tokio::time::timeout(t, stream.message()).await {
                    Err(_) => Some((
                        Err(error(
                            &node,
                            ETCD_SNAPSHOT,
                            TalosApiFailure::Timeout,
                            format!("the snapshot stream stalled for {t:?}"),
                        )),
                        None,
                    )),
                    Ok(Err(s)) => Some((Err(from_status(&node, ETCD_SNAPSHOT, &s)), None)),
                    Ok(Ok(None)) => None,
                    Ok(Ok(Some(d))) => {
                        if let Err(e) = metadata_error(&node, ETCD_SNAPSHOT, d.metadata.as_ref()) {
                            return Some((Err(e), None));
                        }
                        Some((Ok(d.bytes), Some((stream, node))))
                    }
                }
            },
        )))
    }

    async fn etcd_recover(
        &self,
        node: &TalosNode,
        upload: UploadStream,
    ) -> Result<(), TalosApiError> {
        use futures::StreamExt as _;
        let conn = self
            .connect(node, ETCD_RECOVER)
            .await
            .map_err(|e| TalosApiError {
                request_sent: false,
                ..e
            })?;
        // An `Err` from `upload` must not end the request stream (the node would take a
        // truncated upload as complete): it is reported aside, the request stream is held open,
        // and the call is dropped, which resets the HTTP/2 stream.
        let cut = conn.cut.clone();
        let (abandon, abandoned) = tokio::sync::oneshot::channel::<String>();
        let (mut tx, outbound) = futures::channel::mpsc::channel::<proto::common::Data>(4);
        let pump = tokio::spawn(async move {
            use futures::SinkExt as _;
            let mut upload = upload;
            while let Some(item) = upload.next().await {
                match item {
                    Ok(bytes) => {
                        let data = proto::common::Data {
                            metadata: None,
                            bytes,
                        };
                        if tx.send(data).await.is_err() {
                            return;
                        }
                    }
                    Err(why) => {
                        let _ = abandon.send(why);
                        // Keep `tx`: the request stream must not end (until the call is dropped).
                        let never: std::convert::Infallible = std::future::pending().await;
                        match never {}
                    }
                }
            }
        });
        let call = async {
            let reply = MachineServiceClient::new(conn.channel)
                .etcd_recover(outbound)
                .await
                .map_err(|s| from_status(node, ETCD_RECOVER, &s))?
                .into_inner();
            if let Some(m) = reply.messages.first() {
                metadata_error(node, ETCD_RECOVER, m.metadata.as_ref())?;
            }
            Ok(())
        };
        let result = tokio::select! {
            r = tokio::time::timeout(UPLOAD_TIMEOUT, call) => match r {
                Ok(r) => r,
                Err(_) => Err(error(
                    node,
                    ETCD_RECOVER,
                    TalosApiFailure::Timeout,
                    format!("the upload took longer than {UPLOAD_TIMEOUT:?}"),
                )),
            },
            Ok(why) = abandoned => Err({
                cut.cut();
                error(
                node,
                ETCD_RECOVER,
                TalosApiFailure::Malformed,
                format!("the upload was abandoned (the node never saw it complete): {why}"),
            )
            }),
        };
        pump.abort();
        result
    }
}
