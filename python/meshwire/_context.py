"""The context: meshwire's one descriptor joined to the running asyncio
loop (add_reader calling mw_ctx_progress: no thread, no polling; idle, the
loop sleeps), registered memory, and the entry points that make
connections, listeners and communicators."""
from __future__ import annotations

import asyncio
import bisect
import threading
import weakref
from typing import TYPE_CHECKING, Any, Optional, Sequence

from . import _future
from ._lib import T, check, error, ffi, fields, lib
from ._release import Reaper
from ._tensor import is_tensor, span

if TYPE_CHECKING:
    from ._comm import Communicator
    from ._conn import Connection, Listener
    from ._dir import Directory
    from ._rails import Rails

Bufferable = Any   # anything with the buffer protocol: bytes, bytearray, numpy arrays, mmap...


# Options whose values have names: given as the name (or the C constant).
_NAMED = {
    "transport": {"auto": lib.MW_TRANSPORT_AUTO, "rdma": lib.MW_TRANSPORT_RDMA,
                  "tcp": lib.MW_TRANSPORT_TCP},
    "log_level": {"error": lib.MW_LOG_ERROR, "warn": lib.MW_LOG_WARN,
                  "info": lib.MW_LOG_INFO, "debug": lib.MW_LOG_DEBUG},
}

# The ranges meshwire.h documents for mw_conn_opts_t, checked here so that a
# bad value is refused naming its field (the C library says "bad options";
# unit/test_unit checks these edges against it).
_RANGES = {
    "connection": {
        "credits": (2, 4096), "slot_size": (256, 16 << 20), "max_rdma_inflight": (1, None),
        "chunk_size": (4096, None), "timeout_ms": (1, None), "default_port": (0, 65535),
        "send_timeout_ms": (1, None), "max_msg_size": (1, 1 << 40),
        "max_inbox_bytes": (1, None), "retry_count": (0, 7), "rnr_retry": (0, 6),
        "max_accepting": (1, 65536), "max_conns": (0, 65536),
    },
    "directory": {"lease_ms": (300, 86400000), "timeout_ms": (1, None),
                  "configure_store": (0, 1)},
}

TRANSPORTS = {lib.MW_TRANSPORT_AUTO: "auto", lib.MW_TRANSPORT_RDMA: "rdma",
              lib.MW_TRANSPORT_LOCAL: "local", lib.MW_TRANSPORT_TCP: "tcp"}


def _named(kind: str, name: str, value: Any) -> Any:
    names = _NAMED[name]
    if isinstance(value, str):
        if value not in names:
            raise ValueError(f"{kind} option {name}={value!r}: expected one of "
                             f"{', '.join(map(repr, names))}")
        return names[value]
    if value not in names.values():
        raise ValueError(f"{kind} option {name}={value!r}: expected one of "
                         f"{', '.join(map(repr, names))}")
    return value


def set_options(opts: Any, kind: str, given: dict) -> None:
    """Copy keyword options onto a C options struct by name: unknown names,
    values of the wrong type and values out of their documented range are
    refused naming the option (TypeError, ValueError)."""
    t = ffi.typeof(opts)
    fields = dict((t.item if t.kind == "pointer" else t).fields)
    ranges = _RANGES.get(kind, {})
    for name, value in given.items():
        field = fields.get(name)
        if field is None:
            known = sorted(n for n, f in fields.items() if f.type.kind not in ("pointer", "function"))
            raise TypeError(f"unknown {kind} option {name!r} (known: {', '.join(known)})")
        if field.type.kind in ("pointer", "function"):
            raise TypeError(f"{kind} option {name!r} cannot be set from Python")
        if name in _NAMED:
            value = _named(kind, name, value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{kind} option {name}={value!r}: expected an integer")
        lo, hi = ranges.get(name, (0, None))
        if value < lo or (hi is not None and value > hi):
            want = f"at least {lo}" if hi is None else f"{lo}..{hi}"
            raise ValueError(f"{kind} option {name}={value}: expected {want}")
        try:
            setattr(opts, name, value)
        except OverflowError:
            raise ValueError(f"{kind} option {name}={value}: too large for its C type "
                             f"({field.type.cname})") from None


class Context:
    """A meshwire context on the running asyncio loop (the default loop or
    uvloop).  Use it as ``async with Context() as ctx`` or call close().
    Keyword options are mw_ctx_opts_t's: log_level ("error", "warn",
    "info", "debug" or the MW_LOG_* number; default from MW_LOG, else
    "warn"), cq_depth, max_wc_per_turn, threads."""

    def __init__(self, *, loop: Optional[asyncio.AbstractEventLoop] = None, **opts: Any):
        self._loop = loop or asyncio.get_running_loop()
        o = ffi.new(T.ctx_opts_p)
        lib.mw_ctx_opts_init(o)
        set_options(o, "context", opts)
        pp = ffi.new(T.ctx_pp)
        check(lib.mw_ctx_new(pp, ffi.NULL, o), "mw_ctx_new")
        self._ctx = pp[0]
        self._ops: set = set()             # operations in flight (keeps them alive)
        self._owned: "weakref.WeakSet[Any]" = weakref.WeakSet()   # connections, listeners...
        self._starts: list = []            # sorted starts of live mw_alloc blocks
        self._ends: dict = {}              # start -> end
        self._closing = False
        self._reaper = Reaper(self._loop)  # what the garbage collector hands back
        self._in_progress = False
        self._wakeups = 0
        self._fd = check(lib.mw_ctx_fd(self._ctx), "mw_ctx_fd")
        self._loop.add_reader(self._fd, self._progress)

    def _progress(self) -> None:
        self._wakeups += 1
        if self._ctx is not None:
            self._in_progress = True
            try:
                lib.mw_ctx_progress(self._ctx)  # never blocks; level-triggered fd
            finally:
                self._in_progress = False

    def _live(self) -> Any:
        if self._ctx is None or self._closing:
            raise error(-108, "the context is closed")   # ESHUTDOWN
        return self._ctx

    # --- memory -----------------------------------------------------------

    def alloc(self, size: int) -> memoryview:
        """@size bytes of registered memory (mw_alloc), as a writable
        memoryview: numpy.frombuffer(buf, dtype) and every other buffer
        consumer work on it without a copy.  It is freed once the last view
        of it goes -- from the loop, on its thread, whichever thread let go
        of it (at the loop's next turn, or the next alloc()); one-sided
        operations on it need no registration."""
        if size <= 0:
            raise ValueError("size must be positive")
        self._reaper.run()                 # blocks let go of: freed before growing
        p = lib.mw_alloc(self._live(), size)
        if p == ffi.NULL:
            raise MemoryError(f"mw_alloc({size}): {ffi.string(lib.mw_strerror(-ffi.errno)).decode()}")
        start = int(ffi.cast(T.uintptr, p))
        bisect.insort(self._starts, start)
        self._ends[start] = start + size
        reaper, release = self._reaper, self._release_block

        def released(_: Any) -> None:      # a finalizer: any thread, any moment
            reaper.later(release, start, p)

        cp = ffi.gc(ffi.cast(T.char_p, p), released, size)
        return memoryview(ffi.buffer(cp, size))

    def tensor(self, shape: Any, dtype: Any) -> Any:
        """A torch tensor of @shape and @dtype (torch.float16,
        torch.bfloat16...) over registered memory from alloc(): a KV pool
        that one-sided operations use as it is.  Its memory goes with the
        tensor's last view."""
        from ._tensor import alloc
        return alloc(self, shape, dtype)

    def _release_block(self, start: int, p: Any) -> None:
        del self._starts[bisect.bisect_left(self._starts, start)]
        del self._ends[start]
        if self._ctx is not None:
            lib.mw_free(self._ctx, p)
        if self._closing and not self._starts:
            self._free()

    def _ours(self, addr: int, n: int) -> bool:
        i = bisect.bisect_right(self._starts, addr) - 1
        return i >= 0 and addr + n <= self._ends[self._starts[i]]

    def _local(self, obj: Bufferable, writable: bool) -> tuple:
        """(pointer, length, registration or None) for @obj -- a buffer or
        a CPU torch tensor -- without a copy: memory from alloc() as it
        is, any other memory registered (mw_reg; drop the registration
        with _unreg once done).  The caller keeps @obj referenced."""
        if is_tensor(obj):
            p, n = span(obj)
        else:
            p = ffi.from_buffer(T.chars, obj, require_writable=writable)
            n = len(p)
        if n == 0 or self._ours(int(ffi.cast(T.uintptr, p)), n):
            return p, n, None
        mrp = ffi.new(T.mr_pp)
        rc = lib.mw_reg(self._live(), p, n, mrp)
        if rc < 0:
            del p                          # not kept by the exception's traceback
            check(rc, "mw_reg")
        return p, n, mrp[0]

    def _unreg(self, mr: Any) -> None:
        if mr is not None and self._ctx is not None:
            lib.mw_dereg(self._ctx, mr)

    # --- futures ----------------------------------------------------------

    def _await(self, f: Any, what: str, **kw: Any) -> Any:
        """An awaitable for the meshwire future @f (see _future.bridge)."""
        return _future.wait(_future.bridge(self, f, what, **kw), kw.get("orphan"))

    async def sleep(self, ms: int) -> None:
        """A meshwire timer (a future that fails -ETIMEDOUT after @ms),
        awaited: resolves after @ms.  For tests of the loop plumbing."""
        f = lib.mw_future_new(self._live())
        lib.mw_future_set_timeout(f, ms)
        try:
            await self._await(f, "timer")
        except TimeoutError:
            pass

    # --- what it makes ------------------------------------------------------

    async def connect(self, addrs: str, **opts: Any) -> "Connection":
        """Connect to "host:port[,host:port...]" (see mw_connect): the
        Connection, or ConnectionRefusedError, TimeoutError...  Keyword
        options are mw_conn_opts_t's, by name: timeout_ms=2000,
        transport="rdma" (the NIC even when the peer is a process of this
        host; "auto", the default, takes the same-host path there, and TCP
        on a host without RDMA; "tcp": TCP whatever the host has)..."""
        from ._conn import Connection
        o = ffi.new(T.conn_opts_p)
        lib.mw_conn_opts_init(o)
        set_options(o, "connection", opts)
        f = lib.mw_connect(self._live(), addrs.encode(), o)
        return await self._await(
            f, f"connect {addrs}", convert=lambda v: Connection(self, ffi.cast(T.conn_p, v)),
            orphan=lambda conn: conn.abort())

    def listen(self, addr: str = "0.0.0.0:7470", **opts: Any) -> "Listener":
        """Listen on @addr ("host:port", port 0 for any): a Listener, to use
        as ``async with ctx.listen(addr) as l: async for conn in l``.
        Keyword options (connect()'s) are for the connections accepted."""
        from ._conn import Listener
        return Listener(self, addr, opts)

    async def directory(self, url: Optional[str] = None, **opts: Any) -> "Directory":
        """A directory on the store at @url ("redis://HOST[:PORT][/DB]",
        "unix:PATH[?db=N]" or "etcd://HOST[:PORT]"; default: MW_DIRECTORY
        from the environment),
        once the store answered.  Keyword options are mw_dir_opts_t's:
        prefix="mw", lease_ms=10000, timeout_ms=5000, configure_store=0
        (1: turn the store's keyspace notifications on if watches need them)."""
        from ._dir import open_directory
        return await open_directory(self, url, opts)

    def rails(self, slice_bytes: int = 0) -> "Rails":
        """An empty rail group (mw_rails_new): add() a connection per NIC
        pair to one peer; transfers spread over them in slices of
        @slice_bytes (0: 1 MiB) and survive a rail that fails."""
        from ._rails import Rails
        return Rails(self, slice_bytes)

    async def communicator(self, rank: Optional[int] = None,
                           peers: Optional[Sequence[str]] = None, **opts: Any) -> "Communicator":
        """A communicator of len(@peers) ranks, this one @rank (peers[r] is
        rank r's "host:port[,host:port]"); without them, from the
        launcher's environment (mw_comm_create_env)."""
        from ._comm import create
        return await create(self, rank, peers, opts)

    def stats(self) -> dict:
        """The context's counters (mw_ctx_stats) by name, and loop_wakeups:
        how many times the loop woke for meshwire's descriptor (an idle
        context: none)."""
        st = ffi.new(T.ctx_stats_p)
        lib.mw_ctx_stats(self._live(), st)
        out = fields(st)
        out["loop_wakeups"] = self._wakeups
        return out

    def metrics(self) -> str:
        """The context's counters and its connections' in Prometheus's text
        exposition format (mw_ctx_metrics): what a /metrics handler serves.
        From the loop's thread (meshwire.Collector reads it from others)."""
        if threading.get_ident() != self._reaper._thread:
            raise RuntimeError("Context.metrics() is the loop thread's: use meshwire.Collector "
                               "from other threads")
        ctx = self._live()
        n = check(lib.mw_ctx_metrics(ctx, ffi.NULL, 0), "mw_ctx_metrics")
        buf = ffi.new(T.chars, n + 1)
        check(lib.mw_ctx_metrics(ctx, buf, n + 1), "mw_ctx_metrics")
        return ffi.string(buf).decode(errors="replace")

    # --- the end ----------------------------------------------------------

    def close(self) -> None:
        """Abort what the context still holds (connections, listeners,
        communicators: pending operations fail) and free it.  Memory from
        alloc() stays valid while any view of it lives: the context is
        freed with its last block."""
        if self._ctx is None or self._closing:
            return
        self._closing = True
        for obj in list(self._owned):
            obj._drop()                    # their pending work fails, from the loop
        self._reaper.run()                 # what was let go of goes first
        if not self._starts:
            self._free()

    def _free(self) -> None:
        if self._ctx is None:
            return
        if self._in_progress:              # never from inside mw_ctx_progress (C refuses)
            self._loop.call_soon(self._free)
            return
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        ctx, self._ctx = self._ctx, None
        check(lib.mw_ctx_free(ctx), "mw_ctx_free")   # pending futures fail -ECANCELED, callbacks run
        self._reaper.run()                 # releases their callbacks queued: the context is gone

    async def __aenter__(self) -> "Context":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ctx is None else "closing" if self._closing else f"fd {self._fd}"
        return f"<meshwire.Context {state}, {len(self._ops)} operations in flight>"
