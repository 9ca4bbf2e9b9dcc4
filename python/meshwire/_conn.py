"""Connections and listeners: messages, one-sided RDMA, immediates."""
from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, Optional, Tuple

from ._context import TRANSPORTS, Bufferable, Context, set_options
from ._lib import T, check, error, ffi, fields, lib
from ._release import callbacks, finalize

if TYPE_CHECKING:
    from ._batch import Batch


class Remote:
    """Memory a peer exported (mw_remote_t): send bytes(remote) to the peer
    that should access it; it loads it with Remote.from_bytes.  The bytes
    are the C struct's, so C and Python peers exchange them alike.  It
    works on the connection it was exported for only."""

    __slots__ = ("addr", "len", "rkey")
    SIZE = ffi.sizeof(T.remote)

    def __init__(self, addr: int, len: int, rkey: int):
        self.addr, self.len, self.rkey = addr, len, rkey

    def __bytes__(self) -> bytes:
        return bytes(ffi.buffer(self._c()))

    @classmethod
    def from_bytes(cls, b: Bufferable) -> "Remote":
        view = memoryview(b).cast("B")
        if view.nbytes != cls.SIZE:
            raise ValueError(f"a Remote is {cls.SIZE} bytes, not {view.nbytes}")
        r = ffi.new(T.remote_p)
        ffi.memmove(r, view, cls.SIZE)
        return cls(r.addr, r.len, r.rkey)

    def _c(self) -> Any:
        return ffi.new(T.remote_p, {"addr": self.addr, "len": self.len, "rkey": self.rkey})

    def __repr__(self) -> str:
        return f"<meshwire.Remote {self.len} bytes at {self.addr:#x} key {self.rkey:#x}>"


def _message(value: Any) -> memoryview:
    """A received mw_msg_t as a memoryview over meshwire's buffer, which is
    freed (mw_msg_free) the moment the last view of it is released: by
    reference count, whichever thread lets go.  Its finalizer calls the C
    function and nothing else (mw_msg_free only frees memory, thread-safe;
    looked up at import), so it can neither block nor reach the loop."""
    m = ffi.cast(T.msg_p, value)
    n = m.len
    if n == 0:
        lib.mw_msg_free(m)
        return memoryview(b"")
    data = ffi.gc(ffi.cast(T.char_p, m.data), lambda _, m=m, free=lib.mw_msg_free: free(m), n)
    return memoryview(ffi.buffer(data, n))


@ffi.callback("void(mw_conn_t *, uint32_t, void *)")
def _on_imm(c: Any, imm: int, arg: Any) -> None:
    conn: Optional[Connection] = callbacks.get(arg)
    if conn is not None and conn._imms is not None:   # else collected: nobody asks
        conn._imms.put_nowait(imm)


def _conn_collected(ctx: Context, c: Any, key: int, exported: dict) -> None:
    """A Connection collected while open: abort it and drop its exports'
    registrations, from the loop (Reaper)."""
    def release() -> None:
        callbacks.forget(key)
        if ctx._ctx is not None:           # else the context's free released it
            lib.mw_conn_abort(c)
            for _, mr in exported.values():
                ctx._unreg(mr)
        exported.clear()
    ctx._reaper.later(release)


class Connection:
    """One RC connection.  ``async with conn:`` closes it gracefully; one
    collected without close() or abort() is aborted (from the loop)."""

    def __init__(self, ctx: Context, c: Any):
        self._ctx, self._c = ctx, c
        self._unclaimed: collections.deque = collections.deque()   # see recv()
        self._settling = 0                 # receives given up, not yet back from meshwire
        self._settled = asyncio.Event()
        self._imms: Optional[asyncio.Queue] = None
        self._exported: dict = {}          # Remote key -> (buffer, registration)
        self._key = callbacks.add(self)    # what immediates' callback carries
        self._collected = finalize(self, _conn_collected, ctx, c, self._key, self._exported)
        ctx._owned.add(self)

    def _live(self) -> Any:
        if self._c is None:
            raise error(-108, "the connection is closed")   # ESHUTDOWN
        return self._c

    async def send(self, buf: Bufferable) -> None:
        """Send @buf as one message (any size; in order).  @buf is read
        where it lies, without a copy in Python, until this completes."""
        await self._send(buf)

    def _send(self, buf: Bufferable) -> Any:
        c = self._live()                   # see _rdma: no view in the coroutine's frame
        p = ffi.from_buffer(T.chars, buf)
        return self._ctx._await(lib.mw_send(c, p, len(p)), "send", keep=(buf, p))

    async def recv(self) -> memoryview:
        """The next message, as a memoryview over meshwire's buffer (freed
        when the view is released).  Cancelling the awaiting task loses no
        message and keeps their order: one that arrived meanwhile goes to
        the next recv(), which first waits until every receive given up has
        come back from meshwire.  (Receives awaited at once by several tasks
        get messages in the order they were issued.)"""
        while self._settling:
            await self._settled.wait()
        if self._unclaimed:
            return self._unclaimed.popleft()
        state = {"back": False, "counted": False}

        def back() -> None:
            state["back"] = True
            if state["counted"]:
                self._settling -= 1
                if not self._settling:
                    self._settled.set()

        aw = self._ctx._await(lib.mw_recv(self._live()), "recv", convert=_message,
                              orphan=self._unclaimed.append, after=back)
        try:
            return await aw
        except asyncio.CancelledError:
            if not state["back"]:
                state["counted"] = True
                self._settling += 1
                self._settled.clear()
            raise

    def export(self, buf: Bufferable, offset: int = 0, length: Optional[int] = None) -> Remote:
        """Let the peer read and write @buf[offset:offset+length] (memory
        from Context.alloc, or any buffer, registered now): the Remote to
        send it.  It stands until unexport(), or the memory or connection
        goes."""
        c = self._live()
        p, n, mr = self._ctx._local(buf, writable=True)
        length = n - offset if length is None else length
        if offset < 0 or length <= 0 or offset + length > n:
            self._ctx._unreg(mr)
            del p                          # see _rdma
            raise ValueError(f"[{offset}, {offset}+{length}) is not inside {n} bytes")
        out = ffi.new(T.remote_p)
        rc = lib.mw_mem_export(c, p + offset, length, out)
        del p
        if rc < 0:
            self._ctx._unreg(mr)
            check(rc, "mw_mem_export")
        # The memory stays referenced (and, not from alloc(), registered:
        # its last mw_dereg would withdraw the export) while exported.
        self._exported[(out.addr, out.len, out.rkey)] = (buf, mr)
        return Remote(out.addr, out.len, out.rkey)

    def unexport(self, remote: Remote) -> None:
        check(lib.mw_mem_unexport(self._live(), remote._c()), "mw_mem_unexport")
        _, mr = self._exported.pop((remote.addr, remote.len, remote.rkey), (None, None))
        self._ctx._unreg(mr)

    def _rdma(self, fn: Any, what: str, buf: Bufferable, remote: Remote, offset: int,
              writable: bool, *imm: int) -> Any:
        """The awaitable of one transfer, made here rather than in the
        coroutine awaiting it: no frame that an exception's traceback keeps
        holds a view of the caller's memory (a cycle through one, the
        exception kept by its handler, once crashed CPython's collector)."""
        c = self._live()
        p, n, mr = self._ctx._local(buf, writable)
        r = remote._c()
        f = fn(c, p if n else ffi.NULL, n, r, offset, *imm)
        return self._ctx._await(f, what, keep=(buf, p, r), after=lambda: self._ctx._unreg(mr))

    async def write(self, buf: Bufferable, remote: Remote, offset: int = 0) -> None:
        """RDMA WRITE all of @buf to @remote at @offset (bounds checked)."""
        await self._rdma(lib.mw_write, "write", buf, remote, offset, False)

    async def read(self, buf: Bufferable, remote: Remote, offset: int = 0) -> None:
        """RDMA READ len(@buf) bytes from @remote at @offset into @buf."""
        await self._rdma(lib.mw_read, "read", buf, remote, offset, True)

    async def write_imm(self, buf: Bufferable, remote: Remote, offset: int, imm: int) -> None:
        """write(), then @imm reaches the peer's immediates() once all of
        the data is in place (@buf may be empty: the immediate alone)."""
        await self._rdma(lib.mw_write_imm, "write_imm", buf, remote, offset, False, imm)

    def batch(self, entries: Iterable[Tuple[Bufferable, Remote, int]], *,
              read: bool = False) -> "Batch":
        """Prepare a batch (mw_batch_new): @entries are (buffer, Remote,
        offset) -- each buffer written whole to the Remote at offset, or
        with @read filled from it.  Every entry is checked now (bounds,
        memory: an error names the entry); nothing moves until
        Batch.post(), which may be awaited as often as wanted."""
        from ._batch import new
        return new(self, entries, read)

    def batch_strided(self, local: Bufferable, remote: Remote, *, count: int, length: int,
                      local_stride: Optional[int] = None, remote_stride: Optional[int] = None,
                      offset: int = 0, read: bool = False) -> "Batch":
        """A batch of @count entries of @length bytes for a paged layout:
        entry i is @local[i * local_stride:][:length] and @remote at
        @offset + i * remote_stride (strides default to @length)."""
        from ._batch import new_strided
        return new_strided(self, local, remote, count, length, local_stride, remote_stride,
                           offset, read)

    def immediates(self) -> AsyncIterator[int]:
        """The immediates of the peer's write_imm, in order, until the
        connection closes: ``async for imm in conn.immediates()``.  They
        are collected from this call on (ask before the peer writes)."""
        if self._imms is None:
            check(lib.mw_conn_on_imm(self._live(), _on_imm, callbacks.arg(self._key)),
                  "mw_conn_on_imm")
            self._imms = asyncio.Queue()
        return self._next_imms()

    async def _next_imms(self) -> AsyncIterator[int]:
        while True:
            imm = await self._imms.get()
            if imm is None:
                return
            yield imm

    def stats(self) -> dict:
        """The connection's counters and addresses (mw_conn_stats) by name;
        transport is "rdma" (the NIC), "local" (the same-host path) or
        "tcp"."""
        st = ffi.new(T.conn_stats_p)
        check(lib.mw_conn_stats(self._live(), st), "mw_conn_stats")
        out = fields(st)
        out["transport"] = TRANSPORTS.get(out["transport"], out["transport"])
        return out

    def _release(self) -> Any:
        """Hand the connection to close/abort; its exports go with it."""
        c, self._c = self._c, None
        self._collected.detach()
        callbacks.forget(self._key)        # no immediate is delivered after close/abort
        self._ctx._owned.discard(self)
        if self._imms is not None:
            self._imms.put_nowait(None)
        return c

    def _unexport_all(self) -> None:
        for _, mr in self._exported.values():
            self._ctx._unreg(mr)
        self._exported.clear()

    async def close(self) -> None:
        """Graceful: pending operations finish, then the connection goes."""
        if self._c is not None:
            await self._ctx._await(lib.mw_conn_close(self._release()), "close",
                                   after=self._unexport_all)

    def abort(self) -> None:
        """Abortive: pending operations fail (ConnectionAbortedError)."""
        if self._c is not None:
            lib.mw_conn_abort(self._release())
            self._unexport_all()

    _drop = abort

    async def __aenter__(self) -> "Connection":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


@ffi.callback("void(mw_listener_t *, mw_conn_t *, void *)")
def _on_accept(l: Any, c: Any, arg: Any) -> None:
    listener: Optional[Listener] = callbacks.get(arg)
    if listener is None or listener._l is None:   # collected (or closed): refuse it
        lib.mw_conn_abort(c)
        return
    try:
        conn = Connection(listener._ctx, c)
    except Exception as e:                # accept() raises it
        lib.mw_conn_abort(c)
        listener._accepted.put_nowait(e)
        return
    listener._accepted.put_nowait(conn)


def _listener_collected(ctx: Context, l: Any, key: int) -> None:
    """A Listener collected while listening: free it from the loop."""
    def release() -> None:
        callbacks.forget(key)
        if ctx._ctx is not None:           # else the context's free released it
            lib.mw_listener_free(l)
    ctx._reaper.later(release)


class Listener:
    """Accepts connections: ``async with ctx.listen(addr) as l`` then
    ``async for conn in l`` (or ``await l.accept()``).  The iteration ends
    when the listener is closed (close(), the ``async with`` block's end);
    anything else that stops it raises: the context closed under it
    (ConnectionAbortedError), an accepted connection that could not be
    taken.  One collected without close() is freed (from the loop), and
    peers connecting meanwhile are turned away."""

    def __init__(self, ctx: Context, addr: str, opts: dict):
        self._ctx = ctx
        o = ffi.new(T.conn_opts_p)
        lib.mw_conn_opts_init(o)
        set_options(o, "connection", opts)
        self._accepted: asyncio.Queue = asyncio.Queue()
        self._ended: Optional[tuple] = None   # (errno, why) it stopped, but for close()
        key = callbacks.add(self)
        lp = ffi.new(T.listener_pp)
        try:
            check(lib.mw_listen(ctx._live(), addr.encode(), o, _on_accept, callbacks.arg(key),
                                lp), f"listen {addr}")
        except BaseException:
            callbacks.forget(key)
            raise
        self._l = lp[0]
        self._key = key
        self._collected = finalize(self, _listener_collected, ctx, self._l, key)
        self.port: int = lib.mw_listener_port(self._l)
        ctx._owned.add(self)

    async def accept(self) -> Connection:
        """The next connection accepted; OSError once the listener stopped
        (ESHUTDOWN after close(), ECONNABORTED when the context closed)."""
        if self._l is None and self._accepted.empty():
            raise self._ended_error()
        got = await self._accepted.get()
        if got is None:
            self._accepted.put_nowait(None)   # for every later accept() too
            raise self._ended_error()
        if isinstance(got, BaseException):
            raise got
        return got

    def _ended_error(self) -> OSError:
        return error(*(self._ended or (-108, "the listener is closed")))

    def __aiter__(self) -> "Listener":
        return self

    async def __anext__(self) -> Connection:
        try:
            return await self.accept()
        except OSError as e:
            if self._l is None and self._ended is None and e.errno == 108:
                raise StopAsyncIteration from None   # closed by its owner: the end
            raise

    def stats(self) -> dict:
        st = ffi.new(T.listener_stats_p)
        if self._l is None:
            raise self._ended_error()
        check(lib.mw_listener_stats(self._l, st), "mw_listener_stats")
        return fields(st)

    def close(self) -> None:
        """Stop listening; connections accepted stay (those not taken yet
        with accept() too)."""
        if self._l is not None:
            l, self._l = self._l, None
            self._collected.detach()
            self._ctx._owned.discard(self)
            lib.mw_listener_free(l)
            callbacks.forget(self._key)
            self._accepted.put_nowait(None)

    def _drop(self) -> None:
        """The context is closing under the listener."""
        if self._l is not None:
            self._ended = (-103, "the listener's context was closed")   # ECONNABORTED
            self.close()

    async def __aenter__(self) -> "Listener":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()
