"""Batches (mw_batch_*): many one-sided transfers prepared once on a
connection and posted as often as wanted, each post one awaitable -- the
shape of a KV cache's block list."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

from ._conn import Remote
from ._lib import T, error, ffi, lib
from ._release import finalize

Entry = Tuple[Any, Any, int]   # (local buffer, Remote, offset in it)


def _batch_collected(ctx: Any, b: Any, regs: list, keep: list) -> None:
    """A Batch collected without close(): free it and its registrations,
    from the loop (no post is in flight: each holds the Batch)."""
    def release() -> None:
        if ctx._ctx is not None:
            lib.mw_batch_free(b)
            for mr in regs:
                ctx._unreg(mr)
        regs.clear()
        keep.clear()
    ctx._reaper.later(release)


class Batch:
    """A prepared list of transfers, all writes or all reads, on one
    connection (Connection.batch, Connection.batch_strided).  Every entry's
    bounds and memory were checked when it was made; post() carries them
    all out in order.  Its local memory is lent while it lives: memory from
    Context.alloc as it is, any other buffer registered until close().
    ``with conn.batch(...) as b`` closes it; one collected is freed."""

    def __init__(self, conn: Any, b: Any, n: int, read: bool, regs: list, keep: list):
        self._conn, self._ctx, self._b = conn, conn._ctx, b
        self._n, self.read = n, read
        self._regs, self._keep = regs, keep   # registrations made for it; buffers it lends
        self._posts = 0                       # in flight: registrations wait for them
        self._collected = finalize(self, _batch_collected, self._ctx, b, regs, keep)
        self._ctx._owned.add(self)

    def __len__(self) -> int:
        return self._n

    async def post(self, imm: Optional[int] = None) -> None:
        """Carry out every entry, in the connection's order (a message sent
        after post() arrives after all of the batch's data); with @imm (a
        write batch), the peer's immediates() get it once all data is in
        place.  On failure the OSError's ``done`` says how many entries,
        from the first, completed (later ones did not, though bytes of
        them may have landed).  Cancelling the awaiting task cancels the
        post; the memory stays lent until meshwire is done with it."""
        aw, done = self._start(imm)
        try:
            await aw
        except OSError as e:
            e.done = done[0]
            raise

    def _start(self, imm: Optional[int]) -> Tuple[Any, Any]:
        """Post now: (the awaitable, its done count's cell)."""
        if self._b is None:
            raise error(-108, "the batch is closed")   # ESHUTDOWN
        done = ffi.new(T.size_p)
        if imm is None:
            f = lib.mw_batch_post(self._b, done)
        else:
            if not 0 <= imm < 1 << 32:
                raise ValueError(f"imm={imm}: a 32-bit immediate is 0..{(1 << 32) - 1}")
            f = lib.mw_batch_post_imm(self._b, imm, done)
        self._posts += 1
        return self._ctx._await(f, "batch post", keep=(self, done), after=self._post_done), done

    def _post_done(self) -> None:
        self._posts -= 1
        if self._b is None and not self._posts:
            self._unreg_all()

    def _unreg_all(self) -> None:
        for mr in self._regs:
            self._ctx._unreg(mr)
        self._regs.clear()
        self._keep.clear()

    def close(self) -> None:
        """Drop the batch: posts under way finish first; its registrations
        go after them."""
        if self._b is None:
            return
        b, self._b = self._b, None
        self._collected.detach()
        self._ctx._owned.discard(self)
        lib.mw_batch_free(b)
        if not self._posts:
            self._unreg_all()

    _drop = close

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "read" if self.read else "write"
        return f"<meshwire.Batch of {self._n} {kind}s{' (closed)' if self._b is None else ''}>"


def _lend(ctx: Any, buf: Any, read: bool, regs: list, keep: list) -> Tuple[Any, int]:
    """@buf's pointer and length, registered if not from alloc() (the
    registration then kept in @regs) and referenced from @keep."""
    p, n, mr = ctx._local(buf, writable=read)
    if mr is not None:
        regs.append(mr)
    keep.append((buf, p))
    return p, n


def _made(conn: Any, rc: int, bad: Any, n: int, read: bool, regs: list, keep: list,
          what: str, bp: Any) -> Batch:
    if rc < 0:
        _forget(conn._ctx, regs, keep)
        text = ffi.string(lib.mw_strerror(rc)).decode()
        where = f" (entry {bad[0]})" if bad[0] < n else ""
        raise error(rc, f"{what}{where}: {text}")
    return Batch(conn, bp[0], n, read, regs, keep)


def _forget(ctx: Any, regs: list, keep: list) -> None:
    """A batch not made: drop its registrations and views of the caller's
    memory now.  (No frame that an exception's traceback keeps may hold a
    view of it: a cycle through one -- the exception kept by its handler --
    once crashed CPython's collector.)"""
    for mr in regs:
        ctx._unreg(mr)
    regs.clear()
    keep.clear()


def _entry(i: int, entry: Any) -> Tuple[Any, Any, int]:
    if not (isinstance(entry, (tuple, list)) and len(entry) == 3):
        raise TypeError(f"batch entry {i}: expected (buffer, Remote, offset), "
                        f"not {type(entry).__name__} {entry!r:.40}")
    buf, remote, offset = entry
    if not isinstance(remote, Remote):
        raise TypeError(f"batch entry {i}: {type(remote).__name__} is not a meshwire.Remote")
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"batch entry {i}: offset={offset!r} must be an int >= 0")
    return buf, remote, offset


def new(conn: Any, entries: Iterable[Entry], read: bool) -> Batch:
    """Connection.batch: see there."""
    c, ctx = conn._live(), conn._ctx
    regs: list = []
    keep: list = []
    remotes: list = []                     # distinct Remotes, in first-use order
    index: dict = {}
    rows: list = []
    try:
        for i, entry in enumerate(entries):
            buf, remote, offset = _entry(i, entry)
            key = (remote.addr, remote.len, remote.rkey)
            if key not in index:
                index[key] = len(remotes)
                remotes.append(remote)
            p, n = _lend(ctx, buf, read, regs, keep)
            rows.append({"local": p, "len": n, "offset": offset, "remote": index[key]})
        if not rows:
            raise ValueError("a batch needs at least one entry")
        es = ffi.new(T.batch_entries, rows)
    except BaseException:
        _forget(ctx, regs, keep)
        rows.clear()
        p = buf = entry = None
        raise
    n = len(rows)
    rows.clear()
    rs = ffi.new(T.remotes, [{"addr": r.addr, "len": r.len, "rkey": r.rkey} for r in remotes])
    bp = ffi.new(T.batch_pp)
    bad = ffi.new(T.size_p, n)
    rc = lib.mw_batch_new(c, lib.MW_DIR_READ if read else lib.MW_DIR_WRITE,
                          rs, len(remotes), es, n, bp, bad)
    p = buf = entry = None
    return _made(conn, rc, bad, n, read, regs, keep, "mw_batch_new", bp)


def new_strided(conn: Any, local: Any, remote: Any, count: int, length: int,
                local_stride: Optional[int], remote_stride: Optional[int], offset: int,
                read: bool) -> Batch:
    """Connection.batch_strided: see there."""
    if not isinstance(remote, Remote):
        raise TypeError(f"batch_strided: {type(remote).__name__} is not a meshwire.Remote")
    for name, v in (("count", count), ("length", length), ("offset", offset)):
        if not isinstance(v, int) or v < (0 if name == "offset" else 1):
            raise ValueError(f"batch_strided: {name}={v!r}")
    local_stride = length if local_stride is None else local_stride
    remote_stride = length if remote_stride is None else remote_stride
    c, ctx = conn._live(), conn._ctx
    regs: list = []
    keep: list = []
    p, n = _lend(ctx, local, read, regs, keep)
    need = (count - 1) * local_stride + length
    if need > n:
        _forget(ctx, regs, keep)
        p = None
        raise ValueError(f"batch_strided: {count} entries of {length} bytes every "
                         f"{local_stride} need {need} bytes of local memory, not {n}")
    bp = ffi.new(T.batch_pp)
    bad = ffi.new(T.size_p, count)
    rc = lib.mw_batch_new_strided(c, lib.MW_DIR_READ if read else lib.MW_DIR_WRITE,
                                  p, local_stride, remote._c(), offset, remote_stride, count,
                                  length, bp, bad)
    p = None
    return _made(conn, rc, bad, count, read, regs, keep, "mw_batch_new_strided", bp)
