#!/usr/bin/env bash
# What one DORA costs a DHCP server, in measures a busy machine does not distort: CPU instructions
# (valgrind's callgrind counts them, whatever else runs on the cores), system calls and context
# switches (strace -c -f; /proc's counters), and for Plinth its own /metrics (group-commit
# transactions per ACK: on SQLite each is one fsync). perfdhcp plays --clients clients at a low
# rate (--rate, default 50/s: slow enough for a server running under valgrind) from a client
# namespace; every server starts fresh with an empty lease database.
#
# Needs root, valgrind, strace, perfdhcp (kea-admin), kea-dhcp4 (kea-dhcp4-server), python3.
# Usage: bench/dhcp_cost.sh [--servers "plinth-sqlite plinth-postgres kea-mt"] [--clients 1000]
#                           [--rate 50] [--tool "callgrind strace"]
# Environment: PLINTH_BIN (default: target/release/plinth), DATABASE_URL (plinth-postgres).
# Prints per server and tool: instructions per DORA (the server's process, all threads; for
# plinth-postgres the PostgreSQL backends are not counted), system calls and context switches per
# DORA, and the top functions by inclusive instructions (callgrind_annotate) in $OUT (a directory
# kept after the run).
set -euo pipefail

SERVERS="plinth-sqlite plinth-postgres kea-mt"
CLIENTS=1000
RATE=50
TOOLS="callgrind strace"
while [ $# -gt 0 ]; do
    case "$1" in
        --servers) SERVERS="$2"; shift 2 ;;
        --clients) CLIENTS="$2"; shift 2 ;;
        --rate) RATE="$2"; shift 2 ;;
        --tool) TOOLS="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
PLINTH_BIN=${PLINTH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/plinth}
PG_ADMIN=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
require_tools valgrind strace perfdhcp kea-dhcp4 python3 ip curl
[ -x "$PLINTH_BIN" ] || { echo "no $PLINTH_BIN: cargo build --release --bin plinth" >&2; exit 1; }

TAG=$$
SRV=plc-s$TAG
CLI=plc-c$TAG
OUT=${OUT:-$(mktemp -d /tmp/plinth-dhcp-cost.XXXXXX)}
SERVER_PID=""
PG_DB=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    for p in $(ip netns pids "$SRV" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$SRV" 2>/dev/null || true
    ip netns del "$CLI" 2>/dev/null || true
    if [ -n "$PG_DB" ]; then psql "$PG_ADMIN" -qc "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

ip netns add "$SRV"
ip netns add "$CLI"
ip link add ks0 netns "$SRV" type veth peer name kc0 netns "$CLI"
ip -n "$SRV" addr add 10.87.0.1/16 dev ks0
ip -n "$CLI" addr add 10.87.0.2/16 dev kc0
for ns in "$SRV" "$CLI"; do ip -n "$ns" link set lo up; done
ip -n "$SRV" link set ks0 up
ip -n "$CLI" link set kc0 up

PG_SOCKET_DIR=${PLINTH_PG_SOCKET_DIR:-/var/run/postgresql}

# The server's command line (stdout): $1 server, $2 working directory.
server_cmd() {
    local dir=$2
    mkdir -p "$dir"
    case "$1" in
        plinth-*)
            local url="sqlite://$dir/plinth.db"
            if [ "$1" = plinth-postgres ]; then
                PG_DB=plinth_cost_$TAG
                psql "$PG_ADMIN" -qc "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null
                psql "$PG_ADMIN" -qc "CREATE DATABASE $PG_DB" >/dev/null
                url="postgres://postgres@localhost/$PG_DB?host=$PG_SOCKET_DIR"
            fi
            head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret.key"
            chmod 600 "$dir/secret.key"
            cat >"$dir/plinth.toml" <<EOF
data_dir = "$dir"
[database]
url = "$url"
[http]
listen = "127.0.0.1:9101"
[secrets]
key_file = "$dir/secret.key"
[dhcp]
enabled = true
interfaces = ["ks0"]
proxy_port = 0
boot_url = "http://10.87.0.1:8080"
unknown_clients_per_second = 0
[[dhcp.subnet]]
cidr = "10.87.0.0/16"
server_ip = "10.87.0.1"
pool = ["10.87.1.0-10.87.255.254"]
lease_seconds = 3600
unknown_share = 1.0
EOF
            echo "$PLINTH_BIN serve --config $dir/plinth.toml" ;;
        kea-mt)
            cat >"$dir/kea.json" <<EOF
{ "Dhcp4": {
    "interfaces-config": { "interfaces": ["ks0"], "dhcp-socket-type": "udp" },
    "lease-database": { "type": "memfile", "persist": true, "name": "$dir/leases.csv", "lfc-interval": 0 },
    "valid-lifetime": 3600,
    "multi-threading": { "enable-multi-threading": true, "thread-pool-size": 2, "packet-queue-size": 256 },
    "subnet4": [ { "id": 1, "subnet": "10.87.0.0/16", "pools": [ { "pool": "10.87.1.0 - 10.87.255.254" } ] } ],
    "loggers": [ { "name": "kea-dhcp4", "severity": "ERROR", "output_options": [ { "output": "$dir/kea.log" } ] } ]
} }
EOF
            echo "kea-dhcp4 -c $dir/kea.json" ;;
        *) echo "unknown server $1" >&2; exit 2 ;;
    esac
}

wait_port67() {
    for _ in $(seq 1 600); do
        if ip netns exec "$SRV" ss -ulnH 'sport = :67' | grep -q .; then return 0; fi
        sleep 0.1
    done
    echo "server did not bind port 67" >&2
    return 1
}

# perfdhcp: $CLIENTS DORAs at $RATE/s; prints the completed 4-way exchanges.
load() {
    local secs=$(( (CLIENTS + RATE - 1) / RATE ))
    ip netns exec "$CLI" timeout --signal=INT $((secs + 30)) perfdhcp -4 -l kc0 -r "$RATE" \
        -n "$CLIENTS" -R "$CLIENTS" -p "$secs" -d 2 10.87.0.1 >"$1" 2>&1 || true
    python3 - "$1" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"\*\*\*Statistics for: REQUEST-ACK\*\*\*.*?^received packets: (\d+)", t, re.S | re.M)
print(m.group(1) if m else 0)
EOF
}

for s in $SERVERS; do
    for tool in $TOOLS; do
        dir=$OUT/$s-$tool
        rm -rf "$dir"
        cmd=$(server_cmd "$s" "$dir")
        export KEA_PIDFILE_DIR=$dir KEA_LOCKFILE_DIR=$dir
        case "$tool" in
            callgrind)
                # --separate-threads=no: one total over every thread of the process.
                RUST_LOG=error ip netns exec "$SRV" valgrind --tool=callgrind --trace-children=no \
                    --callgrind-out-file="$dir/callgrind.out" $cmd >"$dir/out.log" 2>&1 &
                SERVER_PID=$! ;;
            strace)
                RUST_LOG=error ip netns exec "$SRV" strace -f -c -o "$dir/strace.txt" $cmd >"$dir/out.log" 2>&1 &
                SERVER_PID=$! ;;
        esac
        wait_port67
        sleep 2
        pid=$(ip netns pids "$SRV" | while read -r p; do
            if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qE "($PLINTH_BIN|kea-dhcp4) "; then echo "$p"; fi
        done | tail -1) || true
        # Start-up (migrations, schema reads, Kea's configuration) is not the cost of a DORA.
        [ "$tool" != callgrind ] || callgrind_control -z "$pid" >/dev/null 2>&1 || true
        ctx0=$(awk '/ctxt_switches/ {s += $2} END {print s+0}' /proc/"$pid"/task/*/status 2>/dev/null || echo 0)
        acks=$(load "$dir/perfdhcp.txt")
        ctx1=$(awk '/ctxt_switches/ {s += $2} END {print s+0}' /proc/"$pid"/task/*/status 2>/dev/null || echo 0)
        extra=""
        if [ "${s%%-*}" = plinth ]; then
            extra=$(ip netns exec "$SRV" curl -sf --max-time 20 http://127.0.0.1:9101/metrics | awk '
                /^plinth_store_commits_total / {c=$2} /^plinth_store_commit_writes_sum / {w=$2}
                /^plinth_dhcp_replies_total\{kind="ack"\}/ {a=$2}
                END {if (a > 0) printf "group-commit transactions per ACK %.3f (writes per transaction %.1f)", c/a, (c>0?w/c:0)}')
        fi
        # The server itself (strace and valgrind end with it and write their reports).
        kill -INT "$pid" 2>/dev/null || true
        for _ in $(seq 1 300); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
        for p in $(ip netns pids "$SRV" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        case "$tool" in
            callgrind)
                total=$(callgrind_annotate "$dir/callgrind.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}') || true
                callgrind_annotate --inclusive=yes "$dir/callgrind.out" 2>/dev/null | head -60 >"$dir/top.txt" || true
                python3 -c "import sys; t, a = float(sys.argv[1] or 0), float(sys.argv[2] or 0); print('%-16s callgrind: %d DORAs, %.0f instructions per DORA (%s during the load, counters zeroed after start-up)' % (sys.argv[3], a, t / a if a else float('nan'), sys.argv[1]))" "${total:-0}" "$acks" "$s" ;;
            strace)
                calls=$(awk '$NF == "total" {print $4; exit}' "$dir/strace.txt" 2>/dev/null || echo 0)
                python3 -c "import sys; c, a, x = float(sys.argv[1] or 0), float(sys.argv[2] or 0), float(sys.argv[4]); print('%-16s strace: %d DORAs, %.1f system calls per DORA (whole run), %.1f context switches per DORA (under strace)' % (sys.argv[3], a, c / a if a else float('nan'), x / a if a else float('nan')))" "$calls" "$acks" "$s" "$((ctx1 - ctx0))"
                # strace -c columns: % time, seconds, usecs/call, calls, [errors], syscall.
                awk -v a="$acks" '$NF ~ /^(fsync|fdatasync|sendmsg|sendto|recvmsg|recvfrom|futex|epoll_wait|write|pwrite64|pread64)$/ {printf "    %-14s %8d calls  %.2f per DORA\n", $NF, $4, $4/(a>0?a:1)}' "$dir/strace.txt" || true ;;
        esac
        [ -z "$extra" ] || echo "    $extra"
        if [ -n "$PG_DB" ]; then psql "$PG_ADMIN" -qc "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1 || true; PG_DB=""; fi
    done
done
echo "details (callgrind_annotate top functions, strace tables): $OUT"
