#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: install what the tests need, start the
# services they talk to, then run every test. This is the README's second command, and `.ci/run`
# runs exactly this too (after `cargo fmt --check` and clippy).
#
# Usage: tests/setup-and-run.sh                  install what is missing, then `cargo nextest run`
#        tests/setup-and-run.sh --install-only   install what is missing and stop
#        tests/setup-and-run.sh -- ARGS...       extra arguments for `cargo nextest run`
#
# Runs as root (the network tests create network namespaces; apt installs packages); started by
# another user it re-runs itself through sudo. Idempotent: what is there already is left alone, so a
# second run goes straight to the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then
        exec sudo --preserve-env=DATABASE_URL,PLINTH_REDFISH_VENV,CARGO_TARGET_DIR "$0" "$@"
    fi
    echo "tests/setup-and-run.sh must run as root (network namespaces, apt-get): no sudo here" >&2
    exit 1
fi

install_only=0
nextest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --install-only) install_only=1 ;;
        --) shift; nextest_args+=("$@"); break ;;
        *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
    shift
done

log() { printf '\n== %s\n' "$*"; }

# Debian packages the tests use, each for a reason (grep tests/ for the command before removing one):
# - build-essential: the linker cargo needs; curl, ca-certificates: rustup, the BMC and TFTP tests
# - postgresql, postgresql-client: the store battery runs on PostgreSQL as well as SQLite
# - python3-venv: the Redfish peers (sushy-tools) live in a venv
# - openssl: the BMC TLS and cluster tests make and check certificates (`openssl x509`)
# - iproute2 (`ip netns`), util-linux (`unshare`): the network tests and the README runner create
#   network namespaces
# - busybox-static: DHCP tests run busybox udhcpc; the VM boot test copies it into an initramfs
#   (it replaces Debian's dynamic `busybox` package: both provide the `busybox` command)
# - atftp (and curl): TFTP clients of the boot-chain tests
# - kea-admin (perfdhcp), dnsmasq-base: DHCP load, relay and proxyDHCP peers
# - ndisc6 (rdisc6): the router solicitations the ipv6_ra tests answer
# - qemu-system-x86, ipxe-qemu, ovmf, ipxe: the VMs that network-boot through Plinth
# - qemu-system-arm, qemu-efi-aarch64, gpgv, xz-utils, debian-archive-keyring: the ARM64 UEFI VM
#   that boots Debian's ARM64 iPXE, obtained with `ipxe/fetch.sh --debian` (signature-checked)
# - linux-image-amd64, zstd, gzip: the kernel (and its compressed virtio-net modules) standing in
#   for Talos' in the VM install tests
# - binutils (`objcopy --strip-all`), libc-bin (`ldd`): the Talos API stand-in copied into a VM
# - jq: the README runner runs the README's `... | jq` lines
# - libcap2-bin (`setcap`): the container test gives the binary the image's file capabilities
# - chromium, chromium-driver: browser tests of the web console
APT_PACKAGES=(build-essential curl ca-certificates postgresql postgresql-client python3-venv openssl
              iproute2 util-linux busybox-static atftp kea-admin dnsmasq-base ndisc6 qemu-system-x86
              ipxe-qemu ovmf ipxe linux-image-amd64 zstd gzip qemu-system-arm qemu-efi-aarch64 gpgv
              xz-utils debian-archive-keyring binutils libc-bin jq libcap2-bin chromium chromium-driver)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Rust: the toolchain of rustup (Debian 12's cargo is older than the crate's rust-version).
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null; then
    log "rustup (stable, with rustfmt and clippy)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
        | sh -s -- -y --profile minimal --component rustfmt,clippy
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    log "cargo install cargo-nextest"
    cargo install cargo-nextest --locked
fi
# s3s-fs: the S3-compatible server the etcd snapshot tests (tests/it/snapshots.rs) and
# bench/etcd_snapshot.sh start on loopback. 0.14.1: the newest that builds with rustc 1.95.
if ! command -v s3s-fs >/dev/null; then
    log "cargo install s3s-fs"
    cargo install s3s-fs --version 0.14.1 --features binary --locked
fi

# PostgreSQL on 127.0.0.1:5432. The tests use DATABASE_URL (default: user postgres, trust).
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    log "starting PostgreSQL"
    if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    fi
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432
if [ -z "${DATABASE_URL:-}" ]; then
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
    if ! psql "$DATABASE_URL" -qtAc 'select 1' >/dev/null 2>&1; then
        # A fresh Debian cluster asks for a password on 127.0.0.1 and checks the peer on its
        # socket. The tests connect as postgres over both (the container test as another uid,
        # through the socket): trust exactly those two ways in, on this test machine.
        log "PostgreSQL: trust for the postgres role on 127.0.0.1 and the socket (tests only)"
        hba=$(runuser -u postgres -- psql -qtAc 'show hba_file')
        { printf 'local all postgres trust\nhost all postgres 127.0.0.1/32 trust\n'; cat "$hba"; } > "$hba.new"
        mv "$hba.new" "$hba"
        chown postgres:postgres "$hba"
        runuser -u postgres -- psql -qc 'select pg_reload_conf()' >/dev/null
    fi
fi
export DATABASE_URL
psql "$DATABASE_URL" -qtAc 'select 1' >/dev/null

# Python peers: sushy-tools in a venv (the tests find it at target/redfish-venv or
# $PLINTH_REDFISH_VENV).
log "redfish peers venv"
sh tests/peers/redfish-venv.sh

if [ "$install_only" = 1 ]; then
    exit 0
fi
log "cargo nextest run"
exec cargo nextest run --workspace --no-fail-fast "${nextest_args[@]}"
