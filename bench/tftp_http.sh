#!/usr/bin/env bash
# TFTP and HTTP boot-serving benchmark: Plinth against tftpd-hpa, dnsmasq and nginx, in the same
# run, from a client namespace joined to the servers' namespace by a veth pair (real packets, not
# loopback shortcuts). Every server serves the same files from the same inodes.
#
# TFTP (completions per second, N clients each downloading in a loop for --seconds):
#   files of 100 KiB and 1 MiB; 20 and 100 concurrent clients; curl with blksize 512 and 1468,
#   atftp with blksize 1468, and atftp with blksize 1468 + windowsize 16 (RFC 7440; only Plinth
#   grants it, the peers answer without it and run lock-step). Then one client alone, atftp with
#   windowsize 16, on a 1 MiB and a 16 MiB file, and lock-step (curl and atftp, blksize 1468, no
#   window) on the 1 MiB file: MB/s of a single transfer.
# TFTP storm ("storm", transfers per second): 20 and 100 curl clients started first and then
#   released together by a barrier, each fetching the file --storm-fetches times back to back in
#   one curl process (no process start-up between its transfers), lock-step (blksize 512 and
#   1468), 100 KiB and 1 MiB; the rate is all transfers over the time from the release to the
#   last client's end. Short-lived clients that arrive together: the pattern where each
#   transfer's set-up and first block weigh most.
# HTTP (MB/s): a 100 MiB initramfs from Plinth's image cache (`plinth image import`) and from
#   nginx (Debian defaults that matter: sendfile on, tcp_nopush on, one worker per core): one
#   stream (curl in a loop), and 50 concurrent downloads (one wave of 50 curls). Plinth twice:
#   its image door (`[boot].images_listen`, sendfile; the "plinth" line and the ratio) and the
#   same file through the main port's hyper route ("plinth-hyper", buffered copies).
# Boot scripts (requests/s): wrk, 64 connections, on the per-machine iPXE script of a machine
#   declared with `plinth apply`: once in its provisioning window (the install script: config
#   rendered and validated, a config token minted, an event written, per request) and once
#   waiting for an operator (hold script). nginx serving a static file of the install script's
#   size is printed as a reference point only: it does none of that work.
#
# Each case runs --rounds times, the servers interleaved within a round; the median is reported,
# and the ratio is Plinth over the best peer (TFTP) or over nginx (HTTP). The machine the figures
# in README.md come from is small and shared: trust ratios of the same run, not absolute values.
#
# Needs root, ip, python3, curl, atftp, in.tftpd (tftpd-hpa), dnsmasq (dnsmasq-base), nginx
# (nginx-light), wrk. Usage:
#   bench/tftp_http.sh [--rounds 3] [--seconds 5] [--only "tftp storm single http wrk"] [--raw FILE]
#     [--match REGEX]   (TFTP load, storm and single cases whose name, e.g. "tftp f1m.bin x20 curl-512", matches)
#     [--storm-fetches 5]
#     [--tftp-peers "tftpd-hpa dnsmasq"]   (the TFTP peers measured beside Plinth)
# Environment: PLINTH_BIN (default: $CARGO_TARGET_DIR or target, /release/plinth, built if missing),
#   PLINTH_SCHEMA_DIR (Talos JSON schemas; default ../shared/talos/schemas when present).
# Peer settings worth knowing: dnsmasq gets --tftp-max=1000 (its default of 50 concurrent
# transfers would refuse clients of the 100-client cases); tftpd-hpa runs as `in.tftpd -L`
# (a process per transfer, its normal mode). Plinth logs at its default level (info) to a file.
set -euo pipefail

ROUNDS=3
SECS=5
ONLY="tftp storm single http wrk"
STORM_FETCHES=5
TFTP_PEERS="tftpd-hpa dnsmasq"
RAW=""
MATCH=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --seconds) SECS="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --raw) RAW="$2"; shift 2 ;;
        --match) MATCH="$2"; shift 2 ;;
        --storm-fetches) STORM_FETCHES="$2"; shift 2 ;;
        --tftp-peers) TFTP_PEERS="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
want() { case " $ONLY " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
PLINTH_BIN=${PLINTH_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/plinth}
SCHEMA_DIR=${PLINTH_SCHEMA_DIR:-$ROOT/../shared/talos/schemas}
require_tools ip python3 curl atftp in.tftpd dnsmasq nginx wrk
if [ ! -x "$PLINTH_BIN" ]; then
    (cd "$ROOT" && cargo build --release --bin plinth)
fi

TAG=$$
SRV=plt-s$TAG
CLI=plt-c$TAG
WORK=$(mktemp -d /tmp/plinth-tftp-http.XXXXXX)
chmod 755 "$WORK" # tftpd-hpa and nginx workers run as unprivileged users
PIDS=()

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    # Anything still running in the namespaces was started here (a tftpd child, a client): it
    # must not outlive the run, nor keep the caller's lock file open.
    for ns in "$SRV" "$CLI"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    done
    ip netns del "$SRV" 2>/dev/null || true
    ip netns del "$CLI" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

S_IP=10.89.0.1
ip netns add "$SRV"
ip netns add "$CLI"
ip link add ts0 netns "$SRV" type veth peer name tc0 netns "$CLI"
ip -n "$SRV" addr add $S_IP/24 dev ts0
ip -n "$CLI" addr add 10.89.0.2/24 dev tc0
for ns in "$SRV" "$CLI"; do ip -n "$ns" link set lo up; done
ip -n "$SRV" link set ts0 up
ip -n "$CLI" link set tc0 up
in_srv() { ip netns exec "$SRV" "$@"; }
in_cli() { ip netns exec "$CLI" "$@"; }

# ---------------------------------------------------------------------------------------------
# Files: TFTP files in one directory (Plinth's boot.ipxe_dir, the peers' roots); the initramfs
# imported into Plinth's image cache and hard-linked into nginx's root (same inode, same cache).
TFTP_DIR=$WORK/tftp
mkdir -p "$TFTP_DIR" "$WORK/www"
head -c 102400 /dev/urandom >"$TFTP_DIR/f100k.bin"
head -c 1048576 /dev/urandom >"$TFTP_DIR/f1m.bin"
head -c 16777216 /dev/urandom >"$TFTP_DIR/f16m.bin"
chmod 644 "$TFTP_DIR"/*
head -c 104857600 /dev/urandom >"$WORK/initramfs"
head -c 1048576 /dev/urandom >"$WORK/kernel"

TALOS=v1.11.6
VANILLA=376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba
CFG=$WORK/plinth.toml
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/secret.key"
chmod 600 "$WORK/secret.key" # Plinth refuses a key others may read
{
    cat <<EOF
data_dir = "$WORK/data"
[http]
listen = "$S_IP:8080"
[secrets]
key_file = "$WORK/secret.key"
[boot]
public_url = "http://$S_IP:8080"
ipxe_dir = "$TFTP_DIR"
images_listen = "$S_IP:8082"
[tftp]
enabled = true
listen = "$S_IP:6969"
max_block_size = 1468
max_window_size = 16
EOF
    if [ -d "$SCHEMA_DIR" ]; then printf '[talos]\nschema_dir = "%s"\n' "$SCHEMA_DIR"; fi
} >"$CFG"
plinth() { "$PLINTH_BIN" "$@"; }
plinth image import --config "$CFG" --version $TALOS --arch amd64 \
    --kernel "$WORK/kernel" --initramfs "$WORK/initramfs" >/dev/null
IMG_PATH=images/$VANILLA/$TALOS/initramfs-amd64.xz
mkdir -p "$WORK/www/$(dirname "$IMG_PATH")"
ln "$WORK/data/$IMG_PATH" "$WORK/www/$IMG_PATH"
chmod -R a+rX "$WORK/data/images" "$WORK/www"

# Two machines, declared: one to be provisioned (install script), one left waiting (hold).
MAC_INSTALL=52:54:00:be:0c:01
MAC_HOLD=52:54:00:be:0c:02
UUID_INSTALL=7b1f2a3c-0d4e-4f5a-8b6c-1d2e3f405161
UUID_HOLD=7b1f2a3c-0d4e-4f5a-8b6c-1d2e3f405162
plinth cluster init bench --endpoint https://10.89.0.10:6443 --out "$WORK/secrets.yaml" 2>/dev/null
INV=$WORK/inventory
mkdir -p "$INV/clusters" "$INV/profiles" "$INV/machines"
printf 'kind: Cluster\nname: bench\nendpoint: https://10.89.0.10:6443\ntalosVersion: %s\nsecrets: %s\n' \
    $TALOS "$WORK/secrets.yaml" >"$INV/clusters/bench.yaml"
printf 'kind: Profile\nname: std\ninstallDisk:\n  type: ssd\n  size: [">= 8GB", "<= 64GB"]\n  prefer: smallest\n' \
    >"$INV/profiles/std.yaml"
for m in "bench-install $MAC_INSTALL $UUID_INSTALL" "bench-hold $MAC_HOLD $UUID_HOLD"; do
    set -- $m
    printf 'kind: Machine\nhostname: %s\nsmbios_uuid: %s\nrole: worker\ncluster: bench\nprofile: std\ninterfaces:\n  - mac: "%s"\n    boot: true\ndisks:\n  - serial: S%s\n    model: BENCH SSD\n    size_bytes: 17179869184\n    type: ssd\n' \
        "$1" "$3" "$2" "${2//:/}" >"$INV/machines/$1.yaml"
done
plinth apply "$INV" --config "$CFG" >"$WORK/apply.log" 2>&1 || { cat "$WORK/apply.log" >&2; exit 1; }
TOKEN=$(plinth token create --role operator --config "$CFG")

# ---------------------------------------------------------------------------------------------
# Servers, all in the server namespace at once on their own ports (idle ones cost nothing),
# started without a wrapper function so that $! is the server itself.
ip netns exec "$SRV" "$PLINTH_BIN" serve --config "$CFG" >"$WORK/plinth.log" 2>&1 &
PIDS+=($!)
ip netns exec "$SRV" in.tftpd -L -u nobody -a $S_IP:6970 -s "$TFTP_DIR" >"$WORK/tftpd.log" 2>&1 &
PIDS+=($!)
ip netns exec "$SRV" dnsmasq --no-daemon --conf-file=/dev/null --port=0 --user=root --bind-interfaces \
    --interface=ts0 --enable-tftp --tftp-root="$TFTP_DIR" --tftp-max=1000 \
    --pid-file="$WORK/dnsmasq.pid" >"$WORK/dnsmasq.log" 2>&1 &
PIDS+=($!)
mkdir -p "$WORK/nginx/tmp"
cat >"$WORK/nginx/nginx.conf" <<EOF
worker_processes auto;
daemon off;
user root;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log;
events { worker_connections 4096; }
http {
    sendfile on;
    tcp_nopush on;
    access_log off;
    default_type application/octet-stream;
    client_body_temp_path $WORK/nginx/tmp;
    server { listen $S_IP:8081; root $WORK/www; }
}
EOF
ip netns exec "$SRV" nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx/out.log" 2>&1 &
PIDS+=($!)

for _ in $(seq 1 100); do
    if grep -q "serving HTTP on" "$WORK/plinth.log" && in_cli curl -fso /dev/null "http://$S_IP:8081/$IMG_PATH" -r 0-0; then
        break
    fi
    sleep 0.1
done
grep -q "serving HTTP on" "$WORK/plinth.log" || { cat "$WORK/plinth.log" >&2; exit 1; }
api() { in_srv "$PLINTH_BIN" machine --server "http://$S_IP:8080" --token "$TOKEN" "$@" >/dev/null; }
api state bench-install ready
api provision bench-install --ttl 86400

declare -A TFTP_PORT=([plinth]=6969 [tftpd-hpa]=6970 [dnsmasq]=69)

# ---------------------------------------------------------------------------------------------
# The load driver: N workers running a client command; "loop" repeats it until --seconds have
# passed (a transfer under way finishes and counts), "once" runs it once per worker, "storm:K"
# starts every worker's process first, holds them at a barrier, releases them together and runs
# the command once each (it makes K transfers), timing from the release.
# Prints: completions failures elapsed_seconds.
cat >"$WORK/load.py" <<'EOF'
import subprocess, sys, threading, time
mode, conc, secs, cmd = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
ok = fail = 0
lock = threading.Lock()
start = time.monotonic()
deadline = start + secs
if mode.startswith("storm:"):
    per = int(mode.split(":")[1])
    barrier = threading.Barrier(conc + 1)
    def stormer():
        global ok, fail
        # The client process exists before the release; it reads one byte (the go) from its
        # stdin and then execs the command, so the release starts transfers, not processes.
        p = subprocess.Popen(["sh", "-c", "read go; exec \"$@\"", "storm"] + cmd,
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        barrier.wait()
        p.stdin.write(b"go\n"); p.stdin.close()
        try:
            rc = p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill(); rc = -1
        with lock:
            if rc == 0:
                ok += per
            else:
                fail += per
    threads = [threading.Thread(target=stormer) for _ in range(conc)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # every shell started and waiting on its stdin
    barrier.wait()
    start = time.monotonic()
    for t in threads:
        t.join()
    print(ok, fail, "%.4f" % (time.monotonic() - start))
    sys.exit(0)
def worker():
    global ok, fail
    while True:
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, timeout=120).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        with lock:
            if rc == 0:
                ok += 1
            else:
                fail += 1
        if mode == "once" or time.monotonic() >= deadline:
            return
threads = [threading.Thread(target=worker) for _ in range(conc)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(ok, fail, "%.4f" % (time.monotonic() - start))
EOF

tftp_cmd() { # $1 server, $2 client config, $3 file -> the client command line
    local port=${TFTP_PORT[$1]}
    case "$2" in
        curl-512) echo "curl -sf --tftp-blksize 512 -o /dev/null tftp://$S_IP:$port/$3" ;;
        curl-1468) echo "curl -sf --tftp-blksize 1468 -o /dev/null tftp://$S_IP:$port/$3" ;;
        atftp-1468) echo "atftp --option blksize\\ 1468 -g -r $3 -l /dev/null $S_IP $port" ;;
        atftp-1468-w16) echo "atftp --option blksize\\ 1468 --option windowsize\\ 16 -g -r $3 -l /dev/null $S_IP $port" ;;
    esac
}
storm_cmd() { # $1 server, $2 blksize, $3 file, $4 fetches -> one curl fetching the file $4 times
    local port=${TFTP_PORT[$1]} i out="curl -sf --tftp-blksize $2"
    for i in $(seq 1 "$4"); do out="$out -o /dev/null tftp://$S_IP:$port/$3"; done
    echo "$out"
}
run_client() { # $@ = an argument vector; eval splits the escaped spaces of tftp_cmd
    eval "set -- $*"
    in_cli "$@"
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else printf "%.4f\n", (a[NR/2]+a[NR/2+1])/2}'; }
RESULTS=$WORK/results.tsv # case  server  value  failures
: >"$RESULTS"
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RESULTS"; [ -z "$RAW" ] || printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RAW"; }

# Correctness first: each server and client config delivers the right bytes.
SUM1M=$(sha256sum <"$TFTP_DIR/f1m.bin")
for srv in plinth $TFTP_PEERS; do
    for c in curl-512 curl-1468 atftp-1468 atftp-1468-w16; do
        cmd=$(tftp_cmd $srv $c f1m.bin)
        cmd=${cmd//\/dev\/null/$WORK\/check}
        rm -f "$WORK/check"
        run_client $cmd >/dev/null || { echo "check failed: $srv $c" >&2; exit 1; }
        [ "$(sha256sum <"$WORK/check")" = "$SUM1M" ] || { echo "wrong bytes: $srv $c" >&2; exit 1; }
    done
done
# Does Plinth grant the window? atftp's trace shows the OACK and how many DATA blocks pass
# between two ACKs.
in_cli atftp --trace --option "blksize 1468" --option "windowsize 16" -g -r f1m.bin -l /dev/null $S_IP 6969 \
    >"$WORK/atftp-trace" 2>&1 || true
echo "Plinth's OACK to atftp: $(grep -m1 -i oack "$WORK/atftp-trace" || echo none)"
echo "  DATA blocks received: $(grep -c 'DATA <block' "$WORK/atftp-trace"), ACKs sent: $(grep -c 'sent ACK' "$WORK/atftp-trace")"

if want tftp; then
    for file in f100k.bin f1m.bin; do
        for conc in 20 100; do
            for c in curl-512 curl-1468 atftp-1468 atftp-1468-w16; do
                name="tftp $file x$conc $c"
                if [ -n "$MATCH" ] && ! grep -Eq -- "$MATCH" <<<"$name"; then continue; fi
                for r in $(seq 1 "$ROUNDS"); do
                    for srv in plinth $TFTP_PEERS; do
                        read -r ok fail el < <(run_client python3 "$WORK/load.py" loop "$conc" "$SECS" $(tftp_cmd $srv $c $file))
                        v=$(awk -v o="$ok" -v e="$el" 'BEGIN {printf "%.1f", o/e}')
                        record "$name" "$srv" "$v" "$fail"
                        echo "  $name round $r $srv: $v/s ($fail failed)"
                    done
                done
            done
        done
    done
fi

if want storm; then
    for file in f100k.bin f1m.bin; do
        for conc in 20 100; do
            for bs in 512 1468; do
                name="tftp storm $file x$conc curl-$bs x$STORM_FETCHES"
                if [ -n "$MATCH" ] && ! grep -Eq -- "$MATCH" <<<"$name"; then continue; fi
                for r in $(seq 1 "$ROUNDS"); do
                    for srv in plinth $TFTP_PEERS; do
                        read -r ok fail el < <(run_client python3 "$WORK/load.py" "storm:$STORM_FETCHES" "$conc" 0 $(storm_cmd $srv $bs $file "$STORM_FETCHES"))
                        v=$(awk -v o="$ok" -v e="$el" 'BEGIN {printf "%.1f", o/e}')
                        record "$name" "$srv" "$v" "$fail"
                        echo "  $name round $r $srv: $v transfers/s ($fail failed)"
                    done
                done
            done
        done
    done
fi

if want single; then
    for file in f1m.bin f16m.bin; do
        size=$(stat -c %s "$TFTP_DIR/$file")
        cases="atftp-1468-w16"
        [ "$file" = f1m.bin ] && cases="atftp-1468-w16 curl-1468 atftp-1468"
        for c in $cases; do
            name="tftp single $file $c MB/s"
            if [ -n "$MATCH" ] && ! grep -Eq -- "$MATCH" <<<"$name"; then continue; fi
            for r in $(seq 1 "$ROUNDS"); do
                for srv in plinth $TFTP_PEERS; do
                    read -r ok fail el < <(run_client python3 "$WORK/load.py" loop 1 "$SECS" $(tftp_cmd $srv $c $file))
                    v=$(awk -v o="$ok" -v e="$el" -v s="$size" 'BEGIN {printf "%.2f", o*s/e/1e6}')
                    record "$name" "$srv" "$v" "$fail"
                    echo "  $name round $r $srv: $v MB/s ($fail failed)"
                done
            done
        done
    done
fi

if want http; then
    size=$(stat -c %s "$WORK/initramfs")
    SUM=$(sha256sum <"$WORK/initramfs")
    declare -A HTTP_PORT=([plinth]=8082 [plinth-hyper]=8080 [nginx]=8081)
    for srv in plinth plinth-hyper nginx; do
        port=${HTTP_PORT[$srv]}
        [ "$(in_cli curl -sf "http://$S_IP:$port/$IMG_PATH" | sha256sum)" = "$SUM" ] || { echo "wrong bytes: $srv" >&2; exit 1; }
    done
    for conc in 1 50; do
        mode=loop; [ $conc -gt 1 ] && mode=once
        name="http 100MiB x$conc MB/s"
        for r in $(seq 1 "$ROUNDS"); do
            for srv in plinth plinth-hyper nginx; do
                port=${HTTP_PORT[$srv]}
                read -r ok fail el < <(in_cli python3 "$WORK/load.py" $mode $conc "$SECS" curl -sf -o /dev/null "http://$S_IP:$port/$IMG_PATH")
                v=$(awk -v o="$ok" -v e="$el" -v s="$size" 'BEGIN {printf "%.1f", o*s/e/1e6}')
                record "$name" "$srv" "$v" "$fail"
                echo "  $name round $r $srv: $v MB/s ($fail failed)"
            done
        done
    done
fi

if want wrk; then
    q() { echo "mac=${1//:/-}&uuid=$2&buildarch=x86_64&platform=efi"; }
    URL_INSTALL="http://$S_IP:8080/boot/machine.ipxe?$(q $MAC_INSTALL $UUID_INSTALL)"
    URL_HOLD="http://$S_IP:8080/boot/machine.ipxe?$(q $MAC_HOLD $UUID_HOLD)"
    in_cli curl -sf "$URL_INSTALL" >"$WORK/www/install.ipxe"
    grep -q '^kernel ' "$WORK/www/install.ipxe" || { echo "no install script:" >&2; cat "$WORK/www/install.ipxe" >&2; exit 1; }
    in_cli curl -sf "$URL_HOLD" >"$WORK/hold.ipxe"
    echo "install script: $(wc -c <"$WORK/www/install.ipxe") bytes; hold script: $(wc -c <"$WORK/hold.ipxe") bytes"
    wrk_rps() { in_cli wrk -t2 -c64 -d"${SECS}s" "$1" | awk '/Requests\/sec/ {print $2} /Non-2xx/ {print "non2xx " $NF >"/dev/stderr"}'; }
    for r in $(seq 1 "$ROUNDS"); do
        for pair in "plinth-install|$URL_INSTALL" "plinth-hold|$URL_HOLD" "nginx-static|http://$S_IP:8081/install.ipxe"; do
            v=$(wrk_rps "${pair#*|}")
            record "wrk script" "${pair%%|*}" "$v" 0
            echo "  wrk round $r ${pair%%|*}: $v req/s"
        done
    done
fi

# ---------------------------------------------------------------------------------------------
echo
echo "Medians of $ROUNDS rounds of ${SECS}s; Plinth $("$PLINTH_BIN" --version 2>/dev/null || echo "?") ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo "?")), $(nproc) cores"
python3 - "$RESULTS" <<'EOF'
import collections, statistics, sys
vals = collections.OrderedDict()
fails = collections.defaultdict(int)
for line in open(sys.argv[1]):
    case, srv, v, f = line.rstrip("\n").split("\t")
    vals.setdefault(case, collections.OrderedDict()).setdefault(srv, []).append(float(v))
    fails[case, srv] += int(f)
def med(case, srv):
    xs = vals[case].get(srv)
    return statistics.median(xs) if xs else None
def cell(case, srv):
    m = med(case, srv)
    if m is None:
        return "-"
    f = fails[case, srv]
    return ("%.1f" % m) + (" (%d failed)" % f if f else "")
tftp = [c for c in vals if c.startswith("tftp")]
if tftp:
    print("| TFTP case (completions/s; single: MB/s) | Plinth | tftpd-hpa | dnsmasq | Plinth / best peer |")
    print("|---|---:|---:|---:|---:|")
    for c in tftp:
        best = max([x for x in (med(c, "tftpd-hpa"), med(c, "dnsmasq")) if x is not None] or [0])
        p = med(c, "plinth")
        print("| %s | %s | %s | %s | %.2f |" % (c[5:], cell(c, "plinth"), cell(c, "tftpd-hpa"), cell(c, "dnsmasq"), p / best if best else float("nan")))
    print()
http = [c for c in vals if c.startswith("http")]
if http:
    print("| HTTP case | Plinth image door (sendfile) | Plinth main port (hyper) | nginx | door / nginx | hyper / nginx |")
    print("|---|---:|---:|---:|---:|---:|")
    for c in http:
        p, h, n = med(c, "plinth"), med(c, "plinth-hyper"), med(c, "nginx")
        ratio = lambda x: "%.2f" % (x / n) if n and x is not None else "-"
        print("| %s | %s | %s | %s | %s | %s |" % (c[5:], cell(c, "plinth"), cell(c, "plinth-hyper"), cell(c, "nginx"), ratio(p), ratio(h)))
    print()
if "wrk script" in vals:
    print("| wrk -c64, per-machine iPXE script | requests/s |")
    print("|---|---:|")
    labels = {"plinth-install": "Plinth, install script (render + validate config, mint token, write event)",
              "plinth-hold": "Plinth, hold script (look-up, write event)",
              "nginx-static": "reference only: nginx, static file of the install script's size"}
    for srv, label in labels.items():
        print("| %s | %s |" % (label, cell("wrk script", srv)))
EOF
