#!/bin/bash
# Lossy links.  Every mesh link of every node drops and reorders packets
# (netem on each end: loss L, delay 1ms, reorder 2%), at L = 0.1% and 1%.
# At each level node0 sends an 8 MiB file to node1 with meshcat, byte-
# identical within 60 s, and every node runs the mesh collectives
# (allreduce, allgather, broadcast, each checked) within 120 s.  Then the
# node0-node1 link goes dark in the middle of a stream: with -t 5 (the
# keepalive), node0's meshcat and node1's both fail within 20 s (rxe's
# resends never run out at retry count 7: the unanswered keepalive probe
# fails the connection after 2 x 5 s), and node1 publishes nothing.
#   lossy.sh MESHCAT MESH-COLL      (mesh suite, on every node at once)
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma
: "${MW_NODE:?} ${MW_NODES:?} ${MW_SHARED:?} ${MW_ADDRS:?}"
MC=$(realpath "$1")
COLL=$(realpath "$2")
port=7691
W=$(mktemp -d /tmp/lossy-mesh.XXXXXX)
cd "$W" || exit 1

# The netdevs of this node's mesh links, one per address.
netdevs=()
IFS=, read -ra addrs <<<"$MW_ADDRS"
for a in "${addrs[@]}"; do
    netdevs+=("$(netdev_of_addr "$a")") || { echo "FAIL: no netdev for $a"; exit 1; }
done
netem() {       # netem off | netem SPEC...: on every link of this node
    local d
    for d in "${netdevs[@]}"; do
        tc qdisc del dev "$d" root 2>/dev/null
        [[ $1 == off ]] || tc qdisc add dev "$d" root netem "$@" || return 1
    done
}
dropped() {     # packets netem dropped on this node's links so far
    local d n=0
    for d in "${netdevs[@]}"; do
        n=$((n + $(tc -s qdisc show dev "$d" | awk '/dropped/ {sub(",", "", $7); print $7; exit}')))
    done
    echo $n
}
trap 'netem off; rm -rf "$W"' EXIT
fail() { echo "FAIL: node$MW_NODE: $*"; exit 1; }
barrier() {     # barrier NAME: wait until every node got here
    mesh_barrier "lossy.$1" || fail "barrier $1: not every node arrived"
}
elapsed() { echo $((SECONDS - $1)); }

((MW_NODE == 0)) && head -c $((8 << 20)) /dev/urandom >big && sha256sum big >"$MW_SHARED/lossy.sum"
for loss in 0.1% 1%; do
    netem loss "$loss" delay 1ms reorder 2% || fail "cannot add netem (sch_netem?)"
    barrier "on-$loss"
    t0=$SECONDS
    case $MW_NODE in
    0)
        timeout 60 "$MC" -q -t 30 "node1:$port" big || fail "meshcat at $loss loss: exit $?"
        echo "node0: 8 MiB to node1 at $loss loss in $(elapsed $t0) s"
        ;;
    1)
        rm -rf in && mkdir in
        timeout 65 "$MC" -q -t 30 -l ":$port" -o in || fail "receiving at $loss loss: exit $?"
        (cd in && sha256sum -c --quiet "$MW_SHARED/lossy.sum") || fail "file differs at $loss loss"
        echo "node1: byte-identical at $loss loss, $(elapsed $t0) s"
        ;;
    esac
    barrier "file-$loss"
    t0=$SECONDS
    MW_TEST_FILTER=collectives_across_the_mesh timeout 120 "$COLL" >coll.log 2>&1 || { cat coll.log; fail "collectives at $loss loss: exit $?"; }
    echo "node$MW_NODE: collectives checked at $loss loss in $(elapsed $t0) s" \
        "(netem dropped $(dropped) packets here so far)"
    barrier "coll-$loss"
done
# The losses were real: 8 MiB at 1% loss is over 2,000 packets, 20 dropped.
((MW_NODE > 1)) || (($(dropped) > 0)) || fail "netem dropped nothing: the test tested nothing"
netem off

# A link that goes dark mid-transfer: node0 and node1 each drop everything
# they send on the link the transfer uses (the route to the other).
dark() {
    local dev
    dev=$(netdev_to "$(getent hosts "node$1" | awk '{print $1; exit}')") &&
        tc qdisc add dev "$dev" root netem loss 100%
}
# failed_within PID SECS WHAT: our child PID must fail within SECS; the
# seconds it took in $t (not in a subshell: wait needs the child).
failed_within() {
    local t0=$SECONDS
    for _ in $(seq $((4 * $2))); do kill -0 "$1" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$1" 2>/dev/null && { kill -9 "$1"; fail "$3 still running $((2 * $2)) s after the link went dark"; }
    wait "$1" && fail "$3 succeeded over a dark link"
    t=$((SECONDS - t0))
    ((t <= $2)) || fail "$3 noticed the dark link after $t s (want <= $2)"
}
case $MW_NODE in
0)
    barrier dark-ready
    head -c $((64 << 30)) /dev/zero | "$MC" -q -t 5 "node1:$port" & pid=$!
    sleep 2
    dark 1 || fail "cannot darken the link to node1"
    touch "$MW_SHARED/lossy.dark"
    failed_within "$pid" 20 "meshcat"
    echo "node0: dark link noticed in $t s"
    ;;
1)
    rm -rf in && mkdir in
    "$MC" -q -t 5 -l ":$port" -o in & pid=$!
    barrier dark-ready
    retry 30 test -f "$MW_SHARED/lossy.dark" || fail "node0 never darkened the link"
    dark 0 || fail "cannot darken the link to node0"
    failed_within "$pid" 20 "the receiver"
    [[ -z $(ls -A in) ]] || fail "the receiver published $(ls in) from a broken transfer"
    echo "node1: dark link noticed in $t s, nothing published"
    ;;
*)
    barrier dark-ready
    ;;
esac
barrier done
