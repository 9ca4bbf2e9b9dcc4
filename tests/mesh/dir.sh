#!/bin/bash
# The directory across the mesh: node0 runs a redis-server (Debian's) on
# TCP, or an etcd (Debian's etcd-server); every node forms a communicator
# through it (mw_dir_comm_create, no host file:
# MW_TEST_FILTER=communicator_through_the_directory of mesh-coll, its
# results checked), then node0 sends a file with meshcat to the name node2
# published ("mesh/sink/2"), byte-identical.
#   dir.sh MESHCAT MESH-COLL [redis|etcd]   (mesh suite, on every node at once)
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma
: "${MW_NODE:?} ${MW_NODES:?} ${MW_SHARED:?}"
STORE=${3:-redis}
case $STORE in
redis) SERVER=/usr/bin/redis-server ;;
etcd) SERVER=/usr/bin/etcd ;;
*) echo "FAIL: store '$STORE': redis or etcd"; exit 1 ;;
esac
[[ -x $SERVER ]] || { echo "FAIL: $SERVER not installed (scripts/setup)"; exit 1; }
MC=$(realpath "$1")
COLL=$(realpath "$2")
W=$(mktemp -d /tmp/dir-mesh.XXXXXX)
cd "$W" || exit 1
fail() { echo "FAIL: node$MW_NODE: $*"; exit 1; }
redis=
trap '[[ -n $redis ]] && kill $redis; rm -rf "$W"' EXIT
if ((MW_NODE == 0)) && [[ $STORE == redis ]]; then
    /usr/bin/redis-server --port 6390 --bind 0.0.0.0 --protected-mode no --save '' \
        --appendonly no --loglevel warning --notify-keyspace-events Kgx >/dev/null & redis=$!
elif ((MW_NODE == 0)); then
    /usr/bin/etcd --name n0 --data-dir "$W/etcd" --listen-client-urls http://0.0.0.0:2391 \
        --advertise-client-urls http://node0:2391 --listen-peer-urls http://127.0.0.1:2392 \
        --initial-advertise-peer-urls http://127.0.0.1:2392 \
        --initial-cluster n0=http://127.0.0.1:2392 --logger zap --log-level error \
        >/dev/null 2>&1 & redis=$!
fi
# mw_dir_open waits for it (5 s, retried below)
[[ $STORE == redis ]] && export MW_DIRECTORY=redis://node0:6390 || export MW_DIRECTORY=etcd://node0:2391

MW_TEST_FILTER=communicator_through_the_directory "$COLL" || fail "communicator"
mesh_barrier dir.coll || fail "barrier: not every node formed it"

last=$((MW_NODES - 1))
sums=$MW_SHARED/dir.sha256
if ((MW_NODE == 0)); then
    head -c $((4 * 1048576 + 1)) /dev/urandom >f
    sha256sum f >"$sums.tmp" && mv "$sums.tmp" "$sums"
    "$MC" -q -t 60 --dir "$MW_DIRECTORY" "mesh/sink/$last" f || fail "meshcat to mesh/sink/$last"
    echo "node0: sent to mesh/sink/$last by name"
elif ((MW_NODE == last)); then
    mkdir out
    "$MC" -q -t 60 --dir "$MW_DIRECTORY" -l --name "mesh/sink/$last" -o out ||
        fail "meshcat -l --name"
    (cd out && sha256sum -c --quiet "$sums") || fail "the file differs"
    echo "node$MW_NODE: received as mesh/sink/$last, byte-identical"
fi
mesh_barrier dir.done || fail "barrier: not every node finished"
