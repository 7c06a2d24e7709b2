//! The fuzz targets' checks, replayed in the test suite: every input in `fuzz/regressions/<target>/`
//! (what a fuzz run once found) and `fuzz/seeds/<target>/` (the hand-made inputs a run starts
//! from: valid requests and near-misses that reach the answers' paths) goes through the same
//! function the cargo-fuzz target calls (`fuzz/checks/<target>.rs`), against the same entry
//! points: DHCP decode, decision and encode; the TFTP decoder and option negotiation; the image
//! door's request-head reader and range arithmetic. A finding panics, as it does under the fuzzer.

#[path = "../../fuzz/checks/dhcp_decode_decide.rs"]
mod dhcp_decode_decide;
#[path = "../../fuzz/checks/image_head.rs"]
mod image_head;
#[path = "../../fuzz/checks/tftp_packet.rs"]
mod tftp_packet;

use std::path::Path;

/// Run every file of `fuzz/{regressions,seeds}/<target>/` through `check`; how many there were.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    for kind in ["regressions", "seeds"] {
        let dir = root.join(kind).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<_> = entries.map(|e| e.expect("entry").path()).collect();
        files.sort();
        for f in files {
            let data = std::fs::read(&f).expect("input");
            eprintln!("{target}: {}", f.display());
            check(&data);
            n += 1;
        }
    }
    n
}

#[test]
fn fuzz_regressions_and_seeds_replay_clean() {
    for (target, check, at_least) in [
        (
            "dhcp_decode_decide",
            dhcp_decode_decide::run as fn(&[u8]),
            6,
        ),
        ("image_head", image_head::run, 8),
        ("tftp_packet", tftp_packet::run, 6),
    ] {
        let n = replay(target, check);
        assert!(n >= at_least, "{target}: {n} inputs replayed");
    }
}
