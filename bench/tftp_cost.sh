#!/usr/bin/env bash
# What one lock-step TFTP transfer costs a server, in measures a busy machine does not distort:
# system calls (strace -c -f) and context switches (/proc counters of every thread) per transfer,
# and the server's CPU time per transfer (utime + stime from /proc, not wall time). curl fetches a
# 100 KiB file --transfers times, one after another (blksize 1468, no window: lock-step), from a
# client namespace; Plinth (TFTP only), dnsmasq and tftpd-hpa serve the same file.
#
# Needs root, strace, curl, dnsmasq (dnsmasq-base), in.tftpd (tftpd-hpa), python3.
# Usage: bench/tftp_cost.sh [--transfers 300] [--servers "plinth dnsmasq tftpd-hpa"]
# Environment: PLINTH_BIN (default: target/release/plinth).
set -euo pipefail

TRANSFERS=300
SERVERS="plinth dnsmasq tftpd-hpa"
while [ $# -gt 0 ]; do
    case "$1" in
        --transfers) TRANSFERS="$2"; shift 2 ;;
        --servers) SERVERS="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
PLINTH_BIN=${PLINTH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/plinth}
require_tools strace curl dnsmasq in.tftpd python3 ip

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

for s in $SERVERS; do
    for mode in plain strace; do
        pre=""
        [ "$mode" = strace ] && pre="strace -f -c -o $WORK/$s.strace"
        case "$s" in
            plinth) RUST_LOG=warn ip netns exec "$SRV" $pre "$PLINTH_BIN" serve --config "$WORK/plinth.toml" >"$WORK/$s.log" 2>&1 & ;;
            dnsmasq) ip netns exec "$SRV" $pre dnsmasq --no-daemon --conf-file=/dev/null --port=0 --user=root \
                --bind-interfaces --interface=tk0 --enable-tftp --tftp-root="$WORK/tftp" --tftp-max=1000 \
                --quiet-tftp --pid-file="$WORK/dnsmasq.pid" >"$WORK/$s.log" 2>&1 & ;;
            tftpd-hpa) ip netns exec "$SRV" $pre in.tftpd -L -u nobody -a 10.86.0.1:69 -s "$WORK/tftp" >"$WORK/$s.log" 2>&1 & ;;
        esac
        SERVER_PID=$!
        for _ in $(seq 1 300); do
            ip netns exec "$CLI" curl -sf --max-time 2 -o /dev/null "tftp://10.86.0.1/f100k.bin" && break
            sleep 0.1
        done
        pid=$(for p in $(ip netns pids "$SRV"); do
            case "$(cat /proc/"$p"/comm 2>/dev/null)" in plinth|dnsmasq|in.tftpd) echo "$p" ;; esac
        done | head -1)
        read -r t0 c0 < <(cpu_and_switches "$pid")
        start=$(date +%s.%N)
        ip netns exec "$CLI" python3 - "$TRANSFERS" <<'EOF'
import subprocess, sys
n = int(sys.argv[1])
urls = []
for _ in range(n):
    urls += ["-o", "/dev/null", "tftp://10.86.0.1/f100k.bin"]
# One curl process: its transfers one after another, no process start-up between them.
sys.exit(subprocess.run(["curl", "-sf", "--tftp-blksize", "1468"] + urls).returncode)
EOF
        end=$(date +%s.%N)
        # tftpd-hpa forks a child per transfer: its counters are the children's, not read here.
        read -r t1 c1 < <(cpu_and_switches "$pid")
        kill -INT "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
        hz=$(getconf CLK_TCK)
        if [ "$mode" = plain ]; then
            python3 -c "import sys; n,t,c,w,hz=map(float,sys.argv[1:6]); print('%-10s %d transfers in %.2f s wall; server CPU %.3f ms and %.1f context switches per transfer%s' % (sys.argv[6], n, w, 1000*t/hz/n, c/n, ' (parent only: children not counted)' if sys.argv[6]=='tftpd-hpa' else ''))" \
                "$TRANSFERS" "$((t1 - t0))" "$((c1 - c0))" "$(echo "$end - $start" | bc)" "$hz" "$s"
        else
            awk -v n="$TRANSFERS" -v s="$s" '$NF == "total" {printf "%-10s strace: %.1f system calls per transfer (whole run; %d transfers)\n", s, $4/n, n}
                $NF ~ /^(futex|epoll_wait|sendto|sendmsg|recvfrom|recvmsg|write|openat|statx|newfstatat|socket|bind|connect|epoll_ctl|clone3|poll)$/ {printf "    %-12s %.2f per transfer\n", $NF, $4/n}' "$WORK/$s.strace"
        fi
    done
done
