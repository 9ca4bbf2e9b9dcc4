#!/usr/bin/python3
"""disagg.py: disaggregated inference, small.  A prefill process runs the
model of model.py over each prompt and writes the request's KV blocks into
a decode worker's pool with one prepared transfer and a note; decode
workers continue generation from those blocks and send the tokens back.
Workers find the prefill and it finds them through the directory; one may
leave (SIGTERM: it finishes what it holds) and come back while requests
keep being served.

    disagg.py prefill DIRECTORY JOB HTTP_PORT
        POST /generate {"prompt": "...", "tokens": N} -> {"rid", "tokens", "worker"}
        GET /metrics   meshwire's counters and the server's, for Prometheus
    disagg.py decode DIRECTORY JOB ID [SLOTS]
    disagg.py reference PROMPT N      one process: what every answer must equal

DIRECTORY is the store's URL ("redis://HOST" or "unix:PATH")."""
from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sys
from typing import Dict, List, Optional

import torch

import meshwire
from model import Config, Model

SLOTS = 4096                 # blocks in a decode worker's pool


# --- decode ---------------------------------------------------------------------

async def decode(url: str, job: str, wid: str, slots: int) -> int:
    model = Model(Config())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with meshwire.Context() as ctx, await ctx.directory(url) as d:
        pool = ctx.tensor((slots, model.cfg.block), torch.float32)
        agent = d.agent(f"{job}/decode/{wid}")
        agent.register("kv", pool)
        async with await agent.start():
            print(f"decode {wid}: serving {slots} slots", flush=True)
            running: set = set()

            async def serve(peer: str, note: bytes) -> None:
                req = json.loads(note)
                n = req["len"]
                cache = model.new_cache(model.cfg.max_tokens)
                cache[:n] = pool[req["slots"]]              # the transferred blocks
                tokens = model.decode(cache, n, req["first"], req["tokens"])
                back = await agent.connect(req["reply"])
                await agent.send_notif(back, json.dumps(
                    {"rid": req["rid"], "tokens": tokens, "worker": wid}).encode())

            async def take() -> None:
                async for peer, note in agent.notifications():
                    t = asyncio.ensure_future(serve(peer, note))
                    running.add(t)
                    t.add_done_callback(running.discard)
            taker = asyncio.ensure_future(take())
            await stop.wait()
            # leaving: out of the directory first (no new work), then finish
            await d.unpublish(agent.name)
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            taker.cancel()
            print(f"decode {wid}: left", flush=True)
    return 0


# --- prefill --------------------------------------------------------------------

class Worker:
    """A decode worker as prefill sees it: its agent, its pool's free slots
    (prefill is the pool's only writer; an answer frees a request's)."""

    def __init__(self, name: str, peer: meshwire.RemoteAgent, slots: int):
        self.name, self.peer = name, peer
        self.free = list(range(slots))
        self.pending: Dict[int, dict] = {}   # rid -> request, sent to it


class Prefill:
    def __init__(self, agent: meshwire.Agent, job: str, block: int):
        self.agent, self.job, self.block = agent, job, block
        self.model = Model(Config())
        self.workers: Dict[str, Worker] = {}
        self.rids = itertools.count(1)
        self.answers: Dict[int, asyncio.Future] = {}
        self.order = itertools.count()
        self.served = self.redispatched = 0

    async def follow_workers(self, d: meshwire.Directory) -> None:
        async for event, entry in d.watch(f"{self.job}/decode/"):
            if event == "joined" and entry.name not in self.workers:
                try:
                    peer = await self.agent.connect(entry.name)
                except OSError as e:
                    print(f"prefill: {entry.name}: {e}", flush=True)
                    continue
                slots = entry.regions.get("kv", 0) // (self.block * 4)
                self.workers[entry.name] = Worker(entry.name, peer, slots)
                print(f"prefill: worker {entry.name} joined ({slots} slots)", flush=True)
            elif event == "left" and entry.name in self.workers:
                w = self.workers.pop(entry.name)
                print(f"prefill: worker {entry.name} left, {len(w.pending)} pending", flush=True)
                self.agent.forget(entry.name)
                for req in w.pending.values():   # its answers may never come
                    self.redispatched += 1
                    asyncio.ensure_future(self.dispatch(req))

    async def answers_loop(self) -> None:
        async for peer, note in self.agent.notifications():
            ans = json.loads(note)
            for w in self.workers.values():
                req = w.pending.pop(ans["rid"], None)
                if req is not None:
                    w.free.extend(req["slots"])
            f = self.answers.get(ans["rid"])
            if f is not None and not f.done():   # a redispatched one's late twin: dropped
                f.set_result(ans)

    def pick(self, need: int) -> Optional[Worker]:
        live = [w for w in self.workers.values() if len(w.free) >= need]
        return live[next(self.order) % len(live)] if live else None

    async def dispatch(self, req: dict) -> None:
        while True:
            w = self.pick(req["len"])
            if w is None:
                await asyncio.sleep(0.05)       # no worker with room: wait for one
                continue
            slots = [w.free.pop() for _ in range(req["len"])]
            note = dict(req, slots=slots, reply=self.agent.name)
            note.pop("cache", None)
            w.pending[req["rid"]] = dict(req, slots=slots)
            blocks = list(req["cache"][:req["len"]])
            try:
                with self.agent.prepare(w.peer, blocks,
                                        [("kv", s * self.block * 4) for s in slots]) as x:
                    await self.agent.transfer(x, json.dumps(note).encode())
                return
            except OSError as e:                # it went away under us: another one
                w.pending.pop(req["rid"], None)
                print(f"prefill: {w.name}: {e}; sending request {req['rid']} elsewhere",
                      flush=True)
                self.redispatched += 1

    async def generate(self, prompt: List[int], tokens: int) -> dict:
        rid = next(self.rids)
        first, cache = self.model.prefill(prompt)
        self.answers[rid] = asyncio.get_running_loop().create_future()
        try:
            await self.dispatch({"rid": rid, "len": len(prompt), "first": first,
                                 "tokens": tokens, "cache": cache})
            ans = await self.answers[rid]
        finally:
            del self.answers[rid]
        self.served += 1
        return ans


async def prefill(url: str, job: str, http_port: int) -> int:
    from aiohttp import web
    import prometheus_client
    async with meshwire.Context() as ctx, await ctx.directory(url) as d:
        async with await d.agent(f"{job}/prefill/0").start() as agent:
            p = Prefill(agent, job, Config().block)
            tasks = [asyncio.ensure_future(p.follow_workers(d)),
                     asyncio.ensure_future(p.answers_loop())]
            registry = prometheus_client.CollectorRegistry()
            registry.register(meshwire.Collector(ctx))

            async def generate(request: web.Request) -> web.Response:
                body = await request.json()
                prompt = list(body["prompt"].encode())
                if not 0 < len(prompt) < Config().max_tokens - body["tokens"]:
                    return web.json_response({"error": "prompt too long"}, status=400)
                ans = await p.generate(prompt, body["tokens"])
                return web.json_response(ans)

            async def metrics(request: web.Request) -> web.Response:
                text = prometheus_client.generate_latest(registry).decode()
                text += ("# HELP disagg_requests_total Requests answered.\n"
                         "# TYPE disagg_requests_total counter\n"
                         f"disagg_requests_total {p.served}\n"
                         "# HELP disagg_redispatched_total Requests sent to a second worker.\n"
                         "# TYPE disagg_redispatched_total counter\n"
                         f"disagg_redispatched_total {p.redispatched}\n")
                return web.Response(text=text, content_type="text/plain")

            app = web.Application()
            app.router.add_post("/generate", generate)
            app.router.add_get("/metrics", metrics)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", http_port).start()
            print(f"prefill: http://127.0.0.1:{http_port}", flush=True)
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
                                  int(args[4]) if len(args) == 5 else SLOTS))
    if args[:1] == ["prefill"] and len(args) == 4:
        return asyncio.run(prefill(args[1], args[2], int(args[3])))
    if args[:1] == ["reference"] and len(args) == 3:
        print(json.dumps(Model(Config()).generate(list(args[1].encode()), int(args[2]))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
