# Shared by the benchmark scripts (sourced, not run): tool checks and the kernel's neighbour table.

# require_tools TOOL...: exit 1 naming the first one missing.
require_tools() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
    done
}

# The neighbour table (ARP cache) is the kernel's, shared by every namespace: a benchmark that
# answers thousands of client addresses or MACs overflows its default (gc_thresh3 = 1024) and
# measures the table, not the server.
NEIGH_SAVED=""

# neigh_raise WANT: when gc_thresh3 is below WANT, set gc_thresh{3,2,1} to WANT, WANT/2, WANT/4 for
# the run and remember the old values for neigh_restore (call it from the EXIT trap).
neigh_raise() {
    local want=$1 cur3
    cur3=$(sysctl -n net.ipv4.neigh.default.gc_thresh3)
    [ "$cur3" -lt "$want" ] || return 0
    NEIGH_SAVED="$(sysctl -n net.ipv4.neigh.default.gc_thresh1) $(sysctl -n net.ipv4.neigh.default.gc_thresh2) $cur3"
    echo "raising net.ipv4.neigh.default.gc_thresh{1,2,3} to $((want / 4)) $((want / 2)) $want for the run (was $NEIGH_SAVED)" >&2
    sysctl -qw net.ipv4.neigh.default.gc_thresh3="$want" net.ipv4.neigh.default.gc_thresh2="$((want / 2))" \
        net.ipv4.neigh.default.gc_thresh1="$((want / 4))"
}

# neigh_restore: put back what neigh_raise changed (nothing when it changed nothing).
neigh_restore() {
    [ -n "$NEIGH_SAVED" ] || return 0
    local t1 t2 t3
    read -r t1 t2 t3 <<<"$NEIGH_SAVED"
    sysctl -qw net.ipv4.neigh.default.gc_thresh1="$t1" net.ipv4.neigh.default.gc_thresh2="$t2" \
        net.ipv4.neigh.default.gc_thresh3="$t3" || true
    NEIGH_SAVED=""
}
