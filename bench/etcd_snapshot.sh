#!/usr/bin/env bash
# etcd snapshot throughput: Plinth (a release build) taking a snapshot of a Talos node (the
# tests' Talos API stand-in streaming a generated etcd database over mutual TLS) into an
# S3-compatible server (s3s-fs on loopback) -- streamed, checked (size, SHA-256, etcd's trailer,
# the revision), sealed (XChaCha20-Poly1305 STREAM), uploaded in parts, then read back, decrypted
# and verified -- against a plain `curl` upload of the same bytes to the same server, in the same
# run. Reports MB/s, the ratio (and the ratio against curl upload + download, the read-back
# Plinth's verification adds), and Plinth's peak RSS. The median of --rounds rounds.
#
# Usage: bench/etcd_snapshot.sh [--mib 256] [--rounds 3] [--big-mib 1024] [--profile release|dev]
#   --big-mib N   then one more round with an N MiB snapshot (e.g. 1024: larger than the memory
#                 Plinth may use; its peak RSS is printed).
# Needs: curl (with --aws-sigv4, 7.75+), s3s-fs (tests/setup-and-run.sh --install-only installs
# it); PostgreSQL is not needed (SQLite). The server measured is `cargo build --release`'s
# plinth; the harness (stand-in node, s3s-fs driver) is the test binary of the dev profile, whose
# cipher and RSA crates are built at opt-level 3. --profile dev measures the dev build of Plinth
# instead (dependencies at opt-level 1 except those).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh

MIB=256
ROUNDS=3
BIG=
PROFILE=release
while [ $# -gt 0 ]; do
    case "$1" in
        --mib) MIB="$2"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        --big-mib) BIG="$2"; shift 2 ;;
        --profile) PROFILE="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
export PATH="$HOME/.cargo/bin:$PATH"
require_tools curl s3s-fs cargo
target="${CARGO_TARGET_DIR:-target}"
if [ "$PROFILE" = release ]; then
    cargo build --release -j 2 --bin plinth
    # Absolute: the test starts the server from a temporary directory.
    PLINTH_BENCH_BIN="$(realpath "$target/release/plinth")"
    export PLINTH_BENCH_BIN
else
    unset PLINTH_BENCH_BIN
fi
echo "commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), profile $PROFILE"
run() {
    PLINTH_BENCH_SNAPSHOT_MIB="$1" PLINTH_BENCH_ROUNDS="$2" \
        cargo test -j 2 --test it -- --ignored --exact --nocapture \
        snapshots::etcd_snapshot_throughput_against_curl
}
run "$MIB" "$ROUNDS"
if [ -n "$BIG" ]; then
    run "$BIG" 1
fi
