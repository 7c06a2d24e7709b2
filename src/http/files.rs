//! Serving large files (kernels, initramfs, iPXE binaries) from disk: streamed, never loaded whole,
//! with `HEAD`, single `Range` requests (RFC 9110 section 14), `ETag` / `If-None-Match` and exact
//! lengths.

use std::path::Path;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use std::future::Future;

/// Parse a single byte range against a length. `None`: serve the whole file (no or unsupported
/// header); `Some(Err(()))`: unsatisfiable.
fn byte_range(h: &str, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = h.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None; // multiple ranges: the whole file is a valid answer
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let r = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        if n == 0 || len == 0 {
            return Some(Err(()));
        }
        (len.saturating_sub(n), len - 1)
    } else {
        let start: u64 = a.parse().ok()?;
        let end: u64 = if b.is_empty() {
            len.saturating_sub(1)
        } else {
            b.parse::<u64>().ok()?.min(len.saturating_sub(1))
        };
        if start >= len || start > end {
            return Some(Err(()));
        }
        (start, end)
    };
    Some(Ok(r))
}

fn etag_matches(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',').any(|t| {
                t.trim() == etag || t.trim() == "*" || t.trim().trim_start_matches("W/") == etag
            })
        })
}

/// Serve `path`. `digest` (hex SHA-256), when known, makes the ETag.
pub async fn serve_file(
    path: &Path,
    digest: Option<String>,
    method: &Method,
    headers: &HeaderMap,
) -> Response {
    let owned = path.to_path_buf();
    let opened = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(owned)?;
        let m = f.metadata()?;
        Ok::<_, std::io::Error>((f, m))
    })
    .await;
    let (file, meta) = match opened {
        Ok(Ok((f, m))) if m.is_file() => (f, m),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let len = meta.len();
    let mtime = meta.modified().ok();
    let etag = match digest {
        Some(d) => format!("\"sha256-{d}\""),
        None => {
            let secs = mtime
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("\"{len:x}-{secs:x}\"")
        }
    };
    let mut base = Response::builder()
        .header(header::ETAG, etag.clone())
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_TYPE, "application/octet-stream");
    if let Some(t) = mtime {
        base = base.header(header::LAST_MODIFIED, httpdate(t));
    }
    if etag_matches(headers, &etag) {
        return base
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::empty())
            .unwrap_or_default();
    }
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| byte_range(h, len));
    let (status, start, end) = match range {
        None => (StatusCode::OK, 0, len.saturating_sub(1)),
        Some(Ok((s, e))) => (StatusCode::PARTIAL_CONTENT, s, e),
        Some(Err(())) => {
            return base
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header(header::CONTENT_RANGE, format!("bytes */{len}"))
                .body(Body::empty())
                .unwrap_or_default();
        }
    };
    let count = if len == 0 { 0 } else { end - start + 1 };
    let mut b = base.status(status).header(header::CONTENT_LENGTH, count);
    if status == StatusCode::PARTIAL_CONTENT {
        b = b.header(header::CONTENT_RANGE, format!("bytes {start}-{end}/{len}"));
    }
    if method == Method::HEAD {
        return b.body(Body::empty()).unwrap_or_default();
    }
    b.body(Body::from_stream(FileChunks::new(file, start, count)))
        .unwrap_or_default()
}

/// A chunk read: the file (to read the next chunk from) and the bytes.
type ChunkRead = std::io::Result<(std::fs::File, Vec<u8>)>;

/// Bytes read per chunk of a response body.
const CHUNK: u64 = 512 * 1024;

/// A file's byte range as a stream of chunks read on the blocking pool, one chunk ahead of the
/// one being sent. Each chunk is read from the page cache straight into the buffer handed to the
/// socket (one copy; `tokio::fs::File` under a `ReaderStream` copies twice), and a download holds
/// a blocking thread only while a chunk is being read.
struct FileChunks {
    next: Option<tokio::task::JoinHandle<ChunkRead>>,
    /// Position of the next chunk to read, and bytes left to read after it.
    at: u64,
    left: u64,
}

impl FileChunks {
    fn new(file: std::fs::File, start: u64, count: u64) -> Self {
        let mut s = FileChunks {
            next: None,
            at: start,
            left: count,
        };
        s.read_ahead(file);
        s
    }

    fn read_ahead(&mut self, file: std::fs::File) {
        if self.left == 0 {
            return;
        }
        let (at, n) = (self.at, self.left.min(CHUNK));
        self.at += n;
        self.left -= n;
        self.next = Some(tokio::task::spawn_blocking(move || {
            use std::io::{Read, Seek};
            let mut f = file;
            f.seek(std::io::SeekFrom::Start(at))?;
            // usize: n <= CHUNK.
            let mut buf = Vec::with_capacity(n as usize);
            (&mut f).take(n).read_to_end(&mut buf)?;
            if (buf.len() as u64) < n {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was being served",
                ));
            }
            Ok((f, buf))
        }));
    }
}

impl futures::Stream for FileChunks {
    type Item = std::io::Result<axum::body::Bytes>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let Some(h) = self.next.as_mut() else {
            return Poll::Ready(None);
        };
        let done = match std::pin::Pin::new(h).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        self.next = None;
        match done {
            Ok(Ok((file, buf))) => {
                self.read_ahead(file);
                Poll::Ready(Some(Ok(axum::body::Bytes::from(buf))))
            }
            Ok(Err(e)) => Poll::Ready(Some(Err(e))),
            Err(e) => Poll::Ready(Some(Err(std::io::Error::other(e)))),
        }
    }
}

fn httpdate(t: std::time::SystemTime) -> HeaderValue {
    let dt: chrono::DateTime<chrono::Utc> = t.into();
    HeaderValue::from_str(&dt.format("%a, %d %b %Y %H:%M:%S GMT").to_string())
        .unwrap_or(HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(byte_range("bytes=0-9", 100), Some(Ok((0, 9))));
        assert_eq!(byte_range("bytes=90-", 100), Some(Ok((90, 99))));
        assert_eq!(byte_range("bytes=-10", 100), Some(Ok((90, 99))));
        assert_eq!(byte_range("bytes=50-500", 100), Some(Ok((50, 99))));
        assert_eq!(byte_range("bytes=100-", 100), Some(Err(())));
        assert_eq!(byte_range("bytes=9-3", 100), Some(Err(())));
        assert_eq!(byte_range("bytes=0-1,5-6", 100), None);
        assert_eq!(byte_range("items=0-1", 100), None);
        assert_eq!(byte_range("bytes=x-1", 100), None);
    }
}
