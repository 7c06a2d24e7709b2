#!/usr/bin/env bash
# Boot storm benchmark (issue 7): N registered machines in their provisioning window network-boot
# at once against one Plinth, each doing what firmware, iPXE and Talos do (examples/boot_storm.rs):
# DHCP DORA with PXE options -> TFTP of the iPXE binary -> iPXE's DHCP round -> /boot.ipxe ->
# the machine's script -> kernel -> initramfs -> the config with the token of that script.
#
# Plinth runs in a server namespace (10.77.0.1/16 on veth ss0) as authoritative DHCP, TFTP and
# HTTP server; the simulator runs in a client namespace (veth sc0, no address of its own) where
# the whole pool (10.77.64.0/18) is a local route on lo ("AnyIP"), so every simulated machine can
# bind its leased address: Plinth checks that the config fetch comes from the machine's lease, and
# answers ARP for those addresses come from the client namespace's kernel.
#
# The fleet is declared as Plinth's users do it: a Cluster (secrets from `plinth cluster init`,
# kept outside the inventory directory), a Profile with install-disk rules, N Machine documents
# (`boot_storm inventory` writes them, with the MACs, SMBIOS UUIDs and serials the simulator uses),
# `plinth apply`; a stand-in Talos image (Debian's kernel from /boot and an initramfs of random
# bytes) with `plinth image import`; then every machine is set `ready` and its provisioning window
# opened through the API (`POST /api/v1/machines/{id}/provision`), before the storm starts.
#
# Needs root, ip, python3, curl, Debian's ipxe package (/usr/lib/ipxe), a kernel in /boot, and for
# --postgres a server at DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres;
# Plinth reaches it from its namespace through the Unix socket in PLINTH_PG_SOCKET_DIR, default
# /var/run/postgresql). The kernel's neighbour table is global: with more than ~500 machines the
# host's net.ipv4.neigh.default.gc_thresh{1,2,3} are raised for the run (and restored after), or
# Plinth's replies to the leased addresses would hit "neighbour table overflow".
#
# Kernel and initramfs come through the image door (`[boot] images_listen`, sendfile), as a
# fleet's Plinth would be set up; --no-image-door serves them through the main port instead.
#
# Usage: bench/boot_storm.sh [--machines 1000] [--concurrency N] [--ramp-ms 0] [--postgres]
#                            [--initramfs-mb 40] [--no-image-door] [--json FILE] [--keep]
# Environment: PLINTH_BIN, STORM_BIN (default: release builds under CARGO_TARGET_DIR or target/,
# built if missing), DATABASE_URL, PLINTH_SHARED (Talos schemas: $PLINTH_SHARED/talos/schemas,
# default ../shared next to the repository), KERNEL (default: the newest /boot/vmlinuz-*).
set -euo pipefail

N=1000
CONCURRENCY=""
RAMP_MS=0
DB=sqlite
INITRAMFS_MB=40
JSON=""
KEEP=0
IMAGE_DOOR=1
while [ $# -gt 0 ]; do
    case "$1" in
        --machines) N="$2"; shift 2 ;;
        --concurrency) CONCURRENCY="$2"; shift 2 ;;
        --ramp-ms) RAMP_MS="$2"; shift 2 ;;
        --postgres) DB=postgres; shift ;;
        --sqlite) DB=sqlite; shift ;;
        --initramfs-mb) INITRAMFS_MB="$2"; shift 2 ;;
        --json) JSON="$2"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --no-image-door) IMAGE_DOOR=0; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$N" -lt 1 ] || [ "$N" -gt 16000 ]; then
    echo "--machines must be 1..16000 (the pool is a /18)" >&2
    exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PLINTH_BIN=${PLINTH_BIN:-$TARGET/release/plinth}
STORM_BIN=${STORM_BIN:-$TARGET/release/examples/boot_storm}
SHARED=${PLINTH_SHARED:-$ROOT/../shared}
PG_ADMIN=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_SOCKET_DIR=${PLINTH_PG_SOCKET_DIR:-/var/run/postgresql}
TALOS=v1.11.6
require_tools ip python3 curl
[ "$DB" = sqlite ] || require_tools psql
if [ ! -x "$PLINTH_BIN" ] || [ ! -x "$STORM_BIN" ]; then
    (cd "$ROOT" && cargo build --release --bin plinth --example boot_storm)
fi
KERNEL=${KERNEL:-$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1)}
[ -r "$KERNEL" ] || { echo "no kernel to serve: set KERNEL (e.g. /boot/vmlinuz-...)" >&2; exit 1; }

TAG=$$
SRV=pls-s$TAG
CLI=pls-c$TAG
WORK=$(mktemp -d /tmp/plinth-storm.XXXXXX)
SERVER_PID=""
PG_DB=""

cleanup() {
    set +e
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    ip netns del "$SRV" 2>/dev/null
    ip netns del "$CLI" 2>/dev/null
    if [ -n "$PG_DB" ]; then
        psql "$PG_ADMIN" -qc "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)" >/dev/null 2>&1
    fi
    neigh_restore
    if [ "$KEEP" = 1 ]; then
        echo "kept: $WORK (plinth.log, plinth.toml, report.json)" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

# --- The neighbour table (global to every namespace): room for every leased address. ---
if [ "$N" -gt 256 ]; then
    neigh_raise $((2 * N + 1024))
fi

# --- Namespaces: Plinth's side and the fleet's side of one veth cable. ---
ip netns add "$SRV"
ip netns add "$CLI"
ip link add ss0 netns "$SRV" type veth peer name sc0 netns "$CLI"
ip -n "$SRV" addr add 10.77.0.1/16 dev ss0
for ns in "$SRV" "$CLI"; do ip -n "$ns" link set lo up; done
ip -n "$SRV" link set ss0 up
ip -n "$CLI" link set sc0 up
# The fleet has no address of its own: DHCP leaves from 0.0.0.0, every pool address is local.
ip -n "$CLI" route add 10.77.0.0/16 dev sc0
ip -n "$CLI" route add local 10.77.64.0/18 dev lo

# --- Plinth's configuration, iPXE binaries, database. ---
mkdir -p "$WORK/data" "$WORK/secrets" "$WORK/inventory/clusters" "$WORK/inventory/profiles"
sh "$ROOT/ipxe/fetch.sh" "$WORK/ipxe" >/dev/null
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/secret.key"
chmod 600 "$WORK/secret.key"
case "$DB" in
    sqlite) DB_URL="sqlite://$WORK/data/plinth.db" ;;
    postgres)
        PG_DB=plinth_storm_$TAG
        psql "$PG_ADMIN" -qc "CREATE DATABASE $PG_DB" >/dev/null
        base=${PG_ADMIN%/*}
        case "$base" in
            *@127.0.0.1*|*@localhost*) DB_URL="${base%%@*}@localhost/$PG_DB?host=$PG_SOCKET_DIR" ;;
            *) DB_URL="$base/$PG_DB" ;;
        esac ;;
esac
SCHEMAS=""
if [ -d "$SHARED/talos/schemas" ]; then
    SCHEMAS="[talos]
schema_dir = \"$(cd "$SHARED/talos/schemas" && pwd)\""
fi
DOOR=""
[ "$IMAGE_DOOR" = 1 ] && DOOR='images_listen = "10.77.0.1:8081"'
CFG=$WORK/plinth.toml
cat >"$CFG" <<EOF
data_dir = "$WORK/data"
[database]
url = "$DB_URL"
[http]
listen = "10.77.0.1:8080"
[secrets]
key_file = "$WORK/secret.key"
[boot]
public_url = "http://10.77.0.1:8080"
ipxe_dir = "$WORK/ipxe"
$DOOR
$SCHEMAS
[tftp]
enabled = true
[dhcp]
enabled = true
interfaces = ["ss0"]
proxy_port = 0
[[dhcp.subnet]]
cidr = "10.77.0.0/16"
server_ip = "10.77.0.1"
pool = ["10.77.64.1-10.77.127.254"]
routers = ["10.77.0.1"]
lease_seconds = 3600
EOF

# --- The stand-in Talos image. ---
head -c $((INITRAMFS_MB * 1024 * 1024)) /dev/urandom >"$WORK/initramfs.img"
"$PLINTH_BIN" image import --config "$CFG" --version "$TALOS" --arch amd64 \
    --kernel "$KERNEL" --initramfs "$WORK/initramfs.img" >/dev/null
rm -f "$WORK/initramfs.img"

# --- The fleet, declared. ---
"$PLINTH_BIN" cluster init storm --endpoint https://10.77.0.10:6443 --out "$WORK/secrets/storm.yaml" >/dev/null
cat >"$WORK/inventory/clusters/storm.yaml" <<EOF
kind: Cluster
name: storm
endpoint: https://10.77.0.10:6443
talosVersion: $TALOS
secrets: $WORK/secrets/storm.yaml
EOF
cat >"$WORK/inventory/profiles/storm.yaml" <<'EOF'
kind: Profile
name: storm
installDisk:
  type: ssd
  size: [">= 100GB", "<= 1TB"]
  prefer: smallest
EOF
"$STORM_BIN" inventory --count "$N" --dir "$WORK/inventory/machines"
say "plinth apply: $N machines"
t0=$(date +%s.%N)
"$PLINTH_BIN" apply "$WORK/inventory" --config "$CFG" >"$WORK/apply.log" 2>&1 || { cat "$WORK/apply.log" >&2; exit 1; }
say "applied in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
TOKEN=$("$PLINTH_BIN" token create --role operator --name storm --config "$CFG")

# --- Plinth, in its namespace. ---
ip netns exec "$SRV" "$PLINTH_BIN" serve --config "$CFG" >"$WORK/plinth.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 300); do
    grep -q "serving HTTP on" "$WORK/plinth.log" 2>/dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/plinth.log" >&2; exit 1; }
    sleep 0.1
done
grep -q "serving HTTP on" "$WORK/plinth.log" || { echo "plinth did not start" >&2; cat "$WORK/plinth.log" >&2; exit 1; }
# `ip netns exec` runs plinth itself (exec), so SERVER_PID is Plinth's PID.

# --- Every machine ready, its provisioning window open (through the API, 4 at a time). ---
say "opening $N provisioning windows"
t0=$(date +%s.%N)
ip netns exec "$SRV" python3 - "$N" "$TOKEN" <<'EOF'
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
n, token = int(sys.argv[1]), sys.argv[2]
def post(path, body):
    req = urllib.request.Request("http://10.77.0.1:8080/api/v1" + path, data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status
def prepare(i):
    host = "storm-%05d" % i
    post("/machines/%s/state" % host, {"state": "ready"})
    post("/machines/%s/provision" % host, {"ttl_seconds": 86400})
with ThreadPoolExecutor(4) as ex:
    list(ex.map(prepare, range(n)))
EOF
say "windows open in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"

# --- The storm. ---
say "boot storm: $N machines (concurrency ${CONCURRENCY:-all}, ramp ${RAMP_MS} ms, $DB, image door $([ "$IMAGE_DOOR" = 1 ] && echo on || echo off))"
rss_before=$(awk '/VmRSS/ {print $2}' "/proc/$SERVER_PID/status")
args=(run --count "$N" --iface sc0 --server 10.77.0.1 --boot-url http://10.77.0.1:8080/boot.ipxe
      --ramp-ms "$RAMP_MS" --json "$WORK/report.json")
[ -n "$CONCURRENCY" ] && args+=(--concurrency "$CONCURRENCY")
rc=0
ip netns exec "$CLI" "$STORM_BIN" "${args[@]}" || rc=$?
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$SERVER_PID/status")
# Where Plinth dropped or refused something: its counters, and the kernel's UDP receive-buffer
# overflows in its namespace (DHCP and TFTP packets lost before Plinth read them).
ip netns exec "$SRV" curl -s --max-time 10 http://10.77.0.1:8080/metrics >"$WORK/metrics.txt" || true
drops=$(grep -E '^plinth_(dhcp_dropped|timeline_dropped)' "$WORK/metrics.txt" | tr '\n' ' ' || true)
udp_errors() { ip netns exec "$1" awk '/^Udp:/ {if (h) {print "RcvbufErrors=" $6 " InErrors=" $4} else h=1}' /proc/net/snmp; }
echo "plinth drops: ${drops:-none}"
echo "UDP receive errors: server namespace $(udp_errors "$SRV"), client namespace $(udp_errors "$CLI")"
echo "plinth ($DB): peak memory VmHWM $((hwm / 1024)) MiB (RSS $((rss_before / 1024)) MiB before the storm)"
warn=$(grep -c -E '"level":"(WARN|ERROR)"| WARN | ERROR ' "$WORK/plinth.log" || true)
echo "plinth log: $warn warning/error lines ($WORK/plinth.log)"
if [ "$warn" != 0 ]; then
    grep -E '"level":"(WARN|ERROR)"| WARN | ERROR ' "$WORK/plinth.log" | head -5 || true
fi
python3 - "$WORK/report.json" "$hwm" "$DB" <<'EOF' >"$WORK/report.full.json" || true
import json, sys
r = json.load(open(sys.argv[1]))
r["plinth_vmhwm_kib"] = int(sys.argv[2])
r["database"] = sys.argv[3]
print(json.dumps(r, indent=2))
EOF
if [ -n "$JSON" ]; then cp "$WORK/report.full.json" "$JSON"; fi
exit "$rc"
