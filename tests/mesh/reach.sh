#!/bin/bash
# Harness self-test, run on every mesh node at once: this node reaches every
# peer over RDMA (rping) from its address on the subnet it shares with that
# peer, and the local rxe device of that subnet carries the traffic.
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma
: "${MW_NODE:?} ${MW_NODES:?} ${MW_PEER_ADDRS:?} ${MW_ADDRS:?} ${MW_SHARED:?}"
IFS=, read -ra peers <<<"$MW_PEER_ADDRS"
IFS=, read -ra mine <<<"$MW_ADDRS"

rping -s -P -S 256 -a 0.0.0.0 >"server.$MW_NODE.out" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT

fail=0
for ((j = 0; j < MW_NODES; j++)); do
    ((j == MW_NODE)) && continue
    peer=${peers[j]} src=
    for a in "${mine[@]}"; do same_24 "$a" "$peer" && src=$a; done
    [[ -n $src ]] || { echo "FAIL: no local address on the subnet of node$j ($peer)"; fail=1; continue; }
    dev=$(rxe_of_addr "$src") || { echo "FAIL: no rxe device for $src"; fail=1; continue; }
    before=$(sent_pkts "$dev")
    ping_peer() { timeout 20 rping -c -a "$peer" -I "$src" -C 5 -S 256 -v >"client.$MW_NODE.$j.out" 2>&1; }
    if retry 120 ping_peer && (($(grep -c 'ping data' "client.$MW_NODE.$j.out") == 5)); then
        after=$(sent_pkts "$dev")
        echo "node$MW_NODE -> node$j: $src ($dev) -> $peer, 5 pings, sent_pkts +$((after - before))"
        ((after > before)) || { echo "FAIL: $dev did not carry it"; fail=1; }
    else
        echo "FAIL: node$MW_NODE cannot reach node$j at $peer from $src"; cat "client.$MW_NODE.$j.out"; fail=1
    fi
done

# Serve until every node has finished its own pings.
touch "$MW_SHARED/reach.done.$MW_NODE"
all_done() { (($(ls "$MW_SHARED"/reach.done.* 2>/dev/null | wc -l) == MW_NODES)); }
retry 180 all_done || { echo "FAIL: peers did not finish"; fail=1; }
((fail == 0)) && echo PASS
exit "$fail"
