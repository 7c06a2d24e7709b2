//! Fuzz the image door's request-head reading with arbitrary bytes: `httparse`, the door's own
//! rules (Host, Content-Length lists, Transfer-Encoding, Connection, the request target in origin
//! or absolute form), the `/images/{schematic}/{version}/{file}` path with its percent-decoding,
//! and the answer's range arithmetic for a file whose length comes from the input. A panic, a
//! head said to take more bytes than it was given or than the limit, a body outside the file, or
//! a decoded path segment that names a directory is a finding.
//!
//! Shared by the fuzz target (`fuzz/fuzz_targets/image_head.rs`) and the replay of
//! `fuzz/regressions/image_head/` and `fuzz/seeds/image_head/` in `tests/it/fuzz_replay.rs`.

use plinth::http::images_listener::read_head_bytes;

/// The door's limit on a head (its default).
const MAX: usize = 16 * 1024;

/// One input, checked as the module's paragraph says; panics on a finding.
pub fn run(data: &[u8]) {
    // The first eight bytes are the file's length (so the range arithmetic meets every size);
    // the rest is what the client sent.
    let (len, head) = match data.split_at_checked(8) {
        Some((l, h)) => (u64::from_le_bytes(l.try_into().expect("8 bytes")), h),
        None => (0, data),
    };
    let len = len % (1 << 40);
    match read_head_bytes(head, MAX, len) {
        Err(status) => assert!(status == 400 || status == 431, "refused with {status}"),
        Ok(None) => assert!(head.len() < MAX, "a partial head past the limit is refused"),
        Ok(Some(r)) => {
            assert!(r.used > 0 && r.used <= head.len() && r.used <= MAX, "{r:?}");
            assert!(r.start.saturating_add(r.body_len) <= len, "{r:?} of {len}");
            if let Some(n) = r.content_length {
                assert!(n <= len, "{r:?} of {len}");
            }
            // A body is the whole answer or none (HEAD).
            assert!(
                r.body_len == 0 || r.content_length == Some(r.body_len),
                "{r:?}"
            );
            if let Some((s, v, f)) = &r.image {
                for seg in [s, v, f] {
                    assert!(!seg.is_empty(), "{r:?}");
                }
                // What the door then looks up in the image cache: names it accepts never leave
                // the cache (no separator, no `.` or `..`, no NUL).
                let cache = plinth::images::ImageCache::new("/nonexistent/plinth-fuzz-cache");
                if cache.path(s, v, f).is_ok() {
                    for seg in [s, v, f] {
                        assert!(
                            !seg.contains(['/', '\\', '\0']) && seg != "." && seg != "..",
                            "the cache accepts {seg:?}: {r:?}"
                        );
                    }
                }
            }
            match r.status {
                200 => assert_eq!((r.start, r.content_length), (0, Some(len)), "{r:?}"),
                206 => assert!(r.content_length.is_some_and(|n| n > 0), "{r:?}"),
                304 | 416 => assert_eq!(r.body_len, 0, "{r:?}"),
                other => panic!("answered {other}: {r:?}"),
            }
        }
    }
}
