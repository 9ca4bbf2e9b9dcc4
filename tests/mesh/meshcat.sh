#!/bin/bash
# meshcat fan-out across the mesh: node0 sends a 32 MiB+1 file and an empty
# one to node1 and node2 with --to (relayed node0 -> node1 -> node2, each hop
# on its own subnet); both receivers must end with byte-identical files.
#   meshcat.sh MESHCAT      (run by meson in the mesh suite, on every node)
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma
: "${MW_NODE:?} ${MW_NODES:?} ${MW_SHARED:?}"
MC=$(realpath "$1")
port=7690
W=$(mktemp -d /tmp/meshcat-mesh.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 1
sums=$MW_SHARED/meshcat.sha256

case $MW_NODE in
0)
    head -c $((32 * 1048576 + 1)) /dev/urandom >big
    : >empty
    sha256sum big empty >"$sums.tmp" && mv "$sums.tmp" "$sums"
    "$MC" -t 120 --to "node1:$port,node2:$port" big empty; rc=$?
    echo "node0: meshcat exit $rc"
    exit $rc
    ;;
1 | 2)
    mkdir out
    "$MC" -t 120 -l ":$port" -o out; rc=$?
    retry 60 test -f "$sums" || { echo "FAIL: no checksums from node0"; exit 1; }
    if ((rc == 0)) && (cd out && sha256sum -c --quiet "$sums"); then
        echo "node$MW_NODE: big and empty byte-identical (sha256), via $( ((MW_NODE == 1)) && echo "node0" || echo "node1")"
        exit 0
    fi
    echo "FAIL: node$MW_NODE: meshcat exit $rc, $(ls -la out)"
    exit 1
    ;;
*)
    echo "node$MW_NODE: not part of the fan-out"
    ;;
esac
