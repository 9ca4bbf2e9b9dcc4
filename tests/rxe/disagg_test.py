#!/usr/bin/python3
"""apps/disagg as its user runs it: a prefill process and two decode
workers found through a directory (a redis-server of the test's own).
Every request's tokens must equal a one-process run of the same model;
worker 1 leaves (SIGTERM) and comes back mid-run while requests keep
coming, and none is lost or answered twice.  The HTTP and recompute ways
give the same tokens (not in the run over RDMA: they use no meshwire, and
the host's runs have them); bad requests get 400; GET /metrics passes
promtool's check and counts what was served.

    disagg_test.py PROMTOOL      (meson, suites rxe and python; MW_TRANSPORT
                                 chooses the path, as for every program)"""
import asyncio
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "apps", "disagg"))
from cluster import Cluster          # noqa: E402
from disagg import config            # noqa: E402
from model import Model              # noqa: E402

# Three waves.  Over RDMA (the soft-RoCE VM, where a request costs about
# 20 times what it costs on the host) of 4, else of 8: that run is there
# for the path, and the path is the same for every request.
WAVE = 4 if os.environ.get("MW_TRANSPORT") == "rdma" else 8
REQUESTS = 3 * WAVE
PARALLEL = 4


def requests(seed: int, n: int) -> list:
    rnd = random.Random(seed)
    return [("".join(rnd.choice("abcdefghij klmnopqrstuvwxyz.") for _ in range(rnd.randint(4, 40))),
             rnd.randint(1, 12)) for _ in range(n)]


async def run_wave(c: Cluster, wave: list, answers: list, via: str = "meshwire") -> None:
    sem = asyncio.Semaphore(PARALLEL)

    async def one(prompt: str, tokens: int) -> None:
        async with sem:
            answers.append((prompt, tokens, await c.generate(prompt, tokens, via)))
    await asyncio.gather(*(one(p, t) for p, t in wave))


async def main(promtool: str) -> int:
    model = Model(config())
    reqs = requests(7, REQUESTS)
    want = {(p, t): model.generate(list(p.encode()), t) for p, t in reqs}
    bad: list = []
    async with Cluster(f"disagg{os.getpid()}") as c:
        await c.start_prefill()
        await asyncio.gather(c.start_decode("0"), c.start_decode("1"))
        answers: list = []
        await run_wave(c, reqs[:WAVE], answers)

        # worker 1 leaves while the second wave is under way, and comes back
        wave = asyncio.ensure_future(run_wave(c, reqs[WAVE:2 * WAVE], answers))
        await asyncio.sleep(0.5)
        rc = await c.stop_decode("1")
        if rc != 0:
            bad.append(f"decode 1 left with status {rc}")
        await c.start_decode("1")
        await wave
        mark = len(answers)
        await run_wave(c, reqs[2 * WAVE:], answers)

        rids = [a["rid"] for _, _, a in answers]
        if len(answers) != REQUESTS or len(set(rids)) != REQUESTS:
            bad.append(f"{len(answers)} answers, {len(set(rids))} distinct, for {REQUESTS}")
        for prompt, tokens, a in answers:
            if a["tokens"] != want[(prompt, tokens)]:
                bad.append(f"request {a['rid']} ({prompt!r}, {tokens}) on worker "
                           f"{a['worker']}: {a['tokens']} != {want[(prompt, tokens)]}")
        after = {a["worker"] for _, _, a in answers[mark:]}
        if after != {"0", "1"}:
            bad.append(f"after worker 1 came back, only workers {after} answered")

        # the other ways give the same tokens (they use no meshwire: the
        # run over RDMA in the soft-RoCE VM leaves them to the host's runs)
        others = () if os.environ.get("MW_TRANSPORT") == "rdma" else ("http", "recompute")
        for via in others:
            more: list = []
            await run_wave(c, reqs[:4], more, via)
            for prompt, tokens, a in more:
                if a["tokens"] != want[(prompt, tokens)]:
                    bad.append(f"via {via}: ({prompt!r}, {tokens}): {a['tokens']}")
        for body, what in (({"prompt": "x", "tokens": 1, "via": "pigeon"}, "unknown via"),
                           ({"prompt": "x" * 300, "tokens": 1}, "must fit"),
                           ({"tokens": 1}, "bad request")):
            async with c.http.post(f"{c.base}/generate", json=body) as r:
                text = await r.text()
                if r.status != 400 or what not in text:
                    bad.append(f"{body}: HTTP {r.status} {text[:200]}")

        text = await c.get("/metrics")
        check = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                               capture_output=True)
        if check.returncode or check.stdout or check.stderr:
            bad.append("promtool: " + (check.stdout + check.stderr).decode()[:400])
        served = re.search(r"^disagg_requests_total (\d+)$", text, re.M)
        if not served or int(served.group(1)) != REQUESTS + 4 * len(others):
            bad.append(f"disagg_requests_total: {served and served.group(0)}")
        if not re.search(r"^meshwire_connections\{.*\} [1-9]", text, re.M):
            bad.append("/metrics shows no meshwire connection")

        again = re.search(r"^disagg_redispatched_total (\d+)$", text, re.M)
        redispatched = again.group(1) if again else "?"
        if not again:
            bad.append("/metrics has no disagg_redispatched_total")
        for wid in list(c.decoders):
            if await c.stop_decode(wid) != 0:
                bad.append(f"decode {wid} did not stop cleanly")
        if await c.prefill.stop() != 0:
            bad.append("prefill did not stop cleanly")
    for b in bad:
        print("disagg: FAIL:", b, file=sys.stderr)
    print(f"disagg: {len(answers)} requests answered by the right tokens, "
          f"{redispatched} sent again when worker 1 left" if not bad else
          f"disagg: {len(bad)} failures", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    if len([a for a in os.environ.get("MW_ADDRS", "").split(",") if a]) < 2:
        print("disagg: needs RDMA addresses (MW_ADDRS): skipped", file=sys.stderr)
        sys.exit(77)
    sys.exit(asyncio.run(main(sys.argv[1])))
