#!/usr/bin/python3
"""bench.py: apps/disagg measured, each way beside the others in one run.

    bench.py [REPEATS] [CSV]

A prefill process and one decode worker (disagg.py, a 16-layer model of
64 dimensions: 8 KiB of KV per token, little compute), through a directory.  Per
repeat, for the KV going by meshwire over RDMA (one prepared transfer and
a note), by HTTP/TCP (aiohttp POST of the same blocks) and not at all
(decode recomputes the prefill), then by meshwire on the same-host path
(a second pair of processes):
  - time to first token: the request reaching prefill to the decode worker
    holding the KV and the first token (5 requests of a 128-token prompt);
  - KV transfer time (1 MiB), and the decode worker's CPU per request
    (taking the KV in, or recomputing it), the same requests;
  - CPU seconds per GiB of KV moved, each side (64 transfers, no model
    run), and the user part alone (on soft-RoCE the kernel part includes
    the emulated NIC's work, done in the poster's system calls);
then the idle CPU of the decode worker waiting for work (10 s).
Rows go to CSV (metric,way,bytes,0,repeat,value: scripts/bench's
format); medians are printed as a table."""
import asyncio
import os
import statistics
import sys
import time

os.environ.setdefault("DISAGG_MODEL", "16,4,16")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Cluster          # noqa: E402

PROMPT = 128
LATENCY_REQUESTS = 5
MOVE_REQUESTS = 64
WAYS = ("meshwire", "http", "recompute")
COLUMNS = ("rdma", "local", "http", "recompute")      # meshwire's two paths, the baselines


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(repeats: int, csv: str) -> int:
    rows: list = []

    def rec(metric: str, way: str, size: int, rep: int, value: float) -> None:
        rows.append((metric, way, size, rep, value))
        with open(csv, "a") as f:
            f.write(f"{metric},disagg-{way},{size},0,{rep},{value:.6g}\n")

    prompt = "".join(chr(97 + i % 26) for i in range(PROMPT))

    async def run(transport: str, ways: tuple, idle: bool) -> None:
        """@ways (of WAYS) with the processes on @transport; columns named
        by the path for meshwire's way."""
        async with Cluster(f"bench{os.getpid()}{transport}",
                           env={"MW_TRANSPORT": transport}) as c:
            await c.start_prefill()
            worker = await c.start_decode("0")
            for way in ways:                               # warm: first connection, paths
                await c.generate(prompt, 1, way)
            for rep in range(1, repeats + 1):
                print(f"disagg bench: round {rep}, {transport}", file=sys.stderr)
                for way in ways:
                    col = {"meshwire": "rdma" if transport == "rdma" else "local"}.get(way, way)
                    answers = [await c.generate(prompt, 1, way) for _ in range(LATENCY_REQUESTS)]
                    t = [a["timing"] for a in answers]
                    kv = t[0]["kv_bytes"]
                    rec("disagg_ttft_ms", col, kv, rep,
                        1e3 * statistics.median(x["ttft_s"] for x in t))
                    # what the decode worker's CPU spent on a request (no token decoded)
                    rec("disagg_decode_cpu_ms_per_request", col, kv, rep,
                        1e3 * (answers[-1]["cpu"] - answers[0]["cpu"]) / (len(answers) - 1))
                    if way == "recompute":
                        continue
                    rec("disagg_kv_transfer_ms", col, kv, rep,
                        1e3 * statistics.median(x["transfer_s"] for x in t))
                    m = await c.move(way, MOVE_REQUESTS, PROMPT)
                    gib = m["bytes"] / (1 << 30)
                    rec("disagg_prefill_cpu_s_per_gib", col, m["bytes"], rep,
                        m["prefill_cpu_s"] / gib)
                    rec("disagg_decode_cpu_s_per_gib", col, m["bytes"], rep,
                        m["decode_cpu_s"] / gib)
                    rec("disagg_prefill_user_s_per_gib", col, m["bytes"], rep,
                        m["prefill_user_s"] / gib)
                    rec("disagg_decode_user_s_per_gib", col, m["bytes"], rep,
                        m["decode_user_s"] / gib)
                    rec("disagg_move_mib_s", col, m["bytes"], rep,
                        m["bytes"] / (1 << 20) / m["wall_s"])
            if idle:
                await asyncio.sleep(2)                     # settle
                pid = worker.proc.pid
                cpu0, t0 = proc_cpu(pid), time.monotonic()
                await asyncio.sleep(10)
                rec("disagg_decode_idle_cpu_pct", "rdma", 0, 1,
                    100 * (proc_cpu(pid) - cpu0) / (time.monotonic() - t0))
            for wid in list(c.decoders):
                await c.stop_decode(wid)
            await c.prefill.stop()

    await run("rdma", WAYS, idle=True)
    await run("auto", ("meshwire",), idle=False)           # prefill and decode share the host

    def med(metric: str, way: str) -> str:
        v = [r[4] for r in rows if r[0] == metric and r[1] == way]
        return f"{statistics.median(v):.2f}" if v else "-"
    print(f"\napps/disagg, {repeats} repeat(s), medians; a {PROMPT}-token prompt's KV: "
          f"{rows[0][2] / (1 << 20):.1f} MiB; RDMA on rxe, same-host in one VM")
    print(f"{'':34}{'RDMA':>10}{'same-host':>10}{'HTTP/TCP':>10}{'recompute':>10}")
    for metric, label in (("disagg_ttft_ms", "time to first token, ms"),
                          ("disagg_kv_transfer_ms", "KV transfer, ms"),
                          ("disagg_decode_cpu_ms_per_request", "decode CPU per request, ms"),
                          ("disagg_move_mib_s", "KV moved, MiB/s (4 at a time)"),
                          ("disagg_prefill_cpu_s_per_gib", "prefill CPU s per GiB"),
                          ("disagg_decode_cpu_s_per_gib", "decode CPU s per GiB"),
                          ("disagg_prefill_user_s_per_gib", "prefill user CPU s per GiB"),
                          ("disagg_decode_user_s_per_gib", "decode user CPU s per GiB")):
        print(f"{label:34}" + "".join(f"{med(metric, w):>10}" for w in COLUMNS))
    print(f"{'decode worker idle, % of a core':34}{med('disagg_decode_idle_cpu_pct', 'rdma'):>10}")
    return 0


if __name__ == "__main__":
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sys.exit(asyncio.run(main(reps, sys.argv[2] if len(sys.argv) > 2 else "/dev/null")))
