#!/bin/bash
# Harness self-test: an RC exchange (rping) from one rxe device to another
# on a different subnet, checking that both devices carried it.
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma

IFS=, read -ra addrs <<<"${MW_ADDRS:-}"
((${#addrs[@]} >= 2)) || { echo "SKIP: needs two RDMA addresses (MW_ADDRS)"; exit 77; }
src=${addrs[0]} dst=${addrs[1]}
same_24 "$src" "$dst" && { echo "FAIL: $src and $dst share a subnet"; exit 1; }
sdev=$(rxe_of_addr "$src") && ddev=$(rxe_of_addr "$dst") || { echo "FAIL: no device for $src/$dst"; exit 1; }
[[ $sdev != "$ddev" ]] || { echo "FAIL: $src and $dst on one device $sdev"; exit 1; }
s0=$(sent_pkts "$sdev") d0=$(sent_pkts "$ddev")

rping -s -a "$dst" -C 10 -S 1024 >server.out 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
client() { timeout 20 rping -c -a "$dst" -I "$src" -C 10 -S 1024 -v >client.out 2>&1; }
retry 30 client || { echo "FAIL: rping client"; cat client.out server.out; exit 1; }
wait "$server" || { echo "FAIL: rping server"; cat server.out; exit 1; }

n=$(grep -c 'ping data' client.out)
s1=$(sent_pkts "$sdev") d1=$(sent_pkts "$ddev")
echo "rping $src ($sdev) -> $dst ($ddev): $n pings; sent_pkts $sdev +$((s1 - s0)), $ddev +$((d1 - d0))"
((n == 10)) || { echo "FAIL: expected 10 pings"; exit 1; }
((s1 > s0 && d1 > d0)) || { echo "FAIL: the exchange did not cross both devices"; exit 1; }
echo PASS
