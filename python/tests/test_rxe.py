"""The binding over RDMA (the rxe suite): every call, cancels that lose
nothing, idle connections that cost nothing, and every collective for
every type on a 3-rank communicator -- three contexts, one asyncio loop."""
import asyncio
import gc
import os
import random
import time

import numpy as np
import pytest

import meshwire

ADDRS = [a for a in os.environ.get("MW_ADDRS", "").split(",") if a]
pytestmark = pytest.mark.skipif(len(ADDRS) < 2, reason="needs RDMA addresses (MW_ADDRS)")
HOST = ADDRS[-1] if ADDRS else ""


async def pair(ctx, **opts):
    """A listener and a connection to it, both ends in @ctx."""
    listener = ctx.listen(f"{HOST}:0", **opts)
    client, server = await asyncio.gather(ctx.connect(f"{HOST}:{listener.port}", **opts),
                                          listener.accept())
    return listener, client, server


async def test_every_call_on_a_connection():
    async with meshwire.Context() as ctx:
        listener, c, s = await pair(ctx)
        async with listener, c, s:
            # messages: bytes, bytearray, numpy, several fragments, empty
            big = np.random.default_rng(1).integers(0, 255, 3 << 20, dtype=np.uint8)
            for payload in (b"hello", bytearray(b"x" * 1000), big, b""):
                await c.send(payload)
                got = await s.recv()
                assert bytes(got) == bytes(memoryview(payload))
                got.release()
            # one-sided, into memory from alloc() and into a numpy array
            pool = ctx.alloc(1 << 20)
            user = np.zeros(1 << 18, dtype=np.float32)
            for target in (pool, user):
                remote = s.export(target)
                await s.send(bytes(remote))
                r = meshwire.Remote.from_bytes(await c.recv())
                src = np.arange(1024, dtype=np.float32)
                await c.write(src, r, 4096)
                assert np.array_equal(np.frombuffer(target, np.float32)[1024:2048], src)
                back = np.empty(1024, dtype=np.float32)
                await c.read(back, r, 4096)
                assert np.array_equal(back, src)
                with pytest.raises(OSError) as ei:
                    await c.write(src, r, r.len - 100)     # past the export
                assert ei.value.errno == 34                # ERANGE
                s.unexport(remote)
            # immediates, in order, after their data
            remote = s.export(pool)
            r = remote
            imms = s.immediates()
            for i in range(5):
                await c.write_imm(np.full(16, i, np.uint8), r, 64 * i, 100 + i)
                assert await imms.__anext__() == 100 + i
                assert bytes(pool[64 * i:64 * i + 16]) == bytes([i]) * 16
            st = c.stats()
            assert st["writes"] >= 5 and st["device"] and st["remote"].endswith(str(listener.port))
            assert listener.stats()["accepted"] == 1


async def test_cancelled_receives_lose_no_message():
    async with meshwire.Context() as ctx:
        listener, c, s = await pair(ctx)
        n, got = 300, []

        async def sender():
            for i in range(n):
                await c.send(i.to_bytes(4, "little"))
                if i % 7 == 0:
                    await asyncio.sleep(random.random() / 1000)

        task = asyncio.create_task(sender())
        cancelled = 0
        while len(got) < n:
            try:                          # give up at random moments
                m = await asyncio.wait_for(s.recv(), random.random() / 2000)
                got.append(int.from_bytes(m, "little"))
            except asyncio.TimeoutError:
                cancelled += 1
        await task
        assert got == list(range(n)), "a message was lost, doubled or reordered"
        assert cancelled > 0
        for conn in (c, s):
            await conn.close()
        listener.close()


async def test_sixty_four_idle_connections_cost_no_cpu():
    async with meshwire.Context() as ctx:
        listener = ctx.listen(f"{HOST}:0")
        conns = await asyncio.gather(*(ctx.connect(f"{HOST}:{listener.port}") for _ in range(64)))
        accepted = [await listener.accept() for _ in range(64)]
        waiting = [asyncio.create_task(a.recv()) for a in accepted]   # all waiting
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(2)
        idle = (time.process_time() - cpu0) / (time.monotonic() - t0)
        print(f"64 connections, a receive waiting on each: {idle:.2%} of a core")
        assert idle < 0.02
        for w in waiting:
            w.cancel()
        for conn in conns + accepted:
            conn.abort()
        listener.close()


def values(name, n, rank):
    """Small integers, exact in every type: rank r holds r+1, r+2, ..."""
    v = (np.arange(n) % 13 + rank + 1).astype(np.float32)
    if name == "bf16":
        return (v.view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(name)


def as_float(name, a):
    if name == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float64)


async def test_every_collective_for_every_type_on_three_ranks():
    nranks, n = 3, 1000
    base = random.randint(20000, 40000)
    peers = [f"{HOST}:{base + r}" for r in range(nranks)]
    ctxs = [meshwire.Context() for _ in range(nranks)]
    comms = await asyncio.gather(*(ctx.communicator(r, peers, timeout_ms=20000)
                                   for r, ctx in enumerate(ctxs)))

    async def each(fn):
        return await asyncio.gather(*(fn(r, comm) for r, comm in enumerate(comms)))

    for name in meshwire.DTYPES:
        dt = "bf16" if name == "bf16" else None
        want_sum = sum(as_float(name, values(name, n, r)) for r in range(nranks))
        out = await each(lambda r, c: c.allreduce(values(name, n, r), dtype=dt))
        for o in out:
            assert np.array_equal(as_float(name, o), want_sum), name
        out = await each(lambda r, c: c.reduce(values(name, n, r), root=1, dtype=dt))
        assert np.array_equal(as_float(name, out[1]), want_sum), name
        out = await each(lambda r, c: c.broadcast(values(name, n, r), root=2, dtype=dt))
        for o in out:
            assert np.array_equal(o, values(name, n, 2)), name
        full = [values(name, n, r) for r in range(nranks)]
        out = await each(lambda r, c: c.allgather(full[r], np.empty(n * nranks, full[r].dtype),
                                                  dtype=dt))
        for o in out:
            assert np.array_equal(o, np.concatenate(full)), name
        out = await each(lambda r, c: c.gather(full[r], np.empty(n * nranks, full[r].dtype)
                                               if r == 0 else None, root=0, dtype=dt))
        assert np.array_equal(out[0], np.concatenate(full)), name
        out = await each(lambda r, c: c.scatter(np.concatenate(full) if r == 1 else None,
                                                np.empty(n, full[r].dtype), root=1, dtype=dt))
        for r, o in enumerate(out):
            assert np.array_equal(o, full[r]), name
        out = await each(lambda r, c: c.alltoall(np.concatenate(full),
                                                 np.empty(n * nranks, full[r].dtype), dtype=dt))
        for r, o in enumerate(out):               # block r of everyone's: full[r], n times
            assert np.array_equal(o, np.concatenate([full[r]] * nranks)), name
        blocks = [comms[0].block_of(n, r) for r in range(nranks)]
        out = await each(lambda r, c: c.reduce_scatter(values(name, n, r),
                                                       np.empty(blocks[r][1], full[r].dtype),
                                                       dtype=dt))
        for r, o in enumerate(out):
            off, ln = blocks[r]
            assert np.array_equal(as_float(name, o), want_sum[off:off + ln]), name
        await each(lambda r, c: c.barrier())
    for op, fn in (("max", np.maximum), ("min", np.minimum), ("prod", np.multiply)):
        a = [values("float64", 16, r) for r in range(nranks)]
        out = await each(lambda r, c: c.allreduce(a[r].copy(), op=op))
        want = fn(fn(a[0], a[1]), a[2])
        assert np.array_equal(out[0], want), op
    await each(lambda r, c: c.barrier())
    for comm in comms:
        comm.free()
    for ctx in ctxs:
        ctx.close()
    gc.collect()
