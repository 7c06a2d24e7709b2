//! Serving large files (kernels, initramfs, iPXE binaries) from disk: streamed, never loaded whole,
//! with `HEAD`, single `Range` requests (RFC 9110 section 14), `ETag` / `If-None-Match` and exact
//! lengths.

use std::path::Path;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

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
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(_) => return StatusCode::NOT_FOUND.into_response(),
    };
    let meta = match file.metadata().await {
        Ok(m) if m.is_file() => m,
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
    if start > 0 && file.seek(std::io::SeekFrom::Start(start)).await.is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let stream = tokio_util::io::ReaderStream::with_capacity(file.take(count), 256 * 1024);
    b.body(Body::from_stream(stream)).unwrap_or_default()
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
