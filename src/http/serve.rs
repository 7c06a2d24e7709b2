//! The main port's accept loop: hyper's HTTP/1.1 connections serving the router, with the limits
//! an anonymous client on the provisioning network must not get past (issue 15, finding 3):
//!
//! - connection caps ([`super::slots`]): global, taken before `accept` (past it, clients wait in the
//!   kernel's listen backlog and cost no descriptor), and per client address;
//! - a header-read timeout: a request head (the first, and each next one of a keep-alive
//!   connection) must arrive whole within it, so a client trickling a head byte by byte is closed
//!   (hyper's own timer: it needs `TokioTimer`, without which hyper ignores the setting);
//! - an idle timeout: a connection on which no byte moves either way, and no request is being
//!   answered, is closed (this also ends a download whose client stopped reading);
//! - a request timeout: a handler (which includes reading the body) answers within it, or the
//!   request gets a 503 (a response body under way, such as an event stream, is not cut by it).
//!
//! Imports the router's pieces (`super`), the metrics and nothing of the other front doors.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::error::ApiError;
use super::slots::Slots;

/// The main port's limits.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Time a request head may take to arrive whole.
    pub header_timeout: Duration,
    /// Time a connection may move no byte while no request is being answered.
    pub idle_timeout: Duration,
    /// Time a handler (reading the body included) may take to answer.
    pub request_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Connections one client address may hold open; more are closed at once.
    pub max_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(300),
            max_connections: 1024,
            max_per_client: 64,
        }
    }
}

/// Time an answer under way is given to finish once the server stops.
const DRAIN: Duration = Duration::from_secs(10);

/// Serve `router` on an already-bound listener until `shutdown`; then stop accepting, close idle
/// connections, give answers under way a moment to finish, and return.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let refused = prometheus_client::metrics::counter::Counter::default();
    metrics.register(
        "http_connections_refused",
        "Main-port connections closed at once: their client had its share open already",
        refused.clone(),
    );
    let slots = Slots::new(limits.max_connections, limits.max_per_client, refused);
    let limits = Arc::new(limits);
    let mut connections = JoinSet::new();
    loop {
        let free = tokio::select! {
            _ = shutdown.cancelled() => break,
            f = slots.free() => match f {
                Some(f) => f,
                None => break,
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors or a connection reset before accept: the listener is fine.
                tracing::warn!(error = %e, "http: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = slots.take(free, peer.ip()) else {
            tracing::debug!(%peer, "http: too many connections from this client; closed");
            continue;
        };
        while connections.try_join_next().is_some() {}
        let (router, limits, metrics, stop) = (
            router.clone(),
            limits.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
        connections.spawn(async move {
            let _slot = slot;
            connection(stream, peer, router, &limits, metrics, stop).await;
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// What a connection did last: milliseconds since `epoch` of the last byte moved, and how many
/// requests are being answered.
struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
    answering: AtomicUsize,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            answering: AtomicUsize::new(0),
        })
    }

    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// When the connection becomes idle for `idle`, if nothing moves meanwhile.
    fn idle_at(&self, idle: Duration) -> tokio::time::Instant {
        let last = self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        tokio::time::Instant::from_std(last + idle)
    }
}

/// A request being answered, for the idle rule.
struct Answering(Arc<Activity>);

impl Answering {
    fn start(a: &Arc<Activity>) -> Self {
        a.answering.fetch_add(1, Ordering::Relaxed);
        Answering(a.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.touch();
        self.0.answering.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The client's stream, noting every byte that moves.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serve one connection until the client leaves, a limit ends it, or the server stops.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: &Limits,
    metrics: Arc<crate::metrics::Metrics>,
    stop: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let activity = Activity::new();
    activity.touch();
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let (request_timeout, answering) = (limits.request_timeout, activity.clone());
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let (router, metrics, answering) = (router.clone(), metrics.clone(), answering.clone());
        async move {
            let _answering = Answering::start(&answering);
            req.extensions_mut().insert(ConnectInfo(peer));
            let started = Instant::now();
            let method = req.method().clone();
            match tokio::time::timeout(request_timeout, router.oneshot(req)).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::info!(%peer, %method, after = ?request_timeout, "http: request timed out");
                    let status = StatusCode::SERVICE_UNAVAILABLE;
                    super::metrics::observe(
                        &metrics,
                        method.as_str(),
                        None,
                        status.as_u16(),
                        started,
                    );
                    Ok::<Response, Infallible>(
                        ApiError::new(status, "request_timeout", "the request took too long")
                            .into_response(),
                    )
                }
            }
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        let idle_at = activity.idle_at(limits.idle_timeout);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "http: connection ended");
                }
                return;
            }
            _ = stop.cancelled(), if drain_until.is_none() => {
                conn.as_mut().graceful_shutdown();
                drain_until = Some(tokio::time::Instant::now() + DRAIN);
            }
            _ = tokio::time::sleep_until(drain_until.unwrap_or(idle_at)) => {
                if drain_until.is_some_and(|d| d <= tokio::time::Instant::now()) {
                    return;
                }
                let idle = activity.answering.load(Ordering::Relaxed) == 0
                    && activity.idle_at(limits.idle_timeout) <= tokio::time::Instant::now();
                if idle {
                    tracing::debug!(%peer, "http: idle connection closed");
                    return;
                }
                if activity.answering.load(Ordering::Relaxed) > 0 {
                    // Answering: look again after another idle period.
                    activity.touch();
                }
            }
        }
    }
}
