#!/bin/bash
# The Python KV-cache example: prefill.py holds 1024 pages of 64 KiB;
# decode.py serves 32 HTTP requests, 16 at a time, each pulling 64
# scattered pages -- by RDMA reads, then (restarted) over HTTP, the
# baseline -- and checks every byte of every page.  load.py fails on any
# bad page or failed request.  Over RDMA (MW_TRANSPORT=rdma) the RDMA
# reads alone.
#   kvcache.sh APPS_KVCACHE_DIR      (run by meson in the rxe suite, Python env set)
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma
D=$(realpath "$1")
IFS=, read -ra A <<<"${MW_ADDRS:?}"
rdma=$((7800 + RANDOM % 400)) http=$((19000 + RANDOM % 500)) front=$((19600 + RANDOM % 500))
log=$(mktemp)
"$D/prefill.py" --rdma "${A[-1]}:$rdma" --http "127.0.0.1:$http" --pages 1024 \
    > >(tee "$log") 2>&1 & pre=$!
trap 'kill $pre ${dec:-} 2>/dev/null; rm -f "$log"' EXIT
retry 60 grep -q "RDMA on port" "$log" || { echo "prefill did not start"; exit 1; }
st=0
# the HTTP baseline uses no meshwire: the run over RDMA (MW_TRANSPORT=rdma,
# in the soft-RoCE VM) leaves it to the host's runs
vias=(rdma http)
[[ ${MW_TRANSPORT:-} == rdma ]] && vias=(rdma)
for via in "${vias[@]}"; do
    : >"$log"
    "$D/decode.py" --prefill-rdma "${A[-1]}:$rdma" --prefill-http "127.0.0.1:$http" \
        --http "127.0.0.1:$front" --via "$via" > >(tee "$log") 2>&1 & dec=$!
    retry 60 grep -q "HTTP on" "$log" || { echo "decode ($via) did not start"; exit 1; }
    echo -n "pages via $via: "
    timeout 300 "$D/load.py" "http://127.0.0.1:$front" 32 16 || st=1
    kill $dec; wait $dec 2>/dev/null
    front=$((front + 1))
done
exit $st
