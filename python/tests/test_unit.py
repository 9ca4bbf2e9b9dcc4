"""The binding without RDMA: the loop plumbing, futures and cancels,
registered memory, errors, option and type checks."""
import asyncio
import gc
import random
import time

import numpy as np
import pytest

import meshwire
from meshwire import _comm, _lib




async def test_the_descriptor_wakes_the_loop_and_idle_costs_nothing():
    async with meshwire.Context() as ctx:
        t0 = time.monotonic()
        await ctx.sleep(50)
        assert time.monotonic() - t0 >= 0.045
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(0.5)          # the context open, nothing to do
        idle = (time.process_time() - cpu0) / (time.monotonic() - t0)
        assert idle < 0.02, f"idle context costs {idle:.1%} of a core"


async def test_a_thousand_concurrent_awaits():
    async with meshwire.Context() as ctx:
        live0 = ctx.stats()["futures_live"]
        ms = [random.randint(1, 200) for _ in range(1000)]
        t0 = time.monotonic()
        await asyncio.gather(*(ctx.sleep(m) for m in ms))
        assert time.monotonic() - t0 < 5
        assert not ctx._ops
        assert ctx.stats()["futures_live"] == live0


async def test_cancelling_the_task_cancels_the_operation():
    async with meshwire.Context() as ctx:
        live0 = ctx.stats()["futures_live"]
        tasks = [asyncio.create_task(ctx.sleep(60000)) for _ in range(100)]
        await asyncio.sleep(0.01)
        assert ctx.stats()["futures_live"] == live0 + 100
        for t in random.sample(tasks, len(tasks)):
            t.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(d, asyncio.CancelledError) for d in done)
        for _ in range(100):              # meshwire lets go from its loop
            if not ctx._ops:
                break
            await asyncio.sleep(0.01)
        assert not ctx._ops
        assert ctx.stats()["futures_live"] == live0


async def test_allocated_memory_is_a_buffer_and_goes_with_its_last_view():
    async with meshwire.Context() as ctx:
        buf = ctx.alloc(1 << 20)
        a = np.frombuffer(buf, dtype=np.float32)
        a[:] = np.arange(a.size, dtype=np.float32)
        assert buf.nbytes == 1 << 20 and not buf.readonly
        assert np.frombuffer(buf, dtype=np.float32)[12345] == 12345
        assert len(ctx._starts) == 1
        del buf
        gc.collect()
        assert len(ctx._starts) == 1      # the array still views it
        del a
        gc.collect()
        assert not ctx._starts
        with pytest.raises(ValueError):
            ctx.alloc(0)


async def test_closing_with_memory_alive_keeps_it_valid_until_released():
    ctx = meshwire.Context()
    buf = ctx.alloc(4096)
    ctx.close()
    assert ctx._ctx is not None           # freed with its last block
    buf[:5] = b"still"
    with pytest.raises(OSError):
        ctx.alloc(10)                     # refused: closing
    del buf
    gc.collect()
    assert ctx._ctx is None
    ctx.close()                           # again: nothing


async def test_errors_are_oserrors_with_the_errno_and_meshwires_message():
    assert isinstance(_lib.error(-111, "x"), ConnectionRefusedError)
    assert isinstance(_lib.error(-110, "x"), TimeoutError)
    assert isinstance(_lib.error(-104, "x"), ConnectionResetError)
    assert isinstance(_lib.error(-103, "x"), ConnectionAbortedError)
    e = _lib.error(-13, "the device said no")
    assert isinstance(e, PermissionError) and e.errno == 13 and e.strerror == "the device said no"
    async with meshwire.Context() as ctx:
        with pytest.raises(OSError) as ei:   # no RDMA here: refused with a reason
            await ctx.connect("192.0.2.1:7470", timeout_ms=300)
        assert ei.value.errno and "192.0.2.1" in str(ei.value)


async def test_options_are_checked_by_name():
    async with meshwire.Context() as ctx:
        with pytest.raises(TypeError, match="unknown connection option 'credit'"):
            await ctx.connect("192.0.2.1", credit=4)
        with pytest.raises(TypeError, match="unknown communicator option"):
            await ctx.communicator(0, ["a:1", "b:2"], slotz=4)
        with pytest.raises(TypeError, match="rank and peers"):
            await ctx.communicator(0)


async def test_types_and_ops_of_the_collectives():
    for name in meshwire.DTYPES:
        a = np.zeros(4, dtype=np.uint16 if name == "bf16" else name)
        assert _comm._dtype(a, "bf16" if name == "bf16" else None) == _comm._DTYPES[name]
    with pytest.raises(TypeError, match="no type 'complex64'"):
        _comm._dtype(np.zeros(2, np.complex64), None)
    with pytest.raises(TypeError, match="cannot hold bf16"):
        _comm._dtype(np.zeros(2, np.float32), "bf16")
    with pytest.raises(ValueError, match="unknown op"):
        _comm._op("avg")
    with pytest.raises(ValueError, match="not contiguous"):
        _comm._array(np.zeros((4, 4))[:, 1], "x", False)


async def test_a_remote_travels_as_bytes():
    r = meshwire.Remote(0x7f0012345000, 65536, 0x1234)
    b = bytes(r)
    assert len(b) == 24                   # the C struct, as hello.c sends it
    r2 = meshwire.Remote.from_bytes(b)
    assert (r2.addr, r2.len, r2.rkey) == (r.addr, r.len, r.rkey)
    with pytest.raises(ValueError):
        meshwire.Remote.from_bytes(b[:20])
