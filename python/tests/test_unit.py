"""The binding without RDMA: the loop plumbing, futures and cancels,
registered memory, errors, option and type checks, and the hostile or
careless user: memory let go of on another thread, or inside meshwire's
callbacks, a context closed under a cancelled operation, the garbage
collector running finalizers while cffi's lock is held."""
import asyncio
import errno
import gc
import os
import random
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import meshwire
from meshwire import _comm, _context, _future, _lib
from meshwire._lib import ffi, lib


async def test_the_descriptor_wakes_the_loop_and_idle_costs_nothing():
    async with meshwire.Context() as ctx:
        t0 = time.monotonic()
        await ctx.sleep(50)
        assert time.monotonic() - t0 >= 0.045
        woken, cpu0, t0 = ctx.stats()["loop_wakeups"], time.process_time(), time.monotonic()
        await asyncio.sleep(0.5)          # the context open, nothing to do
        woken = ctx.stats()["loop_wakeups"] - woken
        idle = (time.process_time() - cpu0) / (time.monotonic() - t0)
        print(f"idle context: {woken} wake-ups in 0.5 s, {idle:.2%} of a core")
        assert woken <= 1                 # at most the timer's passed deadline: no polling


async def test_a_thousand_concurrent_awaits():
    async with meshwire.Context() as ctx:
        live0 = ctx.stats()["futures_live"]
        ms = [random.randint(1, 200) for _ in range(1000)]
        t0 = time.monotonic()
        await asyncio.gather(*(ctx.sleep(m) for m in ms))
        # concurrent: one after another they would take 100 s (a bound far
        # from the 0.2 s they take, so that a loaded machine cannot fail it)
        assert time.monotonic() - t0 < 30
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
        await asyncio.sleep(0)
        assert len(ctx._starts) == 1      # the array still views it
        del a
        assert len(ctx._starts) == 1      # handed to the loop...
        await asyncio.sleep(0)
        assert not ctx._starts            # ...which freed it at its next turn
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
    await asyncio.sleep(0)                # the loop frees the block, then the context
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


async def test_a_rail_group_without_rails_refuses_and_closes():
    """No RDMA here: a group with no rail says so for each call, names
    its bad arguments, and a closed one refuses with ESHUTDOWN."""
    async with meshwire.Context() as ctx:
        with pytest.raises(ValueError, match="slice_bytes"):
            ctx.rails(-1)
        g = ctx.rails()
        assert len(g) == 0 and g.stats() == []
        buf = ctx.alloc(4096)
        with pytest.raises(OSError):                  # no rail to carry it
            await g.write(buf, 0)
        with pytest.raises(OSError):
            g.stats(0)
        with pytest.raises(TypeError, match="entry 0"):
            await g.post([buf])
        with pytest.raises(ValueError, match="at least one"):
            await g.post([])
        g.set_stall(250)
        with pytest.raises(ValueError, match="milliseconds"):
            g.set_stall(-1)
        g.close()
        assert "closed" in repr(g)
        with pytest.raises(OSError) as e:
            await g.read(buf, 0)
        assert e.value.errno == 108
        with pytest.raises(OSError):
            g.set_stall(250)
        dropped = ctx.rails()                         # collected: freed from the loop
        del dropped


async def test_memory_let_go_of_inside_a_callback_with_the_context_closing(capfd):
    """A cancelled operation that was lent memory from alloc(), then close():
    the memory is the last thing the context waits for, and the operation
    lets go of it in its callback, inside mw_ctx_progress.  The context is
    freed after, from the loop (freeing it there crashed the process)."""
    ctx = meshwire.Context()
    buf = ctx.alloc(1 << 16)
    lent = lib.mw_future_new(ctx._ctx)    # stands for a write from buf, say
    task = asyncio.create_task(ctx._await(lent, "write", keep=(buf,)))
    await asyncio.sleep(0)
    task.cancel()                         # meshwire fails it; its callback runs in progress
    del buf
    ctx.close()
    assert ctx._ctx is not None           # the operation still holds the block
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if ctx._ctx is None:
            break
        await asyncio.sleep(0.005)
    assert ctx._ctx is None and not ctx._starts and not ctx._ops
    assert "refused" not in capfd.readouterr().err   # never mw_ctx_free inside progress


async def test_memory_let_go_of_on_another_thread_is_freed_by_the_loop():
    """The last view of a block dies on another thread (its garbage
    collection, say): mw_free runs on the loop's thread, not there."""
    async with meshwire.Context() as ctx:
        box = [ctx.alloc(1 << 20)]
        np.frombuffer(box[0], np.uint8)[:] = 7

        def drop():
            box.clear()
            gc.collect()

        t = threading.Thread(target=drop)
        t.start()
        t.join()                          # this thread, the loop's, waited meanwhile
        assert len(ctx._starts) == 1, "freed off the loop thread"
        await asyncio.sleep(0)            # the loop's turn: woken, it frees the block
        assert not ctx._starts


async def test_views_go_by_reference_count_not_the_cycle_collector():
    """With the cycle collector off, completed operations leave nothing
    behind: an operation's result (a received message's view, say) goes
    when its last reference does."""
    async with meshwire.Context() as ctx:
        gc.collect()
        gc.disable()
        try:
            await asyncio.gather(*(ctx.sleep(1) for _ in range(50)))
            left = sum(isinstance(o, _future.Op) for o in gc.get_objects())
        finally:
            gc.enable()
        assert left == 0, f"{left} completed operations wait for the cycle collector"


def run_fresh(code: str, *args: str, timeout: float = 60) -> str:
    """Run @code in a new interpreter (nothing of meshwire looked up yet)
    with @args; its output, or fail naming a hang."""
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout} s (a finalizer waiting for a lock?)")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


FRESH_PRELUDE = """
    import asyncio, gc, sys, uvloop
    import meshwire
    from meshwire._lib import ffi
    new_loop = uvloop.new_event_loop if sys.argv[1] == "uvloop" else asyncio.new_event_loop
"""


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_no_parser_and_no_parser_lock_at_run_time(loop_kind):
    """The freeze as it happened: cffi's Python parser held its
    (non-reentrant) lock while parsing a type, the garbage collector ran a
    finalizer meanwhile, and the finalizer used cffi for the first time.
    Now the declarations are parsed at build time (cffi's out-of-line ABI
    module): in a fresh interpreter, the calls a program makes -- memory,
    timers, errors, options, stats, views dropped in a collection that
    itself names new types -- never load that parser (pycparser), so there
    is no such lock to wait for."""
    out = run_fresh(FRESH_PRELUDE + """
    import numpy as np
    from meshwire import _comm
    gc.callbacks.append(lambda *a: ffi.typeof("mw_conn_stats_t *"))   # a new name, mid-collection
    async def main():
        async with meshwire.Context(log_level="error") as ctx:
            buf = ctx.alloc(8192)
            np.frombuffer(buf, np.uint8)[:] = 1
            other = bytearray(4096)
            ctx._unreg(ctx._local(other, True)[2])
            await ctx.sleep(1)
            ctx.stats()
            for call in (lambda: ctx.connect("192.0.2.1:7470", timeout_ms=200),
                         lambda: ctx.connect("192.0.2.1", credits=1),
                         lambda: ctx.communicator(0, ["a:1", "b:2"], slotz=4)):
                try:
                    await call()
                except (OSError, ValueError, TypeError):
                    pass
            bytes(meshwire.Remote.from_bytes(bytes(24)))
            _comm._dtype(np.zeros(2, np.float32), None)
            del buf
            gc.collect()
            await asyncio.sleep(0)
            assert not ctx._starts
        print("released;", "parser loaded" if "pycparser" in sys.modules else "no parser",
              type(ffi).__module__)
    new_loop().run_until_complete(main())
    """, loop_kind)
    assert "released; no parser _cffi_backend" in out, out


async def test_options_by_name_naming_the_field():
    async with meshwire.Context(log_level="warn", cq_depth=256, max_wc_per_turn=64) as ctx:
        for bad, err, what in (
                (dict(transport="nic"), ValueError, r"transport='nic': expected one of 'auto', 'rdma'"),
                (dict(transport="local"), ValueError, "transport='local'"),
                (dict(timeout_ms="5s"), TypeError, r"timeout_ms='5s': expected an integer"),
                (dict(credits=1), ValueError, r"credits=1: expected 2\.\.4096"),
                (dict(timeout_ms=-1), ValueError, "timeout_ms=-1"),
                (dict(timeout_ms=1 << 40), ValueError, "timeout_ms=1099511627776: too large"),
                (dict(max_msg_size=(1 << 40) + 1), ValueError, "max_msg_size"),
                (dict(credit=4), TypeError, "unknown connection option 'credit'")):
            with pytest.raises(err, match="connection option " + what if "unknown" not in what
                               else what):
                await ctx.connect("192.0.2.1", **bad)
            with pytest.raises(err):
                ctx.listen("127.0.0.1:0", **bad)
        for good in ("auto", "rdma", lib.MW_TRANSPORT_RDMA):
            with pytest.raises(OSError):  # past the options: no RDMA here
                await ctx.connect("192.0.2.1:7470", transport=good, timeout_ms=200)
    with pytest.raises(ValueError, match="context option log_level='loud'"):
        meshwire.Context(log_level="loud")
    with pytest.raises(TypeError, match="unknown context option 'loglevel'.*log_level"):
        meshwire.Context(loglevel=1)
    with pytest.raises(TypeError, match="context option 'log_fn' cannot be set from Python"):
        meshwire.Context(log_fn=0)


@ffi.callback("void(mw_listener_t *, mw_conn_t *, void *)")
def accept_nothing(l, c, arg):
    lib.mw_conn_abort(c)


def test_the_binding_checks_the_ranges_meshwire_checks():
    """The ranges the binding refuses by name are the C library's: at each
    edge, in and out, mw_listen agrees (-EINVAL only out of range)."""
    pp = ffi.new("mw_ctx_t **")
    assert lib.mw_ctx_new(pp, ffi.NULL, ffi.NULL) == 0
    ctx = pp[0]
    try:
        for name, (lo, hi) in _context._RANGES["connection"].items():
            edges = [(lo, True)] + ([(lo - 1, False)] if lo > 0 else [])
            edges += [(hi, True), (hi + 1, False)] if hi is not None else []
            for value, ok in edges:
                o = ffi.new("mw_conn_opts_t *")
                lib.mw_conn_opts_init(o)
                setattr(o, name, value)
                lp = ffi.new("mw_listener_t **")
                rc = lib.mw_listen(ctx, b"*:0", o, accept_nothing, ffi.NULL, lp)
                if rc == 0:
                    lib.mw_listener_free(lp[0])
                assert (rc != -22) == ok, f"{name}={value}: C says {rc}, the binding {ok}"
                py = ffi.new("mw_conn_opts_t *")
                lib.mw_conn_opts_init(py)
                if ok:
                    _context.set_options(py, "connection", {name: value})
                else:
                    with pytest.raises(ValueError, match=f"connection option {name}={value}"):
                        _context.set_options(py, "connection", {name: value})
    finally:
        lib.mw_ctx_free(ctx)


async def test_the_directory_publishes_finds_lists_and_watches(store_url):
    """Without RDMA, on Redis and on etcd: entries published by addresses,
    looked up, listed by role and watched as they come and go, by two
    directories on one store; bad input refused by name; a closed directory
    refuses."""
    redis_url = store_url
    async with meshwire.Context() as ctx:
        job = f"unit{os.getpid()}x{id(ctx) % 1000}"
        async with await ctx.directory(redis_url, lease_ms=2000) as a, \
                await ctx.directory(redis_url) as b:
            w = b.watch(f"{job}/")
            assert await w.__anext__() == ("synced", None)      # nothing yet
            await a.publish(f"{job}/prefill/0", addrs="192.0.2.7:7470", tag="gpu0")
            event, e = await w.__anext__()
            assert event == "joined" and e.name == f"{job}/prefill/0"
            got = await b.lookup(f"{job}/prefill/0")
            assert (got.addrs, got.tag, got.serves, got.regions) == \
                ("192.0.2.7:7470", "gpu0", False, {})
            assert got.instance == e.instance
            await a.publish(f"{job}/decode/0", addrs="192.0.2.8:7470")
            await a.publish(f"{job}/decode/1", addrs="192.0.2.9:7470")
            assert [x.name for x in await b.list(f"{job}/decode/")] == \
                [f"{job}/decode/0", f"{job}/decode/1"]
            assert len(await b.list(f"{job}/")) == 3
            await a.unpublish(f"{job}/decode/0")
            seen = []
            async for event, e in w:
                seen.append((event, e.name))
                if event == "left":
                    break
            assert seen == [("joined", f"{job}/decode/0"), ("joined", f"{job}/decode/1"),
                            ("left", f"{job}/decode/0")]
            with pytest.raises(FileNotFoundError):
                await b.lookup(f"{job}/decode/0")
            with pytest.raises(OSError) as ei:
                await a.publish("bad//name", addrs="192.0.2.7:1")
            assert ei.value.errno == 22
            with pytest.raises(TypeError, match="listen .* or addrs"):
                await a.publish(f"{job}/x")
            with pytest.raises(TypeError, match="shares"):
                await a.publish(f"{job}/x", addrs="192.0.2.7:1", shares={"kv": ctx.alloc(64)})
            with pytest.raises(ValueError, match="lease_ms"):
                await ctx.directory(redis_url, lease_ms=10)
            w.close()
            assert [x async for x in w] == []
        with pytest.raises(OSError) as ei:                      # closed with the block
            await a.lookup(f"{job}/prefill/0")
        assert ei.value.errno == 108
        async with await ctx.directory(redis_url) as c:         # a's entries went with it
            # (on etcd its revokes are still going out as c's list comes, on
            # another connection: within a few ms)
            for _ in range(200):
                if not await c.list(f"{job}/"):
                    break
                await asyncio.sleep(0.01)
            assert await c.list(f"{job}/") == []
        with pytest.raises(OSError):
            await ctx.directory("redis://", timeout_ms=100)
        dropped = await ctx.directory(redis_url)                # never closed
        await dropped.publish(f"{job}/dropped", addrs="192.0.2.7:1")
        async with await ctx.directory(redis_url) as c:
            assert len(await c.list(f"{job}/")) == 1
            del dropped
            gc.collect()                                        # freed from the loop:
            for _ in range(200):                                # its entry goes too
                if not await c.list(f"{job}/"):
                    break
                await asyncio.sleep(0.01)
            assert await c.list(f"{job}/") == []


async def test_the_directory_leaves_the_store_configuration_to_its_owner(stock_redis_url):
    """Watches need keyspace notifications: on a store without them a
    watch is refused (ENOTSUP) and the store left as it is, unless the
    directory is opened with configure_store=1."""
    async with meshwire.Context() as ctx:
        async with await ctx.directory(stock_redis_url) as d:
            with pytest.raises(OSError) as ei:
                d.watch("job/")
            assert ei.value.errno == errno.ENOTSUP
            await d.publish("job/a", addrs="192.0.2.7:7470")     # the rest works
            assert (await d.lookup("job/a")).addrs == "192.0.2.7:7470"
        with pytest.raises(ValueError, match="configure_store"):
            await ctx.directory(stock_redis_url, configure_store=2)
        async with await ctx.directory(stock_redis_url, configure_store=1) as d:
            w = d.watch("job/")
            assert await w.__anext__() == ("synced", None)
            await d.publish("job/b", addrs="192.0.2.8:7470")
            event, e = await w.__anext__()
            assert (event, e.name) == ("joined", "job/b")
            w.close()


async def test_torch_tensors_are_used_where_they_lie():
    """CPU tensors go where buffers go, by their data pointer (no copy):
    one over registered memory (Context.tensor) needs no registration,
    any other is registered; their dtype names the collectives' type,
    bf16 and f16 included; a non-contiguous one is refused."""
    torch = pytest.importorskip("torch")
    async with meshwire.Context() as ctx:
        kv = ctx.tensor((4, 16, 8), torch.bfloat16)
        assert kv.shape == (4, 16, 8) and kv.dtype == torch.bfloat16
        kv.fill_(1.5)
        p, n, mr = ctx._local(kv, True)
        assert int(ffi.cast("uintptr_t", p)) == kv.data_ptr() and n == 4 * 16 * 8 * 2
        assert mr is None                                  # alloc()'s memory
        plain = torch.arange(100, dtype=torch.float16)
        p, n, mr = ctx._local(plain, False)
        assert int(ffi.cast("uintptr_t", p)) == plain.data_ptr() and n == 200
        assert mr is not None                              # registered for the call
        ctx._unreg(mr)
        with pytest.raises(ValueError, match="not contiguous"):
            ctx._local(torch.zeros(8, 8)[:, 1], False)
        a = _comm._array(kv, "x", True)
        assert _comm._dtype(a, None) == lib.MW_BF16 and a.ctypes.data == kv.data_ptr()
        with pytest.raises(TypeError, match="bf16 tensor is not float16"):
            _comm._dtype(a, "float16")
        assert _comm._dtype(_comm._array(plain, "x", True), None) == lib.MW_F16
        assert _comm._dtype(_comm._array(torch.zeros(3, dtype=torch.int64), "x", True),
                            None) == lib.MW_INT64
        with pytest.raises(TypeError, match="no type 'complex64'"):
            _comm._dtype(_comm._array(torch.zeros(3, dtype=torch.complex64), "x", True), None)
        del kv, a                                          # the pool goes with its tensor
        for _ in range(100):
            gc.collect()
            if not ctx._starts:
                break
            await asyncio.sleep(0.01)
        assert not ctx._starts


def test_an_agents_notes_wait_for_their_data():
    """The rule of a write transfer's note (Agent.transfer): shown once the
    immediate on its last entry came, whichever arrives first; dropped
    when a later transfer's immediate comes first (its own failed); k
    wraps at 2**32."""
    from meshwire._agent import _Inbox
    shown = []
    box = _Inbox(shown.append)
    box.note(0, b"a")
    assert shown == []                    # its data is not in place yet
    box.immediate(0)
    assert shown == [b"a"]
    box.immediate(1)                      # the immediate before its note
    box.note(1, b"b")
    assert shown == [b"a", b"b"]
    box.note(2, b"failed")                # transfer 2 failed: no immediate 2
    box.note(3, b"c")
    box.immediate(3)
    assert shown == [b"a", b"b", b"c"]
    box.note(2, b"late")                  # a note older than what completed
    assert shown == [b"a", b"b", b"c"] and not box._held
    box = _Inbox(shown.append)
    box.note((1 << 32) - 1, b"x")
    box.note(0, b"y")
    box.immediate(0)                      # 0 follows 2**32 - 1: x failed
    assert shown[-1] == b"y" and not box._held


async def test_metrics_for_prometheus_from_the_loop_and_from_its_thread(promtool):
    """Context.metrics() is the text format; meshwire.Collector serves it
    to prometheus_client on the loop's thread and from the client's own
    HTTP thread (asking the loop); off the loop, metrics() refuses; a
    closed context's collector yields nothing."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    async with meshwire.Context() as ctx:
        f = lib.mw_future_new(ctx._ctx)
        text = ctx.metrics()
        assert promtool(text) == (0, ""), "promtool check metrics"
        families = {fam.name: fam for fam in text_string_to_metric_families(text)}
        assert families["meshwire_futures_live"].type == "gauge"
        assert families["meshwire_futures_created"].type == "counter"
        assert families["meshwire_futures_live"].samples[0].value >= 1
        registry = prometheus_client.CollectorRegistry()
        registry.register(meshwire.Collector(ctx))
        on_loop = prometheus_client.generate_latest(registry).decode()
        off_loop = await asyncio.get_running_loop().run_in_executor(
            None, lambda: prometheus_client.generate_latest(registry).decode())
        for scraped in (on_loop, off_loop):
            assert "meshwire_futures_created_total" in scraped
        with pytest.raises(RuntimeError, match="loop thread"):
            await asyncio.get_running_loop().run_in_executor(None, ctx.metrics)
        lib.mw_future_unref(f)
    assert prometheus_client.generate_latest(registry).decode() == ""
