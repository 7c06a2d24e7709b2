//! Fuzz the TFTP front door's packet handling with arbitrary bytes: the input is a datagram on the
//! server port (RRQ, WRQ or anything), then the datagrams a client sends during the transfer,
//! separated by `0xfe` bytes. The request is decoded (`wire::parse_request`), its options
//! negotiated against the server's limits for a file whose length comes from the input
//! (`transfer::negotiate`), the OACK decoded again, and every later datagram decoded as a reply
//! (`wire::parse_reply`). A panic, a granted value outside the limits (block size, window, the
//! retransmission timeout and its retry budget), or an OACK that names an option the client did
//! not ask for or a value that differs from the one used, is a finding.
//!
//! Shared by the fuzz target (`fuzz/fuzz_targets/tftp_packet.rs`) and the replay of
//! `fuzz/regressions/tftp_packet/` and `fuzz/seeds/tftp_packet/` in `tests/it/fuzz_replay.rs`.

use plinth::tftp::transfer::{self, Limits, MAX_TIMEOUT, RETRY_BUDGET};
use plinth::tftp::wire::{self, Request};

const LIMITS: Limits = Limits {
    max_block_size: 1468,
    max_window_size: 16,
};

/// The `(name, value)` pairs of an OACK.
fn oack_pairs(p: &[u8]) -> Vec<(String, String)> {
    assert_eq!(&p[..2], &[0, 6], "an OACK");
    assert_eq!(p.last(), Some(&0), "NUL-terminated");
    let fields: Vec<&[u8]> = p[2..p.len() - 1].split(|&b| b == 0).collect();
    assert_eq!(fields.len() % 2, 0, "pairs");
    fields
        .chunks(2)
        .map(|c| {
            (
                String::from_utf8(c[0].to_vec()).expect("name"),
                String::from_utf8(c[1].to_vec()).expect("value"),
            )
        })
        .collect()
}

/// One input, checked as the module's paragraph says; panics on a finding.
pub fn run(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0xfe);
    let first = parts.next().unwrap_or_default();
    let (len, request) = match first.split_at_checked(6) {
        Some((l, r)) => {
            let mut b = [0u8; 8];
            b[..6].copy_from_slice(l);
            (u64::from_le_bytes(b), r)
        }
        None => (0, first),
    };
    let Some(req) = wire::parse_request(request) else {
        return;
    };
    let Request::Read {
        filename, options, ..
    } = req
    else {
        return;
    };
    assert!(!filename.is_empty());
    let n = transfer::negotiate(&options, LIMITS, len);
    assert!((8..=LIMITS.max_block_size).contains(&n.blksize), "{n:?}");
    assert!(
        (1..=LIMITS.max_window_size).contains(&n.windowsize),
        "{n:?}"
    );
    assert!(
        n.timeout.as_secs() >= 1 && n.timeout.as_secs() <= u64::from(MAX_TIMEOUT),
        "{n:?}"
    );
    assert!(n.retries >= 1, "{n:?}");
    assert!(n.timeout * n.retries <= RETRY_BUDGET, "{n:?}");
    if let Some(oack) = &n.oack {
        for (name, value) in oack_pairs(oack) {
            match name.as_str() {
                "blksize" => {
                    assert!(options.blksize.is_some());
                    assert_eq!(value, n.blksize.to_string());
                }
                "timeout" => {
                    assert_eq!(options.timeout.map(u64::from), Some(n.timeout.as_secs()));
                    assert_eq!(value, n.timeout.as_secs().to_string());
                }
                "tsize" => {
                    assert!(options.tsize.is_some());
                    assert_eq!(value, len.to_string());
                }
                "windowsize" => {
                    assert!(options.windowsize.is_some());
                    assert_eq!(value, n.windowsize.to_string());
                }
                other => panic!("granted an option nobody asked for: {other}"),
            }
        }
    }
    for reply in parts {
        let _ = wire::parse_reply(reply);
    }
}
