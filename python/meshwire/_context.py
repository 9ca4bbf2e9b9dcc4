"""The context: meshwire's one descriptor joined to the running asyncio
loop (add_reader calling mw_ctx_progress: no thread, no polling; idle, the
loop sleeps), registered memory, and the entry points that make
connections, listeners and communicators."""
from __future__ import annotations

import asyncio
import bisect
import weakref
from typing import TYPE_CHECKING, Any, Optional, Sequence

from . import _future
from ._lib import check, error, ffi, lib

if TYPE_CHECKING:
    from ._comm import Communicator
    from ._conn import Connection, Listener

Bufferable = Any   # anything with the buffer protocol: bytes, bytearray, numpy arrays, mmap...


def set_options(opts: Any, kind: str, given: dict) -> None:
    """Copy keyword options onto a C options struct, refusing unknown names."""
    t = ffi.typeof(opts)
    fields = {name for name, _ in (t.item if t.kind == "pointer" else t).fields}
    for name, value in given.items():
        if name not in fields:
            raise TypeError(f"unknown {kind} option {name!r} (known: {', '.join(sorted(fields))})")
        setattr(opts, name, value)


class Context:
    """A meshwire context on the running asyncio loop (the default loop or
    uvloop).  Use it as ``async with Context() as ctx`` or call close()."""

    def __init__(self, *, log_level: Optional[int] = None,
                 loop: Optional[asyncio.AbstractEventLoop] = None):
        self._loop = loop or asyncio.get_running_loop()
        opts = ffi.new("mw_ctx_opts_t *")
        lib.mw_ctx_opts_init(opts)
        if log_level is not None:
            opts.log_level = log_level
        pp = ffi.new("mw_ctx_t **")
        check(lib.mw_ctx_new(pp, ffi.NULL, opts), "mw_ctx_new")
        self._ctx = pp[0]
        self._ops: set = set()             # operations in flight (keeps them alive)
        self._owned: "weakref.WeakSet[Any]" = weakref.WeakSet()   # connections, listeners...
        self._starts: list = []            # sorted starts of live mw_alloc blocks
        self._ends: dict = {}              # start -> end
        self._closing = False
        self._fd = check(lib.mw_ctx_fd(self._ctx), "mw_ctx_fd")
        self._loop.add_reader(self._fd, self._progress)

    def _progress(self) -> None:
        if self._ctx is not None:
            lib.mw_ctx_progress(self._ctx)  # never blocks; level-triggered fd

    def _live(self) -> Any:
        if self._ctx is None or self._closing:
            raise error(-108, "the context is closed")   # ESHUTDOWN
        return self._ctx

    # --- memory -----------------------------------------------------------

    def alloc(self, size: int) -> memoryview:
        """@size bytes of registered memory (mw_alloc), as a writable
        memoryview: numpy.frombuffer(buf, dtype) and every other buffer
        consumer work on it without a copy.  It is freed when the last view
        of it goes; one-sided operations on it need no registration."""
        if size <= 0:
            raise ValueError("size must be positive")
        p = lib.mw_alloc(self._live(), size)
        if p == ffi.NULL:
            raise MemoryError(f"mw_alloc({size}): {ffi.string(lib.mw_strerror(-ffi.errno)).decode()}")
        start = int(ffi.cast("uintptr_t", p))
        bisect.insort(self._starts, start)
        self._ends[start] = start + size
        ctx = self

        def release(q: Any) -> None:
            i = bisect.bisect_left(ctx._starts, start)
            del ctx._starts[i]
            del ctx._ends[start]
            lib.mw_free(ctx._ctx, q)
            if ctx._closing and not ctx._starts:
                ctx._free()

        cp = ffi.gc(ffi.cast("char *", p), release, size)
        return memoryview(ffi.buffer(cp, size))

    def _ours(self, addr: int, n: int) -> bool:
        i = bisect.bisect_right(self._starts, addr) - 1
        return i >= 0 and addr + n <= self._ends[self._starts[i]]

    def _local(self, obj: Bufferable, writable: bool) -> tuple:
        """(pointer, length, registration or None) for @obj, without a copy:
        memory from alloc() as it is, any other memory registered
        (mw_reg; drop the registration with _unreg once done)."""
        p = ffi.from_buffer("char[]", obj, require_writable=writable)
        n = len(p)
        if n == 0 or self._ours(int(ffi.cast("uintptr_t", p)), n):
            return p, n, None
        mrp = ffi.new("mw_mr_t **")
        check(lib.mw_reg(self._live(), p, n, mrp), "mw_reg")
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
        Connection, or ConnectionRefusedError, TimeoutError..."""
        from ._conn import Connection
        o = ffi.new("mw_conn_opts_t *")
        lib.mw_conn_opts_init(o)
        set_options(o, "connection", opts)
        f = lib.mw_connect(self._live(), addrs.encode(), o)
        return await self._await(
            f, f"connect {addrs}", convert=lambda v: Connection(self, ffi.cast("mw_conn_t *", v)),
            orphan=lambda conn: conn.abort())

    def listen(self, addr: str = "0.0.0.0:7470", **opts: Any) -> "Listener":
        """Listen on @addr ("host:port", port 0 for any): a Listener, to use
        as ``async with ctx.listen(addr) as l: async for conn in l``."""
        from ._conn import Listener
        return Listener(self, addr, opts)

    async def communicator(self, rank: Optional[int] = None,
                           peers: Optional[Sequence[str]] = None, **opts: Any) -> "Communicator":
        """A communicator of len(@peers) ranks, this one @rank (peers[r] is
        rank r's "host:port[,host:port]"); without them, from the
        launcher's environment (mw_comm_create_env)."""
        from ._comm import create
        return await create(self, rank, peers, opts)

    def stats(self) -> dict:
        """The context's counters (mw_ctx_stats) by name."""
        st = ffi.new("mw_ctx_stats_t *")
        lib.mw_ctx_stats(self._live(), st)
        return {name: getattr(st, name) for name, _ in ffi.typeof(st).item.fields}

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
        if not self._starts:
            self._free()

    def _free(self) -> None:
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        ctx, self._ctx = self._ctx, None
        lib.mw_ctx_free(ctx)               # pending futures fail -ECANCELED, callbacks run

    async def __aenter__(self) -> "Context":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._ctx is None else "closing" if self._closing else f"fd {self._fd}"
        return f"<meshwire.Context {state}, {len(self._ops)} operations in flight>"
