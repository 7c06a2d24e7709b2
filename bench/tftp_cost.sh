#!/usr/bin/env bash
# What one lock-step TFTP transfer costs a server, in measures a busy machine does not distort:
# system calls (strace -c -f) and context switches (/proc counters of every thread) per transfer,
# the server's CPU time per transfer (utime + stime from /proc, not wall time), and its CPU
# instructions per transfer (valgrind's callgrind, or the hardware counter through perf stat).
# curl fetches a 100 KiB file --transfers times (blksize 1468, no window: lock-step), from a
# client namespace: one curl process fetching one after another, or with --clients N, N curl
# processes released together, each fetching its share back to back (a storm of short-lived
# clients, the pattern of issue 17). Plinth (TFTP only), dnsmasq and tftpd-hpa serve the same file.
#
# Needs root, strace, curl, dnsmasq (dnsmasq-base), in.tftpd (tftpd-hpa), python3; valgrind for
# callgrind, perf (linux-perf) for perf.
# Usage: bench/tftp_cost.sh [--transfers 300] [--clients 1] [--servers "plinth dnsmasq tftpd-hpa"]
#                           [--tool "plain strace"]   (any of plain strace callgrind perf)
# Environment: PLINTH_BIN (default: target/release/plinth); KEEP_TOP=1 prints callgrind's top
# functions.
# tftpd-hpa forks a process per transfer: only its parent is measured (marked in the output).
set -euo pipefail

TRANSFERS=300
CLIENTS=1
SERVERS="plinth dnsmasq tftpd-hpa"
TOOLS="plain strace"
while [ $# -gt 0 ]; do
    case "$1" in
        --transfers) TRANSFERS="$2"; shift 2 ;;
        --clients) CLIENTS="$2"; shift 2 ;;
        --servers) SERVERS="$2"; shift 2 ;;
        --tool) TOOLS="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$CLIENTS" -ge 1 ] && [ "$TRANSFERS" -ge "$CLIENTS" ] || { echo "--clients must be 1..--transfers" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
PLINTH_BIN=${PLINTH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/plinth}
require_tools curl dnsmasq in.tftpd python3 ip
for tool in $TOOLS; do
    case "$tool" in
        plain) ;;
        strace) require_tools strace ;;
        callgrind) require_tools valgrind callgrind_annotate callgrind_control ;;
        perf) require_tools perf ;;
        *) echo "unknown tool $tool (plain strace callgrind perf)" >&2; exit 2 ;;
    esac
done

TAG=$$
SRV=pltc-s$TAG
CLI=pltc-c$TAG
WORK=$(mktemp -d /tmp/plinth-tftp-cost.XXXXXX)
chmod 755 "$WORK"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    for ns in "$SRV" "$CLI"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "$SRV"
ip netns add "$CLI"
ip link add tk0 netns "$SRV" type veth peer name tq0 netns "$CLI"
ip -n "$SRV" addr add 10.86.0.1/24 dev tk0
ip -n "$CLI" addr add 10.86.0.2/24 dev tq0
for ns in "$SRV" "$CLI"; do ip -n "$ns" link set lo up; done
ip -n "$SRV" link set tk0 up
ip -n "$CLI" link set tq0 up

mkdir -p "$WORK/tftp"
head -c 102400 /dev/urandom >"$WORK/tftp/f100k.bin"
chmod 644 "$WORK/tftp/f100k.bin"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/secret.key"
chmod 600 "$WORK/secret.key"
cat >"$WORK/plinth.toml" <<EOF
data_dir = "$WORK/data"
[http]
listen = "127.0.0.1:0"
[secrets]
key_file = "$WORK/secret.key"
[boot]
ipxe_dir = "$WORK/tftp"
[tftp]
enabled = true
listen = "10.86.0.1:69"
EOF

cpu_and_switches() { # $1 pid: "utime+stime ticks, context switches" over all threads
    local t=0 c=0 f
    for f in /proc/"$1"/task/*; do
        t=$((t + $(awk '{print $14 + $15}' "$f/stat" 2>/dev/null || echo 0)))
        c=$((c + $(awk '/ctxt_switches/ {s += $2} END {print s+0}' "$f/status" 2>/dev/null || echo 0)))
    done
    echo "$t $c"
}

# The clients: --clients curl processes, each fetching its share of --transfers back to back (one
# process: no start-up between its transfers). Every process exists before the release (it waits
# for a line on stdin), so the release starts transfers, not processes.
cat >"$WORK/clients.py" <<'EOF'
import subprocess, sys
n, clients = int(sys.argv[1]), int(sys.argv[2])
def cmd(k):
    urls = []
    for _ in range(k):
        urls += ["-o", "/dev/null", "tftp://10.86.0.1/f100k.bin"]
    return ["curl", "-sf", "--max-time", "600", "--tftp-blksize", "1468"] + urls
procs = []
for i in range(clients):
    k = n // clients + (1 if i < n % clients else 0)
    procs.append(subprocess.Popen(["sh", "-c", "read go; exec \"$@\"", "client"] + cmd(k),
                                  stdin=subprocess.PIPE))
for p in procs:
    p.stdin.write(b"go\n"); p.stdin.flush()
for p in procs:
    p.stdin.close()
failed = sum(1 for p in procs if p.wait() != 0)
if failed:
    print("%d of %d clients failed" % (failed, clients), file=sys.stderr)
sys.exit(1 if failed else 0)
EOF

for s in $SERVERS; do
    for mode in $TOOLS; do
        pre=""
        case "$mode" in
            strace) pre="strace -f -c -o $WORK/$s.strace" ;;
            callgrind) pre="valgrind --tool=callgrind --trace-children=no --callgrind-out-file=$WORK/$s.callgrind" ;;
        esac
        case "$s" in
            plinth) RUST_LOG=warn ip netns exec "$SRV" $pre "$PLINTH_BIN" serve --config "$WORK/plinth.toml" >"$WORK/$s.log" 2>&1 & ;;
            dnsmasq) ip netns exec "$SRV" $pre dnsmasq --no-daemon --conf-file=/dev/null --port=0 --user=root \
                --bind-interfaces --interface=tk0 --enable-tftp --tftp-root="$WORK/tftp" --tftp-max=1000 \
                --quiet-tftp --pid-file="$WORK/dnsmasq.pid" >"$WORK/$s.log" 2>&1 & ;;
            tftpd-hpa) ip netns exec "$SRV" $pre in.tftpd -L -u nobody -a 10.86.0.1:69 -s "$WORK/tftp" >"$WORK/$s.log" 2>&1 & ;;
        esac
        SERVER_PID=$!
        for _ in $(seq 1 600); do
            ip netns exec "$CLI" curl -sf --max-time 2 -o /dev/null "tftp://10.86.0.1/f100k.bin" && break
            sleep 0.1
        done
        pid=$(for p in $(ip netns pids "$SRV"); do
            if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qE "($PLINTH_BIN|dnsmasq|in.tftpd) "; then echo "$p"; fi
        done | tail -1)
        # Start-up and the warm-up transfer are not the cost of a transfer.
        [ "$mode" != callgrind ] || callgrind_control -z "$pid" >/dev/null 2>&1 || true
        PERF_PID=""
        if [ "$mode" = perf ]; then
            perf stat -e instructions,cycles,task-clock -p "$pid" -o "$WORK/$s.perf" &
            PERF_PID=$!
            sleep 0.5
        fi
        read -r t0 c0 < <(cpu_and_switches "$pid")
        start=$(date +%s.%N)
        ip netns exec "$CLI" python3 "$WORK/clients.py" "$TRANSFERS" "$CLIENTS"
        end=$(date +%s.%N)
        read -r t1 c1 < <(cpu_and_switches "$pid")
        if [ -n "$PERF_PID" ]; then kill -INT "$PERF_PID" 2>/dev/null || true; wait "$PERF_PID" 2>/dev/null || true; fi
        kill -INT "$pid" 2>/dev/null || true
        for _ in $(seq 1 300); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
        for p in $(ip netns pids "$SRV" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        hz=$(getconf CLK_TCK)
        parent=""
        [ "$s" = tftpd-hpa ] && parent=" (parent only: children not counted)"
        case "$mode" in
            plain)
                python3 -c "import sys; n,t,c,w,hz=map(float,sys.argv[1:6]); print('%-10s %d transfers (%s clients) in %.2f s wall; server CPU %.3f ms and %.1f context switches per transfer%s' % (sys.argv[6], n, sys.argv[7], w, 1000*t/hz/n, c/n, sys.argv[8]))" \
                    "$TRANSFERS" "$((t1 - t0))" "$((c1 - c0))" "$(echo "$end - $start" | bc)" "$hz" "$s" "$CLIENTS" "$parent" ;;
            strace)
                awk -v n="$TRANSFERS" -v s="$s" '$NF == "total" {printf "%-10s strace: %.1f system calls per transfer (whole run; %d transfers)\n", s, $4/n, n}
                    $NF ~ /^(futex|epoll_wait|sendto|sendmsg|recvfrom|recvmsg|write|openat|statx|newfstatat|socket|bind|connect|epoll_ctl|clone3|poll)$/ {printf "    %-12s %.2f per transfer\n", $NF, $4/n}' "$WORK/$s.strace" ;;
            callgrind)
                total=$(callgrind_annotate "$WORK/$s.callgrind" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}') || true
                callgrind_annotate --inclusive=yes "$WORK/$s.callgrind" 2>/dev/null | head -60 >"$WORK/$s.top" || true
                python3 -c "import sys; t, n = float(sys.argv[1] or 0), float(sys.argv[2]); print('%-10s callgrind: %.0f instructions per transfer (%d transfers, %s clients; counters zeroed after start-up)%s' % (sys.argv[3], t / n, n, sys.argv[4], sys.argv[5]))" \
                    "${total:-0}" "$TRANSFERS" "$s" "$CLIENTS" "$parent"
                [ -z "${KEEP_TOP:-}" ] || cat "$WORK/$s.top" ;;
            perf)
                awk -v n="$TRANSFERS" -v s="$s" -v p="$parent" '
                    $2 ~ /^instructions/ {gsub(",", "", $1); i=$1} $2 ~ /^cycles/ {gsub(",", "", $1); c=$1}
                    END {printf "%-10s perf: %.0f instructions and %.0f cycles per transfer%s\n", s, i/n, c/n, p}' "$WORK/$s.perf" ;;
        esac
    done
done
