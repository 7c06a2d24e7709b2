#!/bin/sh
# Put the iPXE binaries Plinth serves into a directory of their own (default ./plinth-data/ipxe,
# which is where `plinth serve` looks unless [boot].ipxe_dir says otherwise).
#
# Two sources, both Debian's `ipxe` package:
#
#   ipxe/fetch.sh [DEST] [SRC]
#       Copy from an installed package (`apt-get install ipxe`; SRC defaults to /usr/lib/ipxe).
#       Debian 12's package has no ARM64 binary; Debian 13's and later have `ipxe-arm64.efi`.
#
#   ipxe/fetch.sh --debian SUITE[,SUITE...] [DEST]
#       Download the `ipxe` package of a Debian suite (trixie, forky, sid: they carry the ARM64
#       binary) from the Debian archive ($DEBIAN_MIRROR, default http://deb.debian.org/debian)
#       without installing it, verified the way apt verifies it: the suite's InRelease must carry a
#       good signature from /usr/share/keyrings/debian-archive-keyring.gpg, Packages.xz must have
#       the SHA-256 that InRelease names, and the .deb the SHA-256 that Packages names. The package
#       is architecture-independent, so this works on any Debian release and any host. With
#       several suites, the first whose chain verifies is used (a mirror caught mid-update serves
#       an index that does not match its signed Release; that suite is skipped, loudly).
#
# Debian's /usr/lib/ipxe holds symlinks that point outside the directory (ipxe.efi ->
# /boot/ipxe.efi or ipxe-amd64.efi); Plinth's TFTP and HTTP refuse to follow a link out of their
# root, so the files are copied (dereferenced), never linked. Each lands under a temporary name
# and is renamed into place, so a running Plinth never serves half a file.
set -eu

copy_from() { # $1 = source directory, $2 = destination
    src=$1
    dest=$2
    [ -d "$src" ] || { echo "no $src: install Debian's ipxe package (apt-get install ipxe)" >&2; exit 1; }
    mkdir -p "$dest"
    found=0
    # name Plinth's DHCP hands out <- names it has in Debian's packages (first one present wins)
    for spec in undionly.kpxe:undionly.kpxe ipxe.efi:ipxe-amd64.efi,ipxe.efi \
        snponly.efi:snponly.efi ipxe-arm64.efi:ipxe-arm64.efi; do
        to=${spec%%:*}
        for from in $(echo "${spec#*:}" | tr , ' '); do
            if [ -e "$src/$from" ]; then
                cp -L "$src/$from" "$dest/.$to.tmp"
                mv "$dest/.$to.tmp" "$dest/$to"
                found=$((found + 1))
                echo "$dest/$to"
                break
            fi
        done
    done
    [ "$found" -gt 0 ] || { echo "no iPXE binaries found in $src" >&2; exit 1; }
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Download and verify suite $1's ipxe package into $work/ipxe.deb; non-zero (with the reason on
# stderr) when any link of the chain fails.
debian_deb() {
    suite=$1
    mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
    keyring=${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
    for tool in curl gpgv xz dpkg-deb sha256sum; do
        command -v "$tool" >/dev/null || { echo "ipxe/fetch.sh --debian needs $tool" >&2; exit 1; }
    done
    [ -r "$keyring" ] || { echo "no $keyring: apt-get install debian-archive-keyring" >&2; exit 1; }
    rm -f "$work/InRelease" "$work/Release" "$work/Packages.xz" "$work/pkg" "$work/ipxe.deb"
    curl -fsS --retry 2 -o "$work/InRelease" "$mirror/dists/$suite/InRelease" ||
        { echo "could not download $mirror/dists/$suite/InRelease" >&2; return 1; }
    gpgv --keyring "$keyring" --output "$work/Release" "$work/InRelease" 2>"$work/gpgv.log" ||
        { cat "$work/gpgv.log" >&2; echo "$suite/InRelease: no good signature from $keyring" >&2; return 1; }
    # The SHA256 section lists " HASH SIZE PATH"; the MD5Sum section comes first with 32-digit hashes.
    want=$(awk '$3 == "main/binary-all/Packages.xz" && length($1) == 64 { print $1 }' "$work/Release")
    [ -n "$want" ] || { echo "$suite/Release names no main/binary-all/Packages.xz" >&2; return 1; }
    curl -fsS --retry 2 -o "$work/Packages.xz" "$mirror/dists/$suite/main/binary-all/Packages.xz" ||
        { echo "could not download $suite main/binary-all/Packages.xz" >&2; return 1; }
    [ "$(sha256_of "$work/Packages.xz")" = "$want" ] ||
        { echo "$suite main/binary-all/Packages.xz: SHA-256 differs from the signed Release" >&2; return 1; }
    xz -dc "$work/Packages.xz" | awk '
        /^Package: / { p = ($2 == "ipxe") }
        p && /^Version: / { v = $2 } p && /^Filename: / { f = $2 } p && /^SHA256: / { s = $2 }
        /^$/ && p && f != "" { print v, f, s; p = 0; f = "" }
        END { if (p && f != "") print v, f, s }' | tail -1 >"$work/pkg"
    read -r version filename sha <"$work/pkg" || { echo "Debian $suite has no ipxe package" >&2; return 1; }
    curl -fsS --retry 2 -o "$work/ipxe.deb" "$mirror/$filename" ||
        { echo "could not download $filename" >&2; return 1; }
    [ "$(sha256_of "$work/ipxe.deb")" = "$sha" ] ||
        { echo "$filename: SHA-256 differs from the signed Packages index" >&2; return 1; }
    echo "ipxe $version from Debian $suite (signature and checksums verified)" >&2
}

from_debian() { # $1 = suites, comma-separated; $2 = destination
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    for suite in $(echo "$1" | tr , ' '); do
        if debian_deb "$suite"; then
            dpkg-deb -x "$work/ipxe.deb" "$work/root"
            # Links inside the package are relative to its own tree: resolve them there.
            copy_from "$work/root/usr/lib/ipxe" "$2"
            return 0
        fi
        echo "skipping Debian $suite" >&2
    done
    echo "no verified ipxe package in Debian $1" >&2
    exit 1
}

if [ "${1:-}" = "--debian" ]; then
    [ $# -ge 2 ] || { echo "usage: ipxe/fetch.sh --debian SUITE[,SUITE...] [DEST]" >&2; exit 2; }
    from_debian "$2" "${3:-./plinth-data/ipxe}"
else
    copy_from "${2:-/usr/lib/ipxe}" "${1:-./plinth-data/ipxe}"
fi
