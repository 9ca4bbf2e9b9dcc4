#!/usr/bin/python3
"""disagg.py: disaggregated inference, small.  A prefill process runs the
model of model.py over each prompt and writes the request's KV blocks into
a decode worker's pool with one prepared transfer and a note; decode
workers continue generation from those blocks and send the tokens back.
Workers find the prefill and it finds them through the directory; one may
leave (SIGTERM: it finishes what it holds) and come back while requests
keep being served.

    disagg.py prefill DIRECTORY JOB HTTP_PORT     (0: a free port, printed)
        POST /generate {"prompt": "...", "tokens": N, "via": VIA}
             -> {"rid", "tokens", "worker", "timing": {...}}
           VIA: "meshwire" (default: the blocks written into the worker's
           pool), "http" (the same blocks POSTed to the worker's aiohttp
           server), "recompute" (the worker runs the prefill itself).
           "tokens": 0 moves the KV and generates nothing (for measuring
           the transfer alone).
        GET /metrics   meshwire's counters and the server's, for Prometheus
        POST /move {"via", "requests", "len"}: that many transfers of "len"
             blocks, no model run: each side's CPU seconds (the bench's)
    disagg.py decode DIRECTORY JOB ID [PAGES]
    disagg.py reference PROMPT N      one process: what every answer must equal

DIRECTORY is the store's URL ("redis://HOST" or "unix:PATH").  The model's
size comes from DISAGG_MODEL="LAYERS,HEADS,HEAD_DIM" (default 2,4,16).
Connections take MW_TRANSPORT like every meshwire program."""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import resource
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch
from aiohttp import ClientSession, web

import meshwire
from model import Config, Model

PAGE = 16                    # tokens a page of a pool holds (vLLM's block size)
PAGES = 512                  # pages in a decode worker's pool
STAGING = 16                 # prefill's registered caches: requests not yet answered


def config() -> Config:
    layers, heads, head_dim = map(int, os.environ.get("DISAGG_MODEL", "2,4,16").split(","))
    return Config(layers=layers, heads=heads, head_dim=head_dim)


# The model runs on a thread of its own: torch lets go of the GIL in its
# kernels, so the loop keeps serving meanwhile (the directory's lease
# renewals, transfers, HTTP): a prefill of seconds stalls nothing.
COMPUTE = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model")


async def compute(fn: Callable, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(COMPUTE, fn, *args)


def cpu_seconds() -> float:
    return time.process_time()


def user_seconds() -> float:
    """CPU in the process itself, not the kernel's: on soft-RoCE the kernel
    time of a post includes the emulated NIC's work (a hardware NIC's)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


async def serve_http(app: web.Application, port: int = 0) -> tuple:
    """@app on 127.0.0.1:@port (0: a free one): (runner, port)."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


# --- decode ---------------------------------------------------------------------

class Decode:
    """A decode worker: a KV pool shared as "kv", requests taken from
    notes (the blocks already in the pool, or the prompt to recompute) and
    from its HTTP server (the blocks in the body)."""

    def __init__(self, agent: meshwire.Agent, model: Model, pool: torch.Tensor, wid: str):
        self.agent, self.model, self.pool, self.wid = agent, model, pool, wid
        self.running: set = set()

    def start(self, req: dict, fill) -> None:
        t = asyncio.ensure_future(self.serve(req, fill))
        self.running.add(t)
        t.add_done_callback(self.running.discard)

    async def serve(self, req: dict, fill) -> None:
        """@fill puts the prompt's blocks into a fresh cache."""
        n = req["len"]
        cache = self.model.new_cache(self.model.cfg.max_tokens)
        first = await compute(fill, cache) if req["tokens"] else 0   # (0: the transfer alone)
        ready = time.monotonic()                      # KV in place, first token known
        tokens = (await compute(self.model.decode, cache, n, first, req["tokens"])
                  if req["tokens"] else [])
        back = await self.agent.connect(req["reply"])
        await self.agent.send_notif(back, json.dumps(
            {"rid": req["rid"], "tokens": tokens, "worker": self.wid,
             "ready": ready, "cpu": cpu_seconds(), "user": user_seconds()}).encode())

    def from_note(self, note: bytes) -> None:
        req = json.loads(note)
        if "pages" in req:                                  # written into our pool
            def fill(cache: torch.Tensor) -> int:
                n = req["len"]
                cache[:n] = self.pool[req["pages"]].view(-1, self.model.cfg.block)[:n]
                return req["first"]
        else:                                               # recompute the prefill
            def fill(cache: torch.Tensor) -> int:
                return self.model.prefill(req["prompt"], cache)[0]
        self.start(req, fill)

    async def from_http(self, request: web.Request) -> web.Response:
        body = await request.read()
        hlen = int.from_bytes(body[:4], "little")
        req = json.loads(body[4:4 + hlen])
        blocks = torch.frombuffer(bytearray(body[4 + hlen:]), dtype=torch.float32)
        blocks = blocks.view(req["len"], self.model.cfg.block)

        def fill(cache: torch.Tensor) -> int:
            cache[:req["len"]] = blocks
            return req["first"]
        self.start(req, fill)
        return web.Response(text="taken")


async def decode(url: str, job: str, wid: str, pages: int) -> int:
    model = Model(config())
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with meshwire.Context() as ctx, await ctx.directory(url) as d:
        pool = ctx.tensor((pages, PAGE, model.cfg.block), torch.float32)
        app = web.Application(client_max_size=1 << 30)
        worker: List[Decode] = []                       # (the port goes into the agent's tag)
        app.router.add_post("/kv", lambda request: worker[0].from_http(request))
        runner, port = await serve_http(app)
        agent = d.agent(f"{job}/decode/{wid}", tag=f"http={port}")
        agent.register("kv", pool)
        w = Decode(agent, model, pool, wid)
        worker.append(w)
        async with await agent.start():
            print(f"decode {wid}: serving {pages} pages, http {port}", flush=True)

            async def take() -> None:
                async for _, note in agent.notifications():
                    w.from_note(note)
            taker = asyncio.ensure_future(take())
            await stop.wait()
            # leaving: out of the directory first (no new work), then finish
            # what was taken; prefill sends elsewhere what we never answer
            await d.unpublish(agent.name)
            await asyncio.sleep(0.2)                   # notes already on their way
            while w.running:
                await asyncio.gather(*w.running, return_exceptions=True)
            taker.cancel()
        await runner.cleanup()
        print(f"decode {wid}: left", flush=True)
    return 0


# --- prefill --------------------------------------------------------------------

class Worker:
    """A decode worker as prefill sees it: its agent, its pool's free pages
    (prefill is the pool's only writer; an answer frees a request's)."""

    def __init__(self, name: str, peer: meshwire.RemoteAgent, pages: int, http: str):
        self.name, self.peer, self.http = name, peer, http
        self.free = list(range(pages))
        self.pending: Dict[int, dict] = {}   # rid -> request, sent to it


class Prefill:
    def __init__(self, ctx: meshwire.Context, agent: meshwire.Agent, job: str):
        self.agent, self.job = agent, job
        self.model = Model(config())
        self.block = self.model.cfg.block
        # the caches prefill computes into: registered once, reused
        self.staging = ctx.tensor((STAGING, self.model.cfg.max_tokens, self.block),
                                  torch.float32)
        self.free_staging: asyncio.Queue = asyncio.Queue()
        for i in range(STAGING):
            self.free_staging.put_nowait(i)
        self.workers: Dict[str, Worker] = {}
        self.rids = itertools.count(1)
        self.answers: Dict[int, asyncio.Future] = {}
        self.order = itertools.count()
        self.served = self.redispatched = 0
        self.http: Optional[ClientSession] = None

    async def follow_workers(self, d: meshwire.Directory) -> None:
        async for event, entry in d.watch(f"{self.job}/decode/"):
            if event == "joined" and entry.name not in self.workers:
                try:
                    peer = await self.agent.connect(entry.name)
                except OSError as e:
                    print(f"prefill: {entry.name}: {e}", flush=True)
                    continue
                pages = entry.regions.get("kv", 0) // (PAGE * self.block * 4)
                http = f"http://127.0.0.1:{entry.tag.split('=')[1]}/kv"
                self.workers[entry.name] = Worker(entry.name, peer, pages, http)
                print(f"prefill: worker {entry.name} joined ({pages} pages)", flush=True)
            elif event == "left" and entry.name in self.workers:
                w = self.workers.pop(entry.name)
                print(f"prefill: worker {entry.name} left, {len(w.pending)} pending",
                      flush=True)
                self.agent.forget(entry.name)
                for req in w.pending.values():   # its answers may never come
                    if req.get("sent_to") is w:  # (one still being sent: dispatch sees to it)
                        self.redispatched += 1
                        asyncio.ensure_future(self.dispatch(req))

    async def take_answers(self) -> None:
        async for _, note in self.agent.notifications():
            ans = json.loads(note)
            for w in self.workers.values():
                req = w.pending.pop(ans["rid"], None)
                if req is not None:
                    w.free.extend(req.get("pages", ()))
            f = self.answers.get(ans["rid"])
            if f is not None and not f.done():   # a redispatched one's late twin: dropped
                f.set_result(ans)

    def pick(self, need: int) -> Optional[Worker]:
        live = [w for w in self.workers.values() if len(w.free) >= need]
        return live[next(self.order) % len(live)] if live else None

    async def dispatch(self, req: dict) -> None:
        """Send @req to a worker (another one if the first goes away) and
        record how long moving its KV took."""
        while True:
            if req["rid"] not in self.answers:  # answered meanwhile (by the worker that
                return                          # left): its staging may be another's now
            w = self.pick(-(-req["len"] // PAGE))
            if w is None:
                await asyncio.sleep(0.05)       # no worker with room: wait for one
                continue
            w.pending[req["rid"]] = req
            note = {k: req[k] for k in ("rid", "len", "first", "tokens")}
            note["reply"] = self.agent.name
            t0 = time.monotonic()
            req["sent_to"] = None
            try:
                await self.send(w, req, note)
            except OSError as e:                # it went away under us: another one
                w.pending.pop(req["rid"], None)
                w.free.extend(req.pop("pages", ()))
                print(f"prefill: {w.name}: {e}; sending request {req['rid']} elsewhere",
                      flush=True)
                self.redispatched += 1
                continue
            req["transfer_s"] = time.monotonic() - t0
            req["sent_to"] = w
            if self.workers.get(w.name) is w:
                return
            # it left while we sent: it may answer, but nothing says it will
            print(f"prefill: {w.name} left as request {req['rid']} reached it; "
                  "sending it elsewhere too", flush=True)
            self.redispatched += 1

    async def send(self, w: Worker, req: dict, note: dict) -> None:
        n, via = req["len"], req["via"]
        if via == "recompute":
            note["prompt"] = req["prompt"]
            await self.agent.send_notif(w.peer, json.dumps(note).encode())
            return
        blocks = self.staging[req["staging"]][:n]
        if via == "http":
            head = json.dumps(note).encode()
            body = [len(head).to_bytes(4, "little"), head, blocks.numpy().tobytes()]
            async with self.http.post(w.http, data=b"".join(body)) as r:
                if r.status != 200:
                    raise ConnectionError(f"{w.http}: HTTP {r.status}")
            return
        # a page an entry: its tokens' blocks lie together on both sides
        pages = [w.free.pop() for _ in range(-(-n // PAGE))]
        req["pages"] = note["pages"] = pages
        cache = self.staging[req["staging"]]
        local = [cache[i * PAGE:(i + 1) * PAGE] for i in range(len(pages))]
        remote = [("kv", p * PAGE * self.block * 4) for p in pages]
        with self.agent.prepare(w.peer, local, remote) as x:
            await self.agent.transfer(x, json.dumps(note).encode())

    async def move(self, via: str, requests: int, length: int) -> dict:
        """@requests transfers of @length blocks each (4 at a time) with no
        model run on either side: each side's CPU seconds for them."""
        base = await self.generate([0] * length, 0, via)     # the decode side's CPU now
        cpu0, user0, t0 = cpu_seconds(), user_seconds(), time.monotonic()
        sem = asyncio.Semaphore(4)

        async def one() -> dict:
            async with sem:
                return await self.generate([0] * length, 0, via)
        answers = await asyncio.gather(*(one() for _ in range(requests)))
        return {"bytes": requests * length * self.block * 4,
                "wall_s": time.monotonic() - t0,
                "prefill_cpu_s": cpu_seconds() - cpu0,
                "prefill_user_s": user_seconds() - user0,
                "decode_cpu_s": max(a["cpu"] for a in answers) - base["cpu"],
                "decode_user_s": max(a["user"] for a in answers) - base["user"]}

    async def generate(self, prompt: List[int], tokens: int, via: str) -> dict:
        rid = next(self.rids)
        t0 = time.monotonic()
        req = {"rid": rid, "len": len(prompt), "tokens": tokens, "via": via,
               "prompt": prompt}
        self.answers[rid] = asyncio.get_running_loop().create_future()
        staging = None
        try:
            if via == "recompute":
                req["first"] = None
            else:
                staging = req["staging"] = await self.free_staging.get()
                req["first"] = ((await compute(self.model.prefill, prompt,
                                               self.staging[staging]))[0] if tokens else 0)
            prefilled = time.monotonic()
            await self.dispatch(req)
            ans = await self.answers[rid]         # (the blocks kept until then: a
                                                  # worker that leaves gets them again)
        finally:
            del self.answers[rid]
            if staging is not None:
                self.free_staging.put_nowait(staging)
        self.served += 1
        ans["timing"] = {"prefill_s": prefilled - t0, "transfer_s": req["transfer_s"],
                         "ttft_s": ans.pop("ready") - t0, "total_s": time.monotonic() - t0,
                         "kv_bytes": len(prompt) * self.block * 4 if via != "recompute" else 0}
        return ans


async def prefill(url: str, job: str, http_port: int) -> int:
    import prometheus_client
    cfg = config()
    async with meshwire.Context() as ctx, await ctx.directory(url) as d, \
            ClientSession() as http:
        async with await d.agent(f"{job}/prefill/0").start() as agent:
            p = Prefill(ctx, agent, job)
            p.http = http
            tasks = [asyncio.ensure_future(p.follow_workers(d)),
                     asyncio.ensure_future(p.take_answers())]
            registry = prometheus_client.CollectorRegistry()
            registry.register(meshwire.Collector(ctx))

            async def generate(request: web.Request) -> web.Response:
                try:
                    body = await request.json()
                    prompt, tokens = list(body["prompt"].encode()), int(body["tokens"])
                    via = body.get("via", "meshwire")
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    return web.json_response({"error": f"bad request: {e}"}, status=400)
                if via not in ("meshwire", "http", "recompute"):
                    return web.json_response({"error": f"unknown via {via!r}"}, status=400)
                if not (0 < len(prompt) and 0 <= tokens and
                        len(prompt) + tokens <= cfg.max_tokens):
                    return web.json_response(
                        {"error": f"prompt and tokens must fit {cfg.max_tokens}"}, status=400)
                return web.json_response(await p.generate(prompt, tokens, via))

            async def metrics(request: web.Request) -> web.Response:
                text = prometheus_client.generate_latest(registry).decode()
                text += ("# HELP disagg_requests_total Requests answered.\n"
                         "# TYPE disagg_requests_total counter\n"
                         f"disagg_requests_total {p.served}\n"
                         "# HELP disagg_redispatched_total Requests sent to a second worker.\n"
                         "# TYPE disagg_redispatched_total counter\n"
                         f"disagg_redispatched_total {p.redispatched}\n")
                return web.Response(text=text, content_type="text/plain")

            async def move(request: web.Request) -> web.Response:
                body = await request.json()
                if body.get("via") not in ("meshwire", "http"):
                    return web.json_response({"error": "via: meshwire or http"}, status=400)
                return web.json_response(await p.move(body["via"], int(body["requests"]),
                                                      int(body["len"])))

            app = web.Application()
            app.router.add_post("/generate", generate)
            app.router.add_get("/metrics", metrics)
            app.router.add_post("/move", move)
            runner, port = await serve_http(app, http_port)
            print(f"prefill: http://127.0.0.1:{port}", flush=True)
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await stop.wait()
            await runner.cleanup()
            for t in tasks:
                t.cancel()
    return 0


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["decode"] and len(args) in (4, 5):
        return asyncio.run(decode(args[1], args[2], args[3],
                                  int(args[4]) if len(args) == 5 else PAGES))
    if args[:1] == ["prefill"] and len(args) == 4:
        return asyncio.run(prefill(args[1], args[2], int(args[3])))
    if args[:1] == ["reference"] and len(args) == 3:
        print(json.dumps(Model(config()).generate(list(args[1].encode()), int(args[2]))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
