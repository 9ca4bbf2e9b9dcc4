#!/usr/bin/python3
"""prefill.py: the side of an inference server that holds a KV cache, as a
pool of pages in registered memory.  Every decode process that connects
over RDMA gets the pool exported to it (one descriptor) and pulls pages by
one-sided reads: no CPU here is involved in moving them.  The same pages
are served over HTTP (aiohttp, streamed) for the baseline a server has
without RDMA.

    prefill.py --rdma HOST:PORT --http HOST:PORT [--pages N] [--page-kib K]
"""
import argparse
import asyncio
import json

import numpy as np
from aiohttp import web

import meshwire
import kvpool


async def hold(conn):
    """Keep @conn (a Connection collected is aborted) until its decode
    process goes: that one sends nothing, so the receive ends when it does."""
    try:
        await conn.recv()
    except OSError:
        pass
    conn.abort()


async def serve_rdma(ctx, pool, addr, geometry):
    held = set()                                   # the tasks holding connections
    async with ctx.listen(addr) as listener:
        print(f"prefill: RDMA on port {listener.port}", flush=True)
        async for conn in listener:
            remote = conn.export(pool)             # only this connection's key
            await conn.send(json.dumps({**geometry, "remote": bytes(remote).hex()}).encode())
            # nothing more to do: the decode side reads on its own
            task = asyncio.create_task(hold(conn))
            held.add(task)
            task.add_done_callback(held.discard)


async def pages_http(request):
    pool = request.app["pool"]
    ids = [int(x) for x in request.query["ids"].split(",")]
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.content_length = len(ids) * pool.shape[1]
    await resp.prepare(request)
    for i in ids:
        await resp.write(pool[i].data)             # page by page, as it streams
    await resp.write_eof()
    return resp


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rdma", required=True)
    ap.add_argument("--http", required=True)
    ap.add_argument("--pages", type=int, default=1024)
    ap.add_argument("--page-kib", type=int, default=64)
    a = ap.parse_args()
    async with meshwire.Context() as ctx:
        page = a.page_kib << 10
        pool = np.frombuffer(ctx.alloc(a.pages * page), np.uint8).reshape(a.pages, page)
        kvpool.fill(pool)
        app = web.Application()
        app["pool"] = pool
        app.router.add_get("/pages", pages_http)
        await kvpool.serve_http(app, a.http)
        print(f"prefill: {a.pages} pages of {a.page_kib} KiB; HTTP on {a.http}", flush=True)
        await serve_rdma(ctx, pool, a.rdma, {"pages": a.pages, "page_bytes": page})


if __name__ == "__main__":
    asyncio.run(main())
