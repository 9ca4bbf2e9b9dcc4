#!/bin/bash
# The evhttp + meshwire example under a burst: 256 concurrent HTTP requests
# for blocks a back end exports, each served by a one-sided RDMA read in the
# same event loop; every body is checked byte for byte, bad requests get
# 404, and both processes stop cleanly on SIGTERM.
# GET /metrics passes promtool's check and counts what was served.
#   kvserve.sh KVSERVE PROMTOOL     (run by meson in the rxe suite)
set -u
source "$(dirname "$0")/../lib/rdma.sh"
need_rdma
KV=$(realpath "$1")
PROMTOOL=${2:?kvserve.sh KVSERVE PROMTOOL}
IFS=, read -ra A <<<"${MW_ADDRS:?}"
port=$((7700 + RANDOM % 500)) http=$((18000 + RANDOM % 1000))
log=$(mktemp)
"$KV" backend "${A[-1]}:$port" 256 65536 2> >(tee "$log" >&2) & back=$!
for _ in $(seq 100); do                    # until it listens (slow under sanitizers)
    grep -q "kvserve backend:" "$log" && break
    sleep 0.1
done
rm -f "$log"
"$KV" front "${A[-1]}:$port" "$http" & front=$!
trap 'kill $back $front 2>/dev/null' EXIT
python3 - "$http" "$PROMTOOL" <<'PY'
import re, subprocess, sys, threading, http.client, random, time
port, promtool = int(sys.argv[1]), sys.argv[2]
for _ in range(100):                       # the front end may still be starting
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=2).request("GET", "/")
        break
    except OSError:
        time.sleep(0.1)
def want(k, n=65536):                      # byte j of block k: (k * 131 + j) & 0xff
    return bytes((k * 131 + j) & 0xff for j in range(256)) * (n // 256)
expect = {k: want(k) for k in range(256)}
bad, lock = [], threading.Lock()
def get(k):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/block/%d" % k)
        r = c.getresponse(); body = r.read()
        if r.status != 200 or body != expect[k]:
            with lock: bad.append((k, r.status, len(body)))
    except Exception as e:
        with lock: bad.append((k, repr(e)))
threads = [threading.Thread(target=get, args=(random.randrange(256),)) for _ in range(256)]
t0 = time.time()
for t in threads: t.start()
for t in threads: t.join()
took = time.time() - t0
c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
c.request("GET", "/block/256"); r = c.getresponse(); r.read()
if r.status != 404: bad.append(("out of range", r.status))
c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
c.request("GET", "/metrics"); r = c.getresponse(); text = r.read().decode()
check = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True)
if r.status != 200 or check.returncode or check.stdout or check.stderr:
    bad.append(("/metrics", r.status, (check.stdout + check.stderr).decode()[:300]))
served = re.search(r'^kvserve_requests_total\{result="served"\} (\d+)$', text, re.M)
rdma = re.search(r'^meshwire_conn_rdma_bytes_total\{.*\} (\d+)$', text, re.M)
if not served or int(served.group(1)) < 256 or not rdma or int(rdma.group(1)) < 256 * 65536:
    bad.append(("/metrics counts", served and served.group(0), rdma and rdma.group(0)))
if bad:
    print("FAIL:", len(bad), "bad answers, e.g.", bad[:5]); sys.exit(1)
print("256 concurrent requests answered correctly in %.2f s; /block/256 -> 404; "
      "/metrics passes promtool" % took)
PY
rc=$?
kill -TERM $front $back
wait $front; f=$?; wait $back; b=$?
trap - EXIT
echo "front exit $f, backend exit $b"
((rc == 0 && f == 0 && b == 0))
