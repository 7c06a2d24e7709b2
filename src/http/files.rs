//! Serving large files (kernels, initramfs, iPXE binaries) from disk: streamed, never loaded whole,
//! with `HEAD`, single `Range` requests (RFC 9110 section 14), `ETag` / `If-None-Match` and exact
//! lengths. [`answer`] decides the status and headers of a file response from the file's length,
//! time and digest and the request's conditions; both the hyper routes here and the sendfile image
//! door (`images_listener`) encode that one decision, so their answers cannot drift apart.

use std::path::Path;
use std::time::SystemTime;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, StatusCode};
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

/// Does an `If-None-Match` value name `etag` (RFC 9110 section 13.1.2: weak comparison)?
fn etag_matches(if_none_match: &str, etag: &str) -> bool {
    if_none_match.split(',').any(|t| {
        let t = t.trim();
        t == etag || t == "*" || t.trim_start_matches("W/") == etag
    })
}

/// What a request asks of a file: the parts of its head that change the answer.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Conditions<'a> {
    /// `HEAD`: headers only.
    pub head: bool,
    /// The `If-None-Match` header.
    pub if_none_match: Option<&'a str>,
    /// The `Range` header.
    pub range: Option<&'a str>,
}

/// The answer to a file request: status, headers, and which bytes the body carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileAnswer {
    /// 200, 206, 304 or 416.
    pub status: StatusCode,
    /// `ETag`.
    pub etag: String,
    /// `Last-Modified` (an IMF-fixdate), when the file system has a time.
    pub last_modified: Option<String>,
    /// `Content-Range` (206 and 416).
    pub content_range: Option<String>,
    /// `Content-Length` (200 and 206; `None` for 304, whose length is the 200's).
    pub content_length: Option<u64>,
    /// First byte of the body.
    pub start: u64,
    /// Bytes in the body (0 for HEAD, 304 and 416).
    pub body_len: u64,
}

/// Decide the answer for a file of `len` bytes modified at `mtime`. `digest` (hex SHA-256), when
/// known, makes the ETag; otherwise length and time do.
pub(crate) fn answer(
    len: u64,
    mtime: Option<SystemTime>,
    digest: Option<&str>,
    c: Conditions<'_>,
) -> FileAnswer {
    let etag = match digest {
        Some(d) => format!("\"sha256-{d}\""),
        None => {
            let secs = mtime
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("\"{len:x}-{secs:x}\"")
        }
    };
    let mut a = FileAnswer {
        status: StatusCode::OK,
        etag,
        last_modified: mtime.map(httpdate),
        content_range: None,
        content_length: None,
        start: 0,
        body_len: 0,
    };
    if c.if_none_match.is_some_and(|v| etag_matches(v, &a.etag)) {
        a.status = StatusCode::NOT_MODIFIED;
        return a;
    }
    let (start, end) = match c.range.and_then(|h| byte_range(h, len)) {
        None => (0, len.saturating_sub(1)),
        Some(Ok((s, e))) => {
            a.status = StatusCode::PARTIAL_CONTENT;
            a.content_range = Some(format!("bytes {s}-{e}/{len}"));
            (s, e)
        }
        Some(Err(())) => {
            a.status = StatusCode::RANGE_NOT_SATISFIABLE;
            a.content_range = Some(format!("bytes */{len}"));
            a.content_length = Some(0);
            return a;
        }
    };
    let count = if len == 0 { 0 } else { end - start + 1 };
    a.content_length = Some(count);
    a.start = start;
    a.body_len = if c.head { 0 } else { count };
    a
}

/// Open `path` for serving (on the blocking pool): the file and its metadata, or `None` when it
/// is missing or not a regular file.
pub(crate) async fn open(path: &Path) -> Option<(std::fs::File, std::fs::Metadata)> {
    let owned = path.to_path_buf();
    let opened = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(owned)?;
        let m = f.metadata()?;
        Ok::<_, std::io::Error>((f, m))
    })
    .await;
    match opened {
        Ok(Ok((f, m))) if m.is_file() => Some((f, m)),
        _ => None,
    }
}

/// `Content-Type` of files with no type of their own (kernels, initramfs, BIOS iPXE).
pub(crate) const OCTET_STREAM: &str = "application/octet-stream";
/// `Content-Type` of an EFI image (UEFI specification, HTTP boot: `application/efi`).
pub(crate) const EFI_IMAGE: &str = "application/efi";

/// Serve `path` as `content_type`. `digest` (hex SHA-256), when known, makes the ETag.
pub async fn serve_file(
    path: &Path,
    digest: Option<String>,
    content_type: &'static str,
    method: &Method,
    headers: &HeaderMap,
) -> Response {
    let Some((file, meta)) = open(path).await else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let text = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok());
    let a = answer(
        meta.len(),
        meta.modified().ok(),
        digest.as_deref(),
        Conditions {
            head: method == Method::HEAD,
            if_none_match: text(header::IF_NONE_MATCH),
            range: text(header::RANGE),
        },
    );
    let mut b = Response::builder()
        .status(a.status)
        .header(header::ETAG, a.etag.as_str())
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_TYPE, content_type);
    if let Some(t) = &a.last_modified {
        b = b.header(header::LAST_MODIFIED, t.as_str());
    }
    if let Some(r) = &a.content_range {
        b = b.header(header::CONTENT_RANGE, r.as_str());
    }
    if let Some(n) = a.content_length {
        b = b.header(header::CONTENT_LENGTH, n);
    }
    if a.body_len == 0 {
        return b.body(Body::empty()).unwrap_or_default();
    }
    b.body(Body::from_stream(FileChunks::new(
        file, a.start, a.body_len,
    )))
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

/// An IMF-fixdate (RFC 9110 section 5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(crate) fn httpdate(t: SystemTime) -> String {
    let dt: chrono::DateTime<chrono::Utc> = t.into();
    dt.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
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

    #[test]
    fn answers() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(784111777);
        let c = Conditions::default();
        let a = answer(100, Some(t), Some("ab"), c);
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.etag, "\"sha256-ab\"");
        assert_eq!(
            a.last_modified.as_deref(),
            Some("Sun, 06 Nov 1994 08:49:37 GMT")
        );
        assert_eq!((a.start, a.body_len, a.content_length), (0, 100, Some(100)));
        let head = answer(100, Some(t), None, Conditions { head: true, ..c });
        assert_eq!((head.body_len, head.content_length), (0, Some(100)));
        assert!(head.etag.starts_with("\"64-"), "{}", head.etag);
        let r = answer(
            100,
            None,
            None,
            Conditions {
                range: Some("bytes=10-19"),
                ..c
            },
        );
        assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
        assert_eq!(r.content_range.as_deref(), Some("bytes 10-19/100"));
        assert_eq!((r.start, r.body_len, r.content_length), (10, 10, Some(10)));
        let bad = answer(
            100,
            None,
            None,
            Conditions {
                range: Some("bytes=100-"),
                ..c
            },
        );
        assert_eq!(bad.status, StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(bad.content_range.as_deref(), Some("bytes */100"));
        assert_eq!(bad.body_len, 0);
        for inm in [
            "\"sha256-ab\"",
            "W/\"sha256-ab\"",
            "\"x\", \"sha256-ab\"",
            "*",
        ] {
            let nm = answer(
                100,
                None,
                Some("ab"),
                Conditions {
                    if_none_match: Some(inm),
                    range: Some("bytes=0-0"),
                    ..c
                },
            );
            assert_eq!(nm.status, StatusCode::NOT_MODIFIED, "{inm}");
            assert_eq!((nm.body_len, nm.content_length), (0, None));
        }
        let other = answer(
            100,
            None,
            Some("ab"),
            Conditions {
                if_none_match: Some("\"sha256-cd\""),
                ..c
            },
        );
        assert_eq!(other.status, StatusCode::OK);
        let empty = answer(0, None, None, c);
        assert_eq!(
            (empty.status, empty.body_len, empty.content_length),
            (StatusCode::OK, 0, Some(0))
        );
    }
}
