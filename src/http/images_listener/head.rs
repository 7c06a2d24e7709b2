//! Request heads and response heads of the image door: the small subset of HTTP/1.1 (RFC 9112)
//! it speaks. A request head is parsed with `httparse` and reduced to what the door acts on
//! (method, path, `Range`, `If-None-Match`, whether the connection persists, whether a body
//! follows); a response head is written as bytes. No I/O here.

use axum::http::StatusCode;

/// Most header fields accepted in one request head.
const MAX_HEADERS: usize = 64;

/// The request method, as far as the door cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Method {
    /// `GET`.
    Get,
    /// `HEAD`.
    Head,
    /// Anything else (answered 405), kept for the metrics label.
    Other(String),
}

impl Method {
    /// The method's name.
    pub(super) fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Other(m) => m,
        }
    }
}

/// A parsed request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Head {
    /// The method.
    pub method: Method,
    /// The path of the request target, query removed (still percent-encoded).
    pub path: String,
    /// HTTP/1.0 (else 1.1).
    pub http10: bool,
    /// The connection persists after the answer (RFC 9112 section 9.3).
    pub keep_alive: bool,
    /// `Range`, when exactly one was sent.
    pub range: Option<String>,
    /// `If-None-Match` (several fields joined with commas).
    pub if_none_match: Option<String>,
    /// A body follows the head (`Content-Length` above 0 or any `Transfer-Encoding`).
    pub has_body: bool,
}

/// Why a head cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum HeadError {
    /// Not HTTP/1.x, or a field the door must read is unreadable: 400.
    #[error("malformed request head: {0}")]
    Malformed(&'static str),
    /// Longer than the limit: 431.
    #[error("request head longer than {0} bytes")]
    TooLarge(usize),
}

impl HeadError {
    /// The status answered before the connection is closed.
    pub(super) fn status(&self) -> StatusCode {
        match self {
            HeadError::Malformed(_) => StatusCode::BAD_REQUEST,
            HeadError::TooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        }
    }
}

/// Parse the head at the start of `buf`: `Ok(None)` when more bytes are needed, else the head and
/// how many bytes of `buf` it took. Heads longer than `max` bytes are refused.
pub(super) fn parse(buf: &[u8], max: usize) -> Result<Option<(Head, usize)>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let used = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= max => return Err(HeadError::TooLarge(max)),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge(max)),
        Err(httparse::Error::Version) => return Err(HeadError::Malformed("not HTTP/1.x")),
        Err(_) => return Err(HeadError::Malformed("request line or header field")),
    };
    if used > max {
        return Err(HeadError::TooLarge(max));
    }
    let method = match req.method.unwrap_or_default() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        other => Method::Other(other.to_string()),
    };
    let http10 = req.version == Some(0);
    let mut close = false;
    let mut persist = false;
    let mut host = false;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut ranges: Vec<String> = Vec::new();
    let mut inm: Vec<String> = Vec::new();
    for f in req.headers.iter() {
        let name = f.name;
        let text = || std::str::from_utf8(f.value).map(str::trim);
        if name.eq_ignore_ascii_case("connection") {
            for token in text().unwrap_or_default().split(',') {
                let token = token.trim();
                close |= token.eq_ignore_ascii_case("close");
                persist |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("host") {
            host = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            // RFC 9112 section 6.3: a list of identical values is one value; anything else is an
            // error the connection cannot recover from.
            for v in text()
                .map_err(|_| HeadError::Malformed("Content-Length"))?
                .split(',')
            {
                let n: u64 = v
                    .trim()
                    .parse()
                    .map_err(|_| HeadError::Malformed("Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(HeadError::Malformed("Content-Length"));
                }
                length = Some(n);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = true;
        } else if name.eq_ignore_ascii_case("range") {
            ranges.push(
                text()
                    .map_err(|_| HeadError::Malformed("Range"))?
                    .to_string(),
            );
        } else if name.eq_ignore_ascii_case("if-none-match") {
            inm.push(
                text()
                    .map_err(|_| HeadError::Malformed("If-None-Match"))?
                    .to_string(),
            );
        }
    }
    // RFC 9112 section 3.2: a 1.1 request without Host is answered 400.
    if !http10 && !host {
        return Err(HeadError::Malformed("no Host"));
    }
    let target = req.path.unwrap_or_default();
    let path = origin_path(target).ok_or(HeadError::Malformed("request target"))?;
    Ok(Some((
        Head {
            method,
            path: path.to_string(),
            http10,
            keep_alive: !close && (!http10 || persist),
            // Several Range fields: not one satisfiable range, so the whole file (as for a list).
            range: (ranges.len() == 1).then(|| ranges.remove(0)),
            if_none_match: (!inm.is_empty()).then(|| inm.join(", ")),
            has_body: chunked || length.unwrap_or(0) > 0,
        },
        used,
    )))
}

/// The path of a request target in origin form (`/a/b?q`) or absolute form
/// (`http://host/a/b?q`, RFC 9112 section 3.2.2), without its query.
fn origin_path(target: &str) -> Option<&str> {
    let rest = match target.split_once("://") {
        Some((scheme, rest))
            if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") =>
        {
            rest.find('/').map_or("/", |i| &rest[i..])
        }
        _ => target,
    };
    if !rest.starts_with('/') {
        return None;
    }
    Some(rest.split(['?', '#']).next().unwrap_or(rest))
}

/// `/images/{schematic}/{version}/{file}` decoded into its three segments, or `None` for any
/// other path.
pub(super) fn image_path(path: &str) -> Option<(String, String, String)> {
    let rest = path.strip_prefix("/images/")?;
    let mut parts = rest.split('/');
    let (a, b, c) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || a.is_empty() || b.is_empty() || c.is_empty() {
        return None;
    }
    Some((percent_decode(a)?, percent_decode(b)?, percent_decode(c)?))
}

/// Decode `%XX` escapes (RFC 3986 section 2.1); `None` for a broken escape or non-UTF-8 result.
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A response head being written.
pub(super) struct ResponseHead {
    bytes: Vec<u8>,
}

impl ResponseHead {
    /// Start with the status line (always `HTTP/1.1`, the highest version the door speaks: RFC
    /// 9110 section 6.2) and `Date`.
    pub(super) fn new(status: StatusCode) -> Self {
        let mut bytes = Vec::with_capacity(512);
        bytes.extend_from_slice(b"HTTP/1.1 ");
        bytes.extend_from_slice(status.as_str().as_bytes());
        bytes.push(b' ');
        bytes.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        bytes.extend_from_slice(b"\r\n");
        let r = ResponseHead { bytes };
        r.header(
            "Date",
            &crate::http::files::httpdate(std::time::SystemTime::now()),
        )
    }

    /// Add a header field.
    pub(super) fn header(mut self, name: &str, value: &str) -> Self {
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.extend_from_slice(b": ");
        self.bytes.extend_from_slice(value.as_bytes());
        self.bytes.extend_from_slice(b"\r\n");
        self
    }

    /// End the head, saying whether the connection persists (HTTP/1.0 clients are told when it
    /// does; HTTP/1.1 ones when it does not).
    pub(super) fn finish(self, keep_alive: bool, http10: bool) -> Vec<u8> {
        let mut r = match (keep_alive, http10) {
            (false, _) => self.header("Connection", "close"),
            (true, true) => self.header("Connection", "keep-alive"),
            (true, false) => self,
        };
        r.bytes.extend_from_slice(b"\r\n");
        r.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 8192;

    fn head(text: &str) -> Head {
        let (h, n) = parse(text.as_bytes(), MAX)
            .expect("parses")
            .expect("complete");
        assert_eq!(n, text.len(), "{text:?}");
        h
    }

    #[test]
    fn heads() {
        let h = head("GET /images/a/b/c HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\nIf-None-Match: \"e\"\r\n\r\n");
        assert_eq!(h.method, Method::Get);
        assert_eq!(h.path, "/images/a/b/c");
        assert!(h.keep_alive && !h.http10 && !h.has_body);
        assert_eq!(h.range.as_deref(), Some("bytes=0-9"));
        assert_eq!(h.if_none_match.as_deref(), Some("\"e\""));

        // Connection handling, RFC 9112 section 9.3.
        let table = [
            (
                "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                false,
            ),
            (
                "GET / HTTP/1.1\r\nHost: x\r\nconnection: TE, Close\r\n\r\n",
                false,
            ),
            ("GET / HTTP/1.0\r\n\r\n", false),
            ("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", true),
            ("GET / HTTP/1.1\r\nHost: x\r\n\r\n", true),
        ];
        for (text, keep) in table {
            assert_eq!(head(text).keep_alive, keep, "{text:?}");
        }

        let h = head("HEAD http://10.0.0.1:8081/images/a/b/c?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!((h.method, h.path.as_str()), (Method::Head, "/images/a/b/c"));
        let h = head("POST /images/a/b/c HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n");
        assert_eq!(h.method, Method::Other("POST".into()));
        assert!(h.has_body);
        assert!(head("GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").has_body);
        assert!(!head("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").has_body);
        assert!(head("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n").has_body);
        let two = head("GET / HTTP/1.1\r\nHost: x\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\nIf-None-Match: \"a\"\r\nIf-None-Match: \"b\"\r\n\r\n");
        assert_eq!(two.range, None);
        assert_eq!(two.if_none_match.as_deref(), Some("\"a\", \"b\""));
        // An empty line before the request line is ignored (RFC 9112 section 2.2).
        assert_eq!(head("\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n").path, "/");
    }

    #[test]
    fn incomplete_and_pipelined_heads() {
        let one = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
        for cut in 0..one.len() {
            assert_eq!(parse(&one.as_bytes()[..cut], MAX), Ok(None), "{cut}");
        }
        let two = format!("{one}GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
        let (h, n) = parse(two.as_bytes(), MAX).expect("ok").expect("complete");
        assert_eq!((h.path.as_str(), n), ("/a", one.len()));
        let (h, _) = parse(&two.as_bytes()[n..], MAX)
            .expect("ok")
            .expect("complete");
        assert_eq!(h.path, "/b");
    }

    #[test]
    fn bad_heads() {
        let big = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
            "a".repeat(MAX)
        );
        let many: String = (0..100).map(|i| format!("X-{i}: y\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n");
        let table: &[(&[u8], HeadError)] = &[
            (b"GET / HTTP/1.1\r\n\r\n", HeadError::Malformed("no Host")),
            (
                b"GET / HTTP/2.0\r\n\r\n",
                HeadError::Malformed("not HTTP/1.x"),
            ),
            (
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                HeadError::Malformed("not HTTP/1.x"),
            ),
            (
                b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 2\r\n\r\n",
                HeadError::Malformed("Content-Length"),
            ),
            (
                b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                HeadError::Malformed("Content-Length"),
            ),
            (
                b"GET images HTTP/1.1\r\nHost: x\r\n\r\n",
                HeadError::Malformed("request target"),
            ),
            (
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                HeadError::Malformed("request line or header field"),
            ),
            (
                b"GET / HTTP/1.1\r\nHo st: x\r\n\r\n",
                HeadError::Malformed("request line or header field"),
            ),
            (big.as_bytes(), HeadError::TooLarge(MAX)),
            (&big.as_bytes()[..MAX + 10], HeadError::TooLarge(MAX)),
            (many.as_bytes(), HeadError::TooLarge(MAX)),
        ];
        for (text, want) in table {
            assert_eq!(
                parse(text, MAX).as_ref().map(|_| ()),
                Err(want),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn image_paths() {
        let ok = |a: &str, b: &str, c: &str| Some((a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(
            image_path("/images/s/v1.11.6/kernel-amd64"),
            ok("s", "v1.11.6", "kernel-amd64")
        );
        assert_eq!(
            image_path("/images/s/v/..%2F..%2Fplinth.db"),
            ok("s", "v", "../../plinth.db")
        );
        for bad in [
            "/images/s/v",
            "/images/s/v/f/g",
            "/images/s//f",
            "/images/../../v/f",
            "/ipxe/ipxe.efi",
            "/images/s/v/%zz",
            "/images/s/v/%ff",
            "/images/s/v/%2",
        ] {
            assert_eq!(image_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn response_heads() {
        let r = String::from_utf8(
            ResponseHead::new(StatusCode::PARTIAL_CONTENT)
                .header("Content-Length", "10")
                .finish(true, false),
        )
        .expect("utf-8");
        assert!(
            r.starts_with("HTTP/1.1 206 Partial Content\r\nDate: "),
            "{r}"
        );
        assert!(r.ends_with("GMT\r\nContent-Length: 10\r\n\r\n"), "{r}");
        let close = ResponseHead::new(StatusCode::BAD_REQUEST).finish(false, false);
        assert!(String::from_utf8_lossy(&close).ends_with("Connection: close\r\n\r\n"));
        let ka10 = ResponseHead::new(StatusCode::OK).finish(true, true);
        assert!(String::from_utf8_lossy(&ka10).ends_with("Connection: keep-alive\r\n\r\n"));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let seeds: [&[u8]; 3] = [
            b"GET /images/a/b/%41 HTTP/1.1\r\nHost: x\r\nRange: bytes=0-1\r\nContent-Length: 0\r\n\r\n",
            b"HEAD http://h/images/a/b/c?q HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            b"",
        ];
        for _ in 0..20_000 {
            let mut b = seeds[rng.gen_range(0..seeds.len())].to_vec();
            for _ in 0..rng.gen_range(1..8) {
                let at = rng.gen_range(0..=b.len());
                match rng.gen_range(0..3) {
                    0 => b.insert(at, rng.gen()),
                    1 if at < b.len() => b[at] = rng.gen(),
                    _ => b.truncate(at),
                }
            }
            for max in [16, 8192] {
                if let Ok(Some((h, used))) = parse(&b, max) {
                    assert!(used <= b.len().min(max));
                    let _ = image_path(&h.path);
                }
            }
        }
    }
}
