#!/bin/bash
# The README's examples, run as a user would: hello's server and its
# blocking client, the same client on an epoll loop, and allreduce as three
# processes given their entries on the command line ("A,B:PORT": each rank
# reached through the address its peers share), then byname and allreduce
# finding each other through a Redis.
# With HELLO_PY (the Python binding built), hello.py talks to hello both
# ways round: a Python client to the C server, the C client to Python's.
# With KV_AGENT_PY too, kv_agent.py's two roles move KV blocks through the
# directory: decode checks every request's blocks as its note arrives.
#   examples.sh HELLO EPOLL_CLIENT ALLREDUCE [HELLO_PY KV_AGENT_PY]   (meson, rxe suite)
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma
HELLO=$(realpath "$1") EPOLL=$(realpath "$2") ALLREDUCE=$(realpath "$3")
HELLO_PY=${4:+$(realpath "$4")}
KV_AGENT_PY=${5:+$(realpath "$5")}
IFS=, read -ra A <<<"${MW_ADDRS:?}"
port=$((7200 + RANDOM % 400))
st=0
fail() { echo "FAIL: $*"; st=1; }

# serve_once PORT [SERVER]: hello's server (or SERVER, as hello.py) in the
# background, once it listens
serve_once() {
    local log
    log=$(mktemp)
    ${2:-$HELLO} -l "${A[-1]}:$1" >"$log" 2>&1 & server=$!
    # (a Python server starts in seconds under emulation; one that never
    # listens must not be left holding the device: the device test waits)
    retry 60 grep -q listening "$log" || { cat "$log"; kill "$server"; return 1; }
    tail -f "$log" --pid=$server &
}

# hello's client is given a first address that reaches no one (it tries
# the next); the epoll client the server's own
for client in "$HELLO" "$EPOLL"; do
    serve_once "$port" || { st=1; continue; }
    target="${A[-1]}:$port"
    [[ $client == "$HELLO" ]] && target="${A[0]%.*}.254,$target"
    timeout 60 "$client" "$target" || fail "$client (exit $?)"
    wait $server || fail "hello server for $client (exit $?)"
    port=$((port + 1))
done

if [[ -n $HELLO_PY ]]; then
    for pair in "$HELLO $HELLO_PY" "$HELLO_PY $HELLO"; do    # SERVER CLIENT
        read -r srv cli <<<"$pair"
        serve_once "$port" "$srv" || { st=1; continue; }
        timeout 60 "$cli" "${A[-1]}:$port" || fail "$cli against $srv (exit $?)"
        wait $server || fail "$srv serving $cli (exit $?)"
        port=$((port + 1))
    done
fi

entries=()
for r in 0 1 2; do entries+=("${A[0]},${A[-1]}:$((port + r))"); done
pids=()
for r in 0 1 2; do
    timeout 120 "$ALLREDUCE" "$r" "${entries[@]}" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "an allreduce rank (exit $?)"; done

# Through a directory (a redis-server of the test's own): byname's server
# publishes ex/kv/0 sharing 1 MiB, its fetcher reads it knowing only the
# name; three allreduce ranks form their communicator from it.
BYNAME=$(dirname "$ALLREDUCE")/byname
if [[ -x /usr/bin/redis-server ]]; then
    sock=$(mktemp -u /tmp/examples-redis.XXXXXX)
    /usr/bin/redis-server --port 0 --unixsocket "$sock" --save '' --appendonly no \
        --loglevel warning --notify-keyspace-events Kgx >/dev/null & redis=$!
    retry 10 test -S "$sock" || fail "redis-server never made its socket"
    log=$(mktemp)
    "$BYNAME" serve "unix:$sock" ex/kv/0 >"$log" 2>&1 & server=$!
    retry 20 grep -q published "$log" || { cat "$log"; st=1; }
    timeout 60 "$BYNAME" fetch "unix:$sock" ex/kv/0 || fail "byname fetch (exit $?)"
    wait $server || { cat "$log"; st=1; }
    pids=()
    for r in 0 1 2; do
        timeout 120 "$ALLREDUCE" --dir "unix:$sock" ex-job "$r" 3 & pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "an allreduce rank through the directory (exit $?)"; done
    if [[ -n $KV_AGENT_PY ]]; then
        timeout 240 "$KV_AGENT_PY" decode "unix:$sock" ex-agent 8 >"$log" 2>&1 & server=$!
        # (torch's import alone takes about a minute under emulation)
        retry 150 grep -q listening "$log" || { cat "$log"; fail "kv_agent decode never listened"; }
        timeout 120 "$KV_AGENT_PY" prefill "unix:$sock" ex-agent 8 || fail "kv_agent prefill (exit $?)"
        wait $server || fail "kv_agent decode (exit $?)"
        cat "$log"
        [[ $(grep -c "in place" "$log") == 8 ]] || { echo "FAIL: kv_agent: 8 requests in place"; st=1; }
    fi
    kill $redis
    rm -f "$log" "$sock"
else
    echo "FAIL: redis-server not installed (scripts/setup installs it)"
    st=1
fi
exit $st
