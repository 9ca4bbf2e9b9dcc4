#!/usr/bin/python3
"""decode.py: the side of an inference server that needs a request's KV
pages before it can generate.  For each HTTP request GET /request/ID it
pulls that request's pages (scattered in prefill's pool) into free pages
of its own pool -- by RDMA reads, all in flight at once, or, as the
baseline, over HTTP from prefill -- checks every byte of every page, and
answers with a checksum.  Many requests run at once on one asyncio loop.

    decode.py --prefill-rdma HOST:PORT --prefill-http HOST:PORT --http HOST:PORT
              [--via rdma|http] [--pool-pages M] [--pages-per-request P]
"""
import argparse
import asyncio
import json
import zlib

import aiohttp
import numpy as np
from aiohttp import web

import meshwire
import kvpool


class Pool:
    """This process's KV pool: pages handed out to requests and back."""

    def __init__(self, ctx, pages, page_bytes):
        self.pages = np.frombuffer(ctx.alloc(pages * page_bytes), np.uint8).reshape(pages,
                                                                                  page_bytes)
        self.free = list(range(pages))
        self.cond = asyncio.Condition()

    async def take(self, n):
        async with self.cond:
            await self.cond.wait_for(lambda: len(self.free) >= n)
            got, self.free = self.free[:n], self.free[n:]
            return got

    async def give(self, slots):
        async with self.cond:
            self.free += slots
            self.cond.notify_all()


async def pull_rdma(app, ids, slots):
    conn, remote, page = app["conn"], app["remote"], app["page_bytes"]
    pool = app["pool"].pages
    await asyncio.gather(*(conn.read(pool[s], remote, i * page) for i, s in zip(ids, slots)))


async def pull_http(app, ids, slots):
    pool = app["pool"].pages
    url = f"{app['prefill_http']}/pages?ids={','.join(map(str, ids))}"
    async with app["http"].get(url) as resp:
        resp.raise_for_status()
        for s in slots:                             # as it streams in
            pool[s] = np.frombuffer(await resp.content.readexactly(pool.shape[1]), np.uint8)


async def handle(request):
    app = request.app
    rid = int(request.match_info["id"])
    ids = kvpool.pages_of(rid, app["prefill_pages"], app["per_request"])
    slots = await app["pool"].take(len(ids))
    try:
        await app["pull"](app, ids, slots)
        pool, base = app["pool"].pages, app["base"]
        bad = [i for i, s in zip(ids, slots) if not kvpool.page_ok(pool[s], i, base)]
        crc = 0
        for s in slots:
            crc = zlib.crc32(pool[s].data, crc)
    finally:
        await app["pool"].give(slots)
    return web.json_response({"id": rid, "pages": len(ids), "bad": bad, "crc": crc})


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill-rdma", required=True)
    ap.add_argument("--prefill-http", required=True)
    ap.add_argument("--http", required=True)
    ap.add_argument("--via", choices=("rdma", "http"), default="rdma")
    ap.add_argument("--pool-pages", type=int, default=2048)
    ap.add_argument("--pages-per-request", type=int, default=64)
    a = ap.parse_args()
    async with meshwire.Context() as ctx:
        conn = await ctx.connect(a.prefill_rdma)
        geo = json.loads(bytes(await conn.recv()))
        app = web.Application()
        app.update(conn=conn, remote=meshwire.Remote.from_bytes(bytes.fromhex(geo["remote"])),
                   page_bytes=geo["page_bytes"], prefill_pages=geo["pages"],
                   pool=Pool(ctx, a.pool_pages, geo["page_bytes"]),
                   base=kvpool.pattern(geo["page_bytes"]), per_request=a.pages_per_request,
                   pull=pull_rdma if a.via == "rdma" else pull_http,
                   prefill_http=f"http://{a.prefill_http}",
                   http=aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        app.router.add_get("/request/{id}", handle)
        await kvpool.serve_http(app, a.http)
        print(f"decode: pages via {a.via}; HTTP on {a.http}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await app["http"].close()


if __name__ == "__main__":
    asyncio.run(main())
