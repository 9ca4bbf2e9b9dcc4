#!/bin/bash
# meshcat end to end on one node, from one rxe device to the other: sizes
# 0 B .. 100 MB byte-identical (sha256; the demo sends 300 MB), several
# files at once,
# stdin -> stdout, names sanitised, no overwrite without -f, two receivers
# into one directory at once, a refused connection, a receiver found by
# its directory name, and a sender or receiver killed mid-transfer.
#   meshcat.sh MESHCAT      (run by meson in the rxe suite)
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma
MC=$(realpath "$1")
IFS=, read -ra A <<<"${MW_ADDRS:?}"
dst=${A[-1]}                      # listen here; the sender goes through the route
W=$(mktemp -d /tmp/meshcat-test.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
cd "$W" || exit 1
mkdir src out
port=$((7500 + RANDOM % 1000))
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
next_port() { port=$((port + 1)); }

# receive IN THE BACKGROUND: recv OUT_ARGS...; sets rpid
recv() { "$MC" -q -t 20 -l "$dst:$port" "$@" 2>recv.err & rpid=$!; }
# same FILE...: every FILE is byte-identical in out/
same() {
    local f
    for f; do
        [[ -f out/$(basename "$f") ]] && cmp -s "$f" "out/$(basename "$f")" || return 1
    done
}

tee src/zero </dev/null; head -c 1 /dev/urandom >src/one
head -c 4095 /dev/urandom >src/page-1; head -c $((1048576 + 1)) /dev/urandom >src/mib+1
for f in src/zero src/one src/page-1 src/mib+1; do
    recv -o out; "$MC" -q -t 20 "$dst:$port" "$f" 2>send.err; s=$?; wait $rpid; r=$?
    if ((s == 0 && r == 0)) && same "$f" && [[ $(sha256sum <"$f") == $(sha256sum <"out/${f#src/}") ]]; then
        ok "$(stat -c %s "$f") bytes, sha256 identical"
    else bad "$f: send $s recv $r: $(cat send.err recv.err)"; fi
    next_port
done

BIG_MB=${MW_MESHCAT_BIG_MB:-100}  # the sanitizer run uses less
head -c $((BIG_MB * 1000000)) /dev/urandom >src/big
recv -o out
"$MC" -t 20 "$dst:$port" src/big 2>send.err; s=$?; wait $rpid; r=$?
if ((s == 0 && r == 0)) && [[ $(sha256sum <src/big) == $(sha256sum <out/big) ]]; then
    ok "$BIG_MB MB, sha256 identical ($(tail -1 send.err))"
else bad "$BIG_MB MB: send $s recv $r: $(cat send.err recv.err)"; fi
rm -f out/big; next_port

mkdir out/many
recv -o out/many; "$MC" -q -t 20 "$dst:$port" src/one src/page-1 src/mib+1 2>send.err; s=$?
wait $rpid; r=$?
if ((s == 0 && r == 0)) && cmp -s src/one out/many/one && cmp -s src/page-1 out/many/page-1 &&
    cmp -s src/mib+1 out/many/mib+1; then ok "three files at once"
else bad "three files: send $s recv $r: $(cat send.err recv.err)"; fi
next_port

"$MC" -q -t 20 -l "$dst:$port" >stream.out 2>recv.err & rpid=$!
cat src/mib+1 src/page-1 | "$MC" -q -t 20 "$dst:$port" 2>send.err; s=$?; wait $rpid; r=$?
if ((s == 0 && r == 0)) && cat src/mib+1 src/page-1 >stream.want && cmp -s stream.want stream.out; then ok "stdin -> stdout"
else bad "stdin -> stdout: send $s recv $r: got $(wc -c <stream.out) bytes: $(cmp stream.want stream.out 2>&1) $(cat send.err recv.err)"; fi
next_port

cp src/one 'src/..\..\escaped'
mkdir -p out/jail
recv -o out/jail; "$MC" -q -t 20 "$dst:$port" 'src/..\..\escaped' 2>send.err; s=$?; wait $rpid; r=$?
if ((s == 0 && r == 0)) && [[ -f out/jail/escaped && ! -e escaped && ! -e out/escaped ]]; then
    ok "a name with ..\\ written inside the target directory only"
else bad "name sanitising: send $s recv $r: $(ls -R out | tr '\n' ' ') $(cat send.err recv.err)"; fi
next_port

echo old >out/one.txt; cp src/one src/one.txt
recv -o out; "$MC" -q -t 20 "$dst:$port" src/one.txt 2>send.err; s=$?; wait $rpid; r=$?
if ((s == 1 && r == 1)) && [[ $(cat out/one.txt) == old ]] && grep -q "exists" send.err; then
    ok "no overwrite without -f: $(cat send.err)"
else bad "overwrite: send $s recv $r: $(cat send.err recv.err)"; fi
recv -o out -f; "$MC" -q -t 20 "$dst:$port" src/one.txt 2>send.err; s=$?; wait $rpid; r=$?
if ((s == 0 && r == 0)) && cmp -s src/one.txt out/one.txt; then ok "-f overwrites"
else bad "-f: send $s recv $r: $(cat send.err recv.err)"; fi
next_port

# parts DIR: the receivers' temporaries in DIR
parts() { compgen -G "$1/.*.meshcat-part.*"; }

# two receivers into one directory at once, each with its own sender; the
# files are large enough for both transfers to overlap
mkdir -p out/shared src/a src/b
head -c 30000000 /dev/urandom >src/a/same; head -c 30000000 /dev/urandom >src/b/same
cp src/a/same src/a/one-of-two; cp src/b/same src/b/two-of-two
# both DIR_A_FILE DIR_B_FILE: both transfers at once; sets s1 r1 s2 r2 and
# overlap (1 when both temporaries were seen at the same time)
both() {
    local p2=$((port + 1)) i
    "$MC" -q -t 20 -l "$dst:$port" -o out/shared 2>recv1.err & local r1p=$!
    "$MC" -q -t 20 -l "$dst:$p2" -o out/shared 2>recv2.err & local r2p=$!
    "$MC" -q -t 20 "$dst:$port" "$1" 2>send1.err & local s1p=$!
    "$MC" -q -t 20 "$dst:$p2" "$2" 2>send2.err & local s2p=$!
    overlap=0
    for ((i = 0; i < 500; i++)); do
        (($(parts out/shared | wc -l) == 2)) && { overlap=1; break; }
        kill -0 $s1p 2>/dev/null || kill -0 $s2p 2>/dev/null || break
        sleep 0.01
    done
    wait $s1p; s1=$?; wait $r1p; r1=$?; wait $s2p; s2=$?; wait $r2p; r2=$?
    port=$((port + 2))
}
both src/a/one-of-two src/b/two-of-two
if ((s1 == 0 && r1 == 0 && s2 == 0 && r2 == 0)) && cmp -s src/a/one-of-two out/shared/one-of-two &&
    cmp -s src/b/two-of-two out/shared/two-of-two && ! parts out/shared >/dev/null; then
    ok "two receivers, two files, one directory (overlapped: $overlap)"
else bad "two receivers, two files: send $s1/$s2 recv $r1/$r2: $(ls -a out/shared) $(cat send?.err recv?.err)"; fi
# the same name from both: exactly one wins, whole; the other fails saying so
both src/a/same src/b/same
if ((s1 == 0 && r1 == 0 && s2 == 1 && r2 == 1)); then win=a lose=2
elif ((s1 == 1 && r1 == 1 && s2 == 0 && r2 == 0)); then win=b lose=1
else win=; fi
if [[ -n $win ]] && cmp -s src/$win/same out/shared/same && grep -q "same exists" send$lose.err &&
    ! parts out/shared >/dev/null; then
    ok "two receivers, one name: $win won (overlapped: $overlap), the other: $(cat send$lose.err)"
else bad "two receivers, one name: send $s1/$s2 recv $r1/$r2: $(ls -a out/shared) $(cat send?.err recv?.err)"; fi
rm -rf out/shared src/a src/b

"$MC" -q -t 1 "$dst:$port" src/one 2>send.err; s=$?
if ((s == 1)) && grep -q "refused" send.err; then ok "nobody listening: $(cat send.err)"
else bad "refused: send $s: $(cat send.err)"; fi
"$MC" -q --bogus 2>send.err; s=$?
((s == 2)) && ok "usage error exits 2" || bad "usage error exits $s"

# mid_transfer: wait until the receiver's partial file has 1 MB in it
mid_transfer() {
    local i f
    for ((i = 0; i < 400; i++)); do
        f=$(parts out | head -1)
        [[ -n $f ]] && (($(stat -c %s "$f" 2>/dev/null || echo 0) > 1000000)) && return 0
        sleep 0.02
    done
    return 1
}

# by directory name: a redis-server of the test's own; the receiver
# publishes itself, the sender (started first) waits for the name to appear
if [[ -x /usr/bin/redis-server ]]; then
    /usr/bin/redis-server --port 0 --unixsocket "$W/redis.sock" --save '' --appendonly no \
        --loglevel warning --notify-keyspace-events Kgx >/dev/null & redis=$!
    for _ in $(seq 100); do [[ -S $W/redis.sock ]] && break; sleep 0.05; done
    D=(--dir "unix:$W/redis.sock")
    mkdir out/byname
    "$MC" -q -t 20 "${D[@]}" job/sink/0 src/mib+1 2>send.err & spid=$!
    sleep 0.5
    "$MC" -q -t 20 "${D[@]}" -l "$dst:$port" --name job/sink/0 -o out/byname 2>recv.err; r=$?
    wait $spid; s=$?
    if ((s == 0 && r == 0)) && cmp -s src/mib+1 out/byname/mib+1; then
        ok "to a directory name: identical, the sender waited for the name"
    else bad "by name: send $s recv $r: $(cat send.err recv.err)"; fi
    "$MC" -q -t 2 "${D[@]}" job/sink/9 src/one 2>send.err; s=$?
    if ((s == 1)) && grep -q "not in the directory" send.err; then
        ok "an unknown name: exit $s ($(cat send.err))"
    else bad "unknown name: exit $s: $(cat send.err)"; fi
    kill $redis; wait $redis 2>/dev/null
    next_port
else bad "redis-server not installed (scripts/setup installs it)"; fi

# the kill tests need a transfer still under way when they strike: a file
# large enough, sent in small steps (4 KiB chunks, one in flight: 200 MB
# take seconds even on the same-host path, where 1 MiB chunks took 0.1 s
# and a sender killed "mid-transfer" had in fact finished; its bytes do
# not matter)
head -c 200000000 /dev/zero >src/big
SLOW=(--chunk 4K --window 1)

# killed sender: the receiver exits 1 and leaves no file named big
recv -o out; "$MC" -q -t 20 "${SLOW[@]}" "$dst:$port" src/big 2>send.err & spid=$!
mid_transfer || bad "sender killed: the transfer never got going"
kill -9 $spid; wait $spid 2>/dev/null
wait $rpid; r=$?
if ((r == 1)) && [[ ! -e out/big ]] && ! parts out >/dev/null; then
    ok "sender killed: receiver exit $r, no out/big, partial removed ($(cat recv.err))"
else bad "sender killed: receiver exit $r, $(ls out)"; fi
rm -f out/.big.meshcat-part.*; next_port

# killed receiver: the sender exits 1 with a message
recv -o out; "$MC" -q -t 5 "${SLOW[@]}" "$dst:$port" src/big 2>send.err & spid=$!
mid_transfer || bad "receiver killed: the transfer never got going"
kill -9 $rpid; wait $rpid 2>/dev/null
wait $spid; s=$?
if ((s == 1)) && [[ -s send.err ]]; then ok "receiver killed: sender exit $s ($(cat send.err))"
else bad "receiver killed: sender exit $s"; fi

((fails == 0)) && echo "all meshcat checks passed" || echo "$fails meshcat checks FAILED"
exit $((fails > 0))
