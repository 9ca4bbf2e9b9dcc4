"""Rails (mw_rails_*): one peer's memory reached over several connections
at once, one per NIC pair; a rail that fails is taken out and its slices
posted again on the others."""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

from ._conn import Connection, Remote
from ._lib import T, check, error, ffi, fields, lib
from ._release import finalize

RAIL_STATES = {lib.MW_RAIL_PROBING: "probing", lib.MW_RAIL_UP: "up", lib.MW_RAIL_DOWN: "down"}


def _rails_collected(ctx: Any, g: Any) -> None:
    """Rails collected without close(): free the group from the loop (no
    transfer is in flight: each holds the Rails)."""
    def release() -> None:
        if ctx._ctx is not None:
            lib.mw_rails_free(g)
    ctx._reaper.later(release)


class Rails:
    """A rail group (Context.rails): add() a connection and the peer's
    region as exported on it, once per NIC pair; write(), read() and post()
    spread over the rails that work.  The connections stay the caller's
    (one closed counts as a failed rail).  ``with ctx.rails() as g``
    closes it; one collected is freed."""

    def __init__(self, ctx: Any, slice_bytes: int):
        if not isinstance(slice_bytes, int) or slice_bytes < 0:
            raise ValueError(f"slice_bytes={slice_bytes!r}: bytes per slice, 0 for 1 MiB")
        self._ctx = ctx
        gp = ffi.new(T.rails_pp)
        check(lib.mw_rails_new(ctx._live(), slice_bytes, gp), "mw_rails_new")
        self._g = gp[0]
        self._conns: List[Connection] = []    # referenced while rails: not collected
        self._collected = finalize(self, _rails_collected, ctx, self._g)
        ctx._owned.add(self)

    def _live(self) -> Any:
        if self._g is None:
            raise error(-108, "the rail group is closed")   # ESHUTDOWN
        return self._g

    def __len__(self) -> int:
        return lib.mw_rails_count(self._g) if self._g is not None else 0

    def add(self, conn: Connection, remote: Remote) -> int:
        """A rail over @conn to @remote (the same region on every rail, as
        exported on that connection): its index.  Probed, then used."""
        if not isinstance(remote, Remote):
            raise TypeError(f"{remote!r} is not a meshwire.Remote")
        rail = check(lib.mw_rails_add(self._live(), conn._live(), remote._c()), "mw_rails_add")
        self._conns.append(conn)
        return rail

    def replace(self, rail: int, conn: Connection, remote: Remote) -> None:
        """Give rail @rail a new connection (after it went down, say)."""
        if not isinstance(remote, Remote):
            raise TypeError(f"{remote!r} is not a meshwire.Remote")
        check(lib.mw_rails_replace(self._live(), rail, conn._live(), remote._c()),
              "mw_rails_replace")
        self._conns.append(conn)

    # The async calls await what a plain function made: no frame that an
    # exception's traceback keeps holds a view of the caller's memory (a
    # cycle through one -- the exception kept by its handler -- once
    # crashed CPython's collector, clearing the view's buffer first).

    def _transfer(self, f: Any, what: str, keep: Any, regs: list) -> Any:
        """An awaitable for @f; @keep lent and @regs registered until
        meshwire is done with it."""
        def unreg() -> None:
            for mr in regs:
                self._ctx._unreg(mr)
        return self._ctx._await(f, what, keep=(self, keep), after=unreg)

    def _one(self, fn: Any, what: str, buf: Any, offset: int, read: bool) -> Any:
        g = self._live()
        p, n, mr = self._ctx._local(buf, writable=read)
        return self._transfer(fn(g, p, n, offset), what, (buf, p), [mr])

    async def write(self, buf: Any, offset: int = 0) -> None:
        """All of @buf to the region at @offset, over the rails."""
        await self._one(lib.mw_rails_write, "rails write", buf, offset, False)

    async def read(self, buf: Any, offset: int = 0) -> None:
        """len(@buf) bytes of the region at @offset into @buf."""
        await self._one(lib.mw_rails_read, "rails read", buf, offset, True)

    def _post(self, entries: Iterable[Tuple[Any, int]], read: bool) -> Any:
        g = self._live()
        rows: list = []
        regs: list = []
        keep: list = []
        try:
            for i, entry in enumerate(entries):
                if not (isinstance(entry, tuple) and len(entry) == 2):
                    raise TypeError(f"rails entry {i}: expected (buffer, offset), "
                                    f"not {type(entry).__name__}")
                if not isinstance(entry[1], int) or entry[1] < 0:
                    raise ValueError(f"rails entry {i}: offset={entry[1]!r} must be an int >= 0")
                p, n, mr = self._ctx._local(entry[0], writable=read)
                if mr is not None:
                    regs.append(mr)
                keep.append((entry[0], p))
                rows.append({"local": p, "len": n, "offset": entry[1], "remote": 0})
            if not rows:
                raise ValueError("a rails post needs at least one entry")
            es = ffi.new(T.batch_entries, rows)
        except BaseException:
            for mr in regs:
                self._ctx._unreg(mr)
            rows.clear()
            keep.clear()
            p = entry = None
            raise
        f = lib.mw_rails_post(g, lib.MW_DIR_READ if read else lib.MW_DIR_WRITE, es, len(rows))
        return self._transfer(f, "rails post", (keep, es), regs)

    async def post(self, entries: Iterable[Tuple[Any, int]], *, read: bool = False) -> None:
        """A batch over the rails: @entries are (buffer, offset in the
        region), sliced and spread like a transfer."""
        await self._post(entries, read)

    def set_stall(self, ms: int) -> None:
        """How long a rail may complete no slice while the others complete
        8 before the group judges it stalled, fails its connection and
        moves its slices to the others (10000 by default; 0: never)."""
        if not isinstance(ms, int) or not 0 <= ms < 1 << 32:
            raise ValueError(f"ms={ms!r}: milliseconds, 0 for never")
        check(lib.mw_rails_set_stall(self._live(), ms), "mw_rails_set_stall")

    def stats(self, rail: Optional[int] = None) -> Any:
        """Rail @rail's state ("probing", "up", "down"), device, counters
        and why it was last taken out; without @rail, a list of all."""
        if rail is None:
            return [self.stats(i) for i in range(len(self))]
        st = ffi.new(T.rail_stats_p)
        check(lib.mw_rails_stats(self._live(), rail, st), f"mw_rails_stats({rail})")
        out = fields(st)
        out["state"] = RAIL_STATES.get(out["state"], out["state"])
        return out

    def close(self) -> None:
        """Drop the group: its transfers are cancelled (their awaitables
        fail once their slices are back); the connections stay."""
        if self._g is None:
            return
        g, self._g = self._g, None
        self._collected.detach()
        self._ctx._owned.discard(self)
        lib.mw_rails_free(g)
        self._conns.clear()

    _drop = close

    def __enter__(self) -> "Rails":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<meshwire.Rails of {len(self)}{' (closed)' if self._g is None else ''}>"
