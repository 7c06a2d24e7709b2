//! The image door: a second, minimal HTTP/1.1 listener that serves only
//! `GET`/`HEAD /images/{schematic}/{version}/{file}`, sending file bodies with `sendfile(2)`.
//!
//! Why by hand: hyper's body API takes buffers, so a file served through it is copied twice (page
//! cache to user space, user space to the socket), which was 44% of Plinth's time when 50 machines
//! downloaded an initramfs at once. The door parses request heads with `httparse`, then writes the
//! response head and hands the file range to the kernel. Which file a path names (the pull-on-miss
//! and declared-cluster rule), the `http.image` timeline step and the request metrics come from
//! the same places as the hyper route (`ProvisioningService::image`, `files::answer`,
//! `metrics::observe`), so the two doors answer alike. The main port keeps serving `/images/`.
//!
//! Speaks: keep-alive (RFC 9112 section 9.3) and HTTP/1.0, pipelined requests in order, single
//! ranges (RFC 9110 section 14), `ETag`/`If-None-Match`. Refuses: request bodies (400, then the
//! connection closes), other methods (405), other paths (404), malformed heads (400) and heads
//! over the size limit (431). Heads that arrive too slowly and idle connections are closed; so is
//! a connection whose client stops reading. Connections are capped in all and per client address
//! (`super::slots`). Imports nothing of the other front doors.

mod head;
mod sendfile;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::boot::{image_refusal, IMAGE_ROUTE};
use super::files::{self, Conditions};
use super::slots::Slots;
use super::AppState;
use crate::service::provisioning::ImageRequest;
use head::{Head, HeadError, Method, ResponseHead};

/// The door's limits.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Longest request head, bytes.
    pub max_head_bytes: usize,
    /// Time allowed for a request head to arrive once its first byte has.
    pub head_timeout: Duration,
    /// Time an idle keep-alive connection is kept.
    pub idle_timeout: Duration,
    /// Time a client may take no data before its connection is closed.
    pub send_stall: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Connections one client address may hold open; more are closed at once.
    pub max_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            send_stall: Duration::from_secs(60),
            max_connections: 1024,
            max_per_client: 64,
        }
    }
}

/// What the door makes of the bytes at the start of a connection's buffer, without I/O: the fuzz
/// target `fuzz/fuzz_targets/image_head.rs` drives it with arbitrary bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadReading {
    /// Bytes of the buffer the head took.
    pub used: usize,
    /// The image the path names (schematic, version, file), decoded.
    pub image: Option<(String, String, String)>,
    /// The status of the answer for a file of the given length.
    pub status: u16,
    /// First byte of the file sent, and how many.
    pub start: u64,
    /// Bytes of the body sent.
    pub body_len: u64,
    /// The `Content-Length` answered.
    pub content_length: Option<u64>,
    /// Whether the connection stays open after the answer.
    pub keep_alive: bool,
}

/// Read one request head from `buf` as the door does (heads over `max` bytes refused) and answer
/// it as for a file of `file_len` bytes: `Ok(None)` when more bytes are needed, `Err(status)` for
/// a head the door refuses.
pub fn read_head_bytes(buf: &[u8], max: usize, file_len: u64) -> Result<Option<HeadReading>, u16> {
    let Some((h, used)) = head::parse(buf, max).map_err(|e| e.status().as_u16())? else {
        return Ok(None);
    };
    let a = files::answer(
        file_len,
        None,
        None,
        Conditions {
            head: h.method == Method::Head,
            if_none_match: h.if_none_match.as_deref(),
            range: h.range.as_deref(),
        },
    );
    Ok(Some(HeadReading {
        used,
        image: head::image_path(&h.path),
        status: a.status.as_u16(),
        start: a.start,
        body_len: a.body_len,
        content_length: a.content_length,
        keep_alive: h.keep_alive,
    }))
}

/// Errors of the image door's accept loop.
#[derive(Debug, thiserror::Error)]
pub enum ImageDoorError {
    /// The listening socket failed.
    #[error("image door: {0}")]
    Listen(#[from] std::io::Error),
}

struct Front {
    state: AppState,
    limits: Limits,
}

/// Serve the image door on an already-bound listener until `shutdown`; then stop accepting, close
/// idle connections, let answers under way finish (each bounded by the stall limit), and return.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(), ImageDoorError> {
    let refused = prometheus_client::metrics::counter::Counter::default();
    state.metrics.register(
        "images_connections_refused",
        "Image-door connections closed at once: their client had its share open already",
        refused.clone(),
    );
    let slots = Slots::new(limits.max_connections, limits.max_per_client, refused);
    let front = Arc::new(Front { state, limits });
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
                tracing::warn!(error = %e, "image door: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = slots.take(free, peer.ip()) else {
            tracing::debug!(%peer, "image door: too many connections from this client; closed");
            continue;
        };
        while connections.try_join_next().is_some() {}
        let (front, stop) = (front.clone(), shutdown.clone());
        connections.spawn(async move {
            let _slot = slot;
            connection(stream, peer, &front, &stop).await;
        });
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// What to do with a connection after an answer.
#[derive(Debug, PartialEq, Eq)]
enum After {
    KeepAlive,
    Close,
}

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    front: &Front,
    stop: &CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let head = match read_head(&mut stream, &mut buf, &front.limits, stop).await {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "image door: bad request head");
                let started = Instant::now();
                let status = e.status();
                let bytes = empty(status, &[]).finish(false, false);
                let _ = write(&mut stream, &bytes, front.limits.send_stall).await;
                observe(front, "", None, status, started);
                linger(stream).await;
                return;
            }
        };
        match answer(&mut stream, peer, &head, front, stop).await {
            After::KeepAlive if !stop.is_cancelled() => continue,
            After::KeepAlive => return,
            After::Close => {
                linger(stream).await;
                return;
            }
        }
    }
}

/// Read until `buf` holds a whole head; `Ok(None)`: the client left, was idle or too slow, or the
/// server is stopping.
async fn read_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    limits: &Limits,
    stop: &CancellationToken,
) -> Result<Option<Head>, HeadError> {
    let mut deadline = (!buf.is_empty()).then(|| tokio::time::Instant::now() + limits.head_timeout);
    loop {
        if let Some((h, used)) = head::parse(buf, limits.max_head_bytes)? {
            buf.drain(..used);
            return Ok(Some(h));
        }
        let until = deadline.unwrap_or_else(|| tokio::time::Instant::now() + limits.idle_timeout);
        buf.reserve(4096);
        let n = tokio::select! {
            _ = stop.cancelled() => return Ok(None),
            r = tokio::time::timeout_at(until, stream.read_buf(buf)) => match r {
                Ok(Ok(n)) => n,
                Ok(Err(_)) | Err(_) => return Ok(None),
            },
        };
        if n == 0 {
            return Ok(None);
        }
        deadline.get_or_insert_with(|| tokio::time::Instant::now() + limits.head_timeout);
    }
}

/// A response head with no body.
fn empty(status: StatusCode, extra: &[(&str, &str)]) -> ResponseHead {
    extra
        .iter()
        .fold(ResponseHead::new(status), |h, (n, v)| h.header(n, v))
        .header("Content-Length", "0")
}

/// Count an answer; `route` is `None` for a path that is no image's (labels from a closed set:
/// `metrics::observe`).
fn observe(front: &Front, method: &str, route: Option<&str>, status: StatusCode, started: Instant) {
    super::metrics::observe(
        &front.state.metrics,
        method,
        route,
        status.as_u16(),
        started,
    );
}

/// Answer one request.
async fn answer(
    stream: &mut TcpStream,
    peer: SocketAddr,
    h: &Head,
    front: &Front,
    stop: &CancellationToken,
) -> After {
    let started = Instant::now();
    let method = h.method.as_str();
    let keep = h.keep_alive;
    let refuse = |status: StatusCode, route: Option<&str>, extra: &[(&str, &str)], keep: bool| {
        observe(front, method, route, status, started);
        empty(status, extra).finish(keep, h.http10)
    };
    if h.has_body {
        // Nothing here takes a body; reading past one to find the next head is not worth it.
        let bytes = refuse(StatusCode::BAD_REQUEST, None, &[], false);
        let _ = write(stream, &bytes, front.limits.send_stall).await;
        return After::Close;
    }
    let Some((schematic, version, file)) = head::image_path(&h.path) else {
        let bytes = refuse(StatusCode::NOT_FOUND, None, &[], keep);
        return write_then(stream, &bytes, keep, front.limits.send_stall).await;
    };
    if matches!(h.method, Method::Other(_)) {
        let bytes = refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            Some(IMAGE_ROUTE),
            &[("Allow", "GET, HEAD")],
            keep,
        );
        return write_then(stream, &bytes, keep, front.limits.send_stall).await;
    }
    let r = ImageRequest {
        schematic: &schematic,
        version: &version,
        file: &file,
        peer: peer.ip(),
        whole_get: h.method == Method::Get && h.range.is_none(),
    };
    let opened = match front.state.provisioning.image(&r).await {
        Ok(found) => files::open(&found.path).await.map(|f| (f, found.sha256)),
        Err(refusal) => {
            let bytes = refuse(image_refusal(refusal), Some(IMAGE_ROUTE), &[], keep);
            return write_then(stream, &bytes, keep, front.limits.send_stall).await;
        }
    };
    let Some(((f, meta), digest)) = opened else {
        let bytes = refuse(StatusCode::NOT_FOUND, Some(IMAGE_ROUTE), &[], keep);
        return write_then(stream, &bytes, keep, front.limits.send_stall).await;
    };
    let a = files::answer(
        meta.len(),
        meta.modified().ok(),
        digest.as_deref(),
        Conditions {
            head: h.method == Method::Head,
            if_none_match: h.if_none_match.as_deref(),
            range: h.range.as_deref(),
        },
    );
    let mut rh = ResponseHead::new(a.status)
        .header("Content-Type", "application/octet-stream")
        .header("Accept-Ranges", "bytes")
        .header("ETag", &a.etag);
    if let Some(t) = &a.last_modified {
        rh = rh.header("Last-Modified", t);
    }
    if let Some(r) = &a.content_range {
        rh = rh.header("Content-Range", r);
    }
    if let Some(n) = a.content_length {
        rh = rh.header("Content-Length", &n.to_string());
    }
    let bytes = rh.finish(keep, h.http10);
    // Head and body leave in full segments (nginx's tcp_nopush); uncorking sends the rest.
    let _ = socket2::SockRef::from(&*stream).set_cork(true);
    let sent = async {
        write(stream, &bytes, front.limits.send_stall).await?;
        if a.body_len > 0 {
            sendfile::send_range(stream, &f, a.start, a.body_len, front.limits.send_stall).await?;
        }
        Ok::<_, sendfile::SendError>(())
    };
    // An answer under way finishes when the server stops (bounded by the stall limit).
    let sent = sent.await;
    let _ = socket2::SockRef::from(&*stream).set_cork(false);
    observe(front, method, Some(IMAGE_ROUTE), a.status, started);
    match sent {
        Ok(()) => {
            tracing::info!(
                %peer, %schematic, %version, %file, method, status = a.status.as_u16(),
                bytes = a.body_len, ms = started.elapsed().as_millis() as u64,
                stopping = stop.is_cancelled(), "image served"
            );
            if keep {
                After::KeepAlive
            } else {
                After::Close
            }
        }
        Err(e) => {
            tracing::info!(%peer, %file, error = %e, after = ?started.elapsed(), "image download ended early");
            After::Close
        }
    }
}

async fn write_then(stream: &mut TcpStream, bytes: &[u8], keep: bool, stall: Duration) -> After {
    match write(stream, bytes, stall).await {
        Ok(()) if keep => After::KeepAlive,
        _ => After::Close,
    }
}

/// Write a response head, giving up when the client takes none of it for `stall`.
async fn write(
    stream: &mut TcpStream,
    bytes: &[u8],
    stall: Duration,
) -> Result<(), sendfile::SendError> {
    tokio::time::timeout(stall, stream.write_all(bytes))
        .await
        .map_err(|_| sendfile::SendError::Stalled(stall))?
        .map_err(sendfile::SendError::Io)
}

/// Close after an answer: send FIN, then read and drop what the client still sends for a moment,
/// so that its unread bytes do not make the kernel reset the connection before the client has
/// read the answer (RFC 9112 section 9.6).
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut left = 256 * 1024usize;
    while left > 0 {
        match tokio::time::timeout_at(until, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            _ => return,
        }
    }
}
