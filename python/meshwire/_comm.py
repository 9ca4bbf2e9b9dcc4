"""Communicators and the nine collectives on numpy arrays (or any buffer),
in place by default, without copies: meshwire registers the arrays while a
collective runs (free for memory from Context.alloc)."""
from __future__ import annotations

import errno
from typing import Any, Optional, Sequence

import numpy as np

from ._context import Context, set_options
from ._lib import T, check, error, ffi, fields, lib
from ._release import finalize
from ._tensor import as_array, implied_dtype, is_tensor

_DTYPES = {
    "int8": lib.MW_INT8, "int16": lib.MW_INT16, "int32": lib.MW_INT32, "int64": lib.MW_INT64,
    "uint8": lib.MW_UINT8, "uint16": lib.MW_UINT16, "uint32": lib.MW_UINT32,
    "uint64": lib.MW_UINT64, "float16": lib.MW_F16, "bf16": lib.MW_BF16,
    "float32": lib.MW_F32, "float64": lib.MW_F64,
}
_OPS = {"sum": lib.MW_SUM, "prod": lib.MW_PROD, "min": lib.MW_MIN, "max": lib.MW_MAX}

DTYPES = tuple(_DTYPES)
OPS = tuple(_OPS)


def _array(a: Any, what: str, writable: bool) -> np.ndarray:
    arr = as_array(a, what) if is_tensor(a) else np.asarray(a)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what}: not contiguous (meshwire moves arrays where they lie)")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what}: read-only")
    return arr


def _dtype(arr: np.ndarray, dtype: Optional[str]) -> Any:
    """meshwire's type for @arr: its own, or @dtype ("bf16" over uint16)."""
    implied = implied_dtype(arr)
    if implied and dtype and dtype != implied:
        raise TypeError(f"a {implied} tensor is not {dtype}")
    name = dtype or implied or arr.dtype.name
    if name not in _DTYPES:
        raise TypeError(f"meshwire has no type {name!r} (it has {', '.join(DTYPES)})")
    if np.dtype("uint16" if name == "bf16" else name).itemsize != arr.dtype.itemsize:
        raise TypeError(f"a {arr.dtype} array cannot hold {name}")
    return _DTYPES[name]


def _op(op: str) -> Any:
    if op not in _OPS:
        raise ValueError(f"unknown op {op!r} (ops: {', '.join(OPS)})")
    return _OPS[op]


def _ptr(arr: Optional[np.ndarray]) -> Any:
    return ffi.NULL if arr is None or arr.size == 0 else ffi.cast(T.void_p, arr.ctypes.data)


class Communicator:
    """Ranks that run collectives together.  Every rank calls the same
    collectives in the same order; each returns when this rank's part is
    complete.  Connections are made to the peers the collectives need, when
    they need them (stats() counts them).  ``async with`` leaves with
    close() when its body ends normally, with free() when it raised; one
    collected without either is freed from the loop."""

    def __init__(self, ctx: Context, comm: Any):
        self._ctx, self._comm = ctx, comm
        self.rank: int = lib.mw_comm_rank(comm)
        self.size: int = lib.mw_comm_size(comm)
        self._collected = finalize(self, _comm_collected, ctx, comm)
        ctx._owned.add(self)

    def _live(self) -> Any:
        if self._comm is None:
            raise error(-108, "the communicator is freed")
        return self._comm

    async def _run(self, f: Any, what: str, keep: tuple, result: Any,
                   given: Any = None) -> Any:
        """Await @f; the result is @result, or the tensor @given it views."""
        await self._ctx._await(f, what, keep=keep)
        return given if is_tensor(given) else result

    async def barrier(self) -> None:
        await self._ctx._await(lib.mw_barrier(self._live()), "barrier")

    async def broadcast(self, buf: Any, root: int = 0, dtype: Optional[str] = None) -> Any:
        a = _array(buf, "broadcast", True)
        f = lib.mw_broadcast(self._live(), _ptr(a), a.size, _dtype(a, dtype), root)
        return await self._run(f, "broadcast", (a,), a, buf)

    async def allreduce(self, array: Any, out: Any = None, op: str = "sum",
                        dtype: Optional[str] = None) -> Any:
        """Combine @array over all ranks into @out (default: in place)."""
        a = _array(array, "allreduce", out is None)
        o = a if out is None else _array(out, "allreduce out", True)
        if o.size != a.size:
            raise ValueError(f"allreduce: out holds {o.size} elements, not {a.size}")
        f = lib.mw_allreduce(self._live(), _ptr(a), _ptr(o), a.size, _dtype(a, dtype), _op(op))
        return await self._run(f, "allreduce", (a, o), o, array if out is None else out)

    async def reduce(self, array: Any, out: Any = None, op: str = "sum", root: int = 0,
                     dtype: Optional[str] = None) -> Any:
        """Combine @array over all ranks into @out at @root (default: in place)."""
        a = _array(array, "reduce", out is None)
        o = a if out is None else _array(out, "reduce out", True)
        f = lib.mw_reduce(self._live(), _ptr(a), _ptr(o), a.size, _dtype(a, dtype), _op(op),
                          root)
        return await self._run(f, "reduce", (a, o), o, array if out is None else out)

    async def allgather(self, array: Any, out: Any, dtype: Optional[str] = None) -> Any:
        """@out (size x len(array)) gets every rank's @array, rank order."""
        a, o = _array(array, "allgather", False), _array(out, "allgather out", True)
        if o.size != a.size * self.size:
            raise ValueError(f"allgather: out must hold {a.size * self.size} elements")
        f = lib.mw_allgather(self._live(), _ptr(a), _ptr(o), a.size, _dtype(a, dtype))
        return await self._run(f, "allgather", (a, o), o, out)

    async def reduce_scatter(self, array: Any, out: Any, op: str = "sum",
                             dtype: Optional[str] = None) -> Any:
        """@out gets this rank's block (block_of) of @array combined over ranks."""
        a, o = _array(array, "reduce_scatter", False), _array(out, "reduce_scatter out", True)
        if o.size != self.block_of(a.size)[1]:
            raise ValueError(f"reduce_scatter: out must hold {self.block_of(a.size)[1]} elements")
        f = lib.mw_reduce_scatter(self._live(), _ptr(a), _ptr(o), a.size, _dtype(a, dtype),
                                  _op(op))
        return await self._run(f, "reduce_scatter", (a, o), o, out)

    async def gather(self, array: Any, out: Any = None, root: int = 0,
                     dtype: Optional[str] = None) -> Any:
        """@out (at @root only: size x len(array)) gets every rank's @array."""
        a = _array(array, "gather", False)
        o = None if out is None else _array(out, "gather out", True)
        if self.rank == root and (o is None or o.size != a.size * self.size):
            raise ValueError(f"gather: the root's out must hold {a.size * self.size} elements")
        f = lib.mw_gather(self._live(), _ptr(a), _ptr(o), a.size, _dtype(a, dtype), root)
        return await self._run(f, "gather", (a, o), o, out)

    async def scatter(self, array: Any, out: Any, root: int = 0,
                      dtype: Optional[str] = None) -> Any:
        """Block r of @array (at @root only) goes to rank r's @out."""
        o = _array(out, "scatter out", True)
        a = None if array is None else _array(array, "scatter", False)
        if self.rank == root and (a is None or a.size != o.size * self.size):
            raise ValueError(f"scatter: the root's array must hold {o.size * self.size} elements")
        f = lib.mw_scatter(self._live(), _ptr(a), _ptr(o), o.size, _dtype(o, dtype), root)
        return await self._run(f, "scatter", (a, o), o, out)

    async def alltoall(self, array: Any, out: Any, dtype: Optional[str] = None) -> Any:
        """Block b of @array goes to rank b; block b of @out came from it."""
        a, o = _array(array, "alltoall", False), _array(out, "alltoall out", True)
        if a.size % self.size or o.size != a.size:
            raise ValueError("alltoall: array and out hold size x count elements each")
        f = lib.mw_alltoall(self._live(), _ptr(a), _ptr(o), a.size // self.size,
                            _dtype(a, dtype))
        return await self._run(f, "alltoall", (a, o), o, out)

    def block_of(self, count: int, rank: Optional[int] = None) -> tuple:
        """(offset, length) of block @rank (default: this one) of @count."""
        off, n = ffi.new(T.size_p), ffi.new(T.size_p)
        check(lib.mw_block_of(count, self.size, self.rank if rank is None else rank, off, n),
              "mw_block_of")
        return off[0], n[0]

    async def shrink(self, exclude: Sequence[int], **opts: Any) -> "Communicator":
        """The communicator of the other ranks without @exclude, after ranks
        were lost (mw_comm_shrink): every survivor calls it with the same
        ranks; this one is released.  Keyword options as communicator()'s
        (none: this one's)."""
        ex = ffi.new("int[]", list(exclude))
        o, keep = comm_opts(dict(opts)) if opts else (ffi.NULL, ())
        f = lib.mw_comm_shrink(self._live(), ex, len(exclude), o)
        if f != ffi.NULL and lib.mw_future_error(f) != -errno.EINVAL:
            self._disown()                 # released by the call; a bad list keeps it
        ctx = self._ctx
        return await ctx._await(f, "shrink", keep=(ex, keep),
                                convert=lambda v: Communicator(ctx, ffi.cast(T.comm_p, v)),
                                orphan=lambda comm: comm.free())

    def stats(self) -> dict:
        """connections (peers connected so far), scratch_bytes (registered
        for them), collectives and collective_failures (mw_comm_stats)."""
        st = ffi.new(T.comm_stats_p)
        check(lib.mw_comm_stats(self._live(), st), "mw_comm_stats")
        return fields(st)

    def _disown(self) -> Any:
        comm, self._comm = self._comm, None
        self._collected.detach()
        self._ctx._owned.discard(self)
        return comm

    async def close(self) -> None:
        """Leave together with the others (mw_comm_close): the collectives
        already issued finish, then this rank waits for every connected
        peer's goodbye, so nobody's last collective breaks.  Every rank
        calls it after its last collective.  Cancelling it leaves at once,
        as free() does."""
        if self._comm is not None:
            await self._ctx._await(lib.mw_comm_close(self._disown()), "close")

    def free(self) -> None:
        """Leave at once: this rank's pending collectives fail, and so do
        the peers' that still need this rank (close() leaves cleanly)."""
        if self._comm is not None:
            lib.mw_comm_free(self._disown())

    _drop = free

    async def __aenter__(self) -> "Communicator":
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            await self.close()
        else:
            self.free()


def _comm_collected(ctx: Context, comm: Any) -> None:
    """A Communicator collected without free(): free it from the loop."""
    def release() -> None:
        if ctx._ctx is not None:           # else the context's free released it
            lib.mw_comm_free(comm)
    ctx._reaper.later(release)


def comm_opts(opts: dict) -> tuple:
    """mw_comm_opts_t from keywords (conn={...} for the connections, job=
    a string): the struct, and what must live while the call reads it."""
    o = ffi.new(T.comm_opts_p)
    lib.mw_comm_opts_init(o)
    conn = opts.pop("conn", {})
    job = opts.pop("job", None)
    set_options(o, "communicator", opts)
    set_options(o.conn, "connection", conn)
    job_c = ffi.new(T.chars, job.encode()) if job is not None else ffi.NULL
    o.job = job_c                          # read during the call
    return o, (o, job_c)


async def create(ctx: Context, rank: Optional[int], peers: Optional[Sequence[str]],
                 opts: dict) -> Communicator:
    o, keep = comm_opts(opts)
    if peers is None:
        if rank is not None:
            raise TypeError("give both rank and peers, or neither (launcher environment)")
        f = lib.mw_comm_create_env(ctx._live(), o)
    else:
        cs = [ffi.new(T.chars, p.encode()) for p in peers]
        arr = ffi.new(T.strings, cs)
        f = lib.mw_comm_create(ctx._live(), rank, len(peers), arr, o)
    return await ctx._await(f, "communicator",
                            convert=lambda v: Communicator(ctx, ffi.cast(T.comm_p, v)),
                            orphan=lambda comm: comm.free())
