#!/bin/sh
# Put the iPXE binaries Plinth serves into a directory of their own (default ./plinth-data/ipxe,
# which is where `plinth serve` looks unless [boot].ipxe_dir says otherwise).
#
# Source: Debian's `ipxe` package (apt-get install ipxe). Its /usr/lib/ipxe holds symlinks that
# point outside the directory (ipxe.efi -> /boot/ipxe.efi); Plinth's TFTP and HTTP refuse to follow
# a link out of their root, so the files are copied, not linked.
#
# Usage: ipxe/fetch.sh [DEST] [SRC]
set -eu
dest=${1:-./plinth-data/ipxe}
src=${2:-/usr/lib/ipxe}
[ -d "$src" ] || { echo "no $src: install Debian's ipxe package (apt-get install ipxe)" >&2; exit 1; }
mkdir -p "$dest"
found=0
# name in Debian's package -> name Plinth's DHCP hands out
for pair in undionly.kpxe:undionly.kpxe ipxe.efi:ipxe.efi snponly.efi:snponly.efi ipxe-arm64.efi:ipxe-arm64.efi; do
    from=${pair%%:*}
    to=${pair#*:}
    if [ -e "$src/$from" ]; then
        cp -L "$src/$from" "$dest/.$to.tmp"
        mv "$dest/.$to.tmp" "$dest/$to"
        found=$((found + 1))
        echo "$dest/$to"
    fi
done
[ "$found" -gt 0 ] || { echo "no iPXE binaries found in $src" >&2; exit 1; }
