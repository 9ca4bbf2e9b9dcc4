"""The directory (mw_dir_*): processes publish themselves under names in a
store the cluster runs (Redis), others look them up, list a role, watch
peers join and leave, connect by name and form communicators -- no host
file, no address handed around by hand."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._conn import Connection, Remote
from ._context import Context, set_options
from ._lib import T, check, error, ffi, lib
from ._release import callbacks, finalize

EVENTS = {lib.MW_DIR_JOINED: "joined", lib.MW_DIR_LEFT: "left", lib.MW_DIR_SYNCED: "synced",
          lib.MW_DIR_LOST: "lost"}


def _str(p: Any) -> str:
    return ffi.string(p).decode(errors="replace") if p != ffi.NULL else ""


class Entry:
    """A published entry as read from the store: its name, the addresses
    to connect to, its tag and instance (new per publication), whether
    connections to it start with its region table (``serves``), and the
    regions it shares (name -> bytes)."""

    __slots__ = ("name", "addrs", "tag", "instance", "serves", "regions")

    def __init__(self, e: Any):
        self.name, self.addrs, self.tag = _str(e.name), _str(e.addrs), _str(e.tag)
        self.instance, self.serves = e.instance, bool(e.serves)
        self.regions: Dict[str, int] = {_str(e.regions[i].name): e.regions[i].len
                                        for i in range(e.nregions)}

    def __repr__(self) -> str:
        return (f"<meshwire.Entry {self.name} at {self.addrs} instance {self.instance:#x}"
                f"{' tag ' + repr(self.tag) if self.tag else ''}"
                f"{' regions ' + repr(self.regions) if self.regions else ''}>")


def _entries(value: Any) -> List[Entry]:
    lp = ffi.cast(T.dir_list_p, value)
    try:
        return [Entry(lp.e[i]) for i in range(lp.n)]
    finally:
        lib.mw_dir_list_free(lp)


class Peer:
    """A connection made by name (Directory.connect) and the regions its
    peer shares, by name, as Remotes for that connection."""

    __slots__ = ("conn", "regions")

    def __init__(self, conn: Connection, regions: Dict[str, Remote]):
        self.conn, self.regions = conn, regions

    def __repr__(self) -> str:
        return f"<meshwire.Peer {self.conn!r} regions {sorted(self.regions)}>"


@ffi.callback("void(mw_directory_t *, int, const mw_dir_entry_t *, void *)")
def _on_watch(d: Any, event: int, e: Any, arg: Any) -> None:
    w: Optional[Watch] = callbacks.get(arg)
    if w is not None:
        w._events.put_nowait((EVENTS.get(event, event), Entry(e) if e != ffi.NULL else None))


class Watch:
    """``async for event, entry in directory.watch(prefix)``: "joined"
    (entry) for each entry present, then "synced" (None), then every
    change as the store reports it -- "joined", "left" (the entry's last
    value), "lost" (the store is away until the next "synced").  close()
    (or the end of ``async with``) ends the iteration."""

    def __init__(self, d: "Directory", prefix: str):
        self._d = d
        self._events: asyncio.Queue = asyncio.Queue()
        self._key = callbacks.add(self)
        rc = lib.mw_dir_watch(d._live(), prefix.encode(), _on_watch, callbacks.arg(self._key))
        if rc < 0:
            callbacks.forget(self._key)
            check(rc, f"watch {prefix!r}")
        self._id: Optional[int] = rc
        d._watches.add(self)

    def __aiter__(self) -> "Watch":
        return self

    async def __anext__(self) -> Tuple[str, Optional[Entry]]:
        if self._id is None and self._events.empty():
            raise StopAsyncIteration
        got = await self._events.get()
        if got is None:
            self._events.put_nowait(None)
            raise StopAsyncIteration
        return got

    def close(self) -> None:
        if self._id is not None:
            wid, self._id = self._id, None
            callbacks.forget(self._key)
            self._d._watches.discard(self)
            if self._d._d is not None:
                lib.mw_dir_unwatch(self._d._d, wid)
            self._events.put_nowait(None)

    async def __aenter__(self) -> "Watch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


@ffi.callback("void(mw_listener_t *, mw_conn_t *, void *)")
def _on_accept(l: Any, c: Any, arg: Any) -> None:
    pub: Optional[Publication] = callbacks.get(arg)
    if pub is None or pub._d._d is None:
        lib.mw_conn_abort(c)
        return
    try:
        conn = Connection(pub._d._ctx, c)
    except Exception as e:
        lib.mw_conn_abort(c)
        pub._accepted.put_nowait(e)
        return
    try:
        if pub._on_accept is not None:
            pub._on_accept(conn)           # before the peer can use it
    except Exception as e:
        conn.abort()                       # (the Connection owns c now: abort once)
        pub._accepted.put_nowait(e)
        return
    pub._accepted.put_nowait(conn)


class Publication:
    """What Directory.publish made.  With a listener, ``async for conn in
    publication`` takes the connections accepted (each already has the
    shares exported on it and the region table sent); unpublish() or the
    directory's close() ends the iteration.  Shares stay lent (and, not
    from Context.alloc, registered) until then."""

    def __init__(self, d: "Directory", name: str, regs: list, keep: Any,
                 on_accept: Optional[Callable[[Connection], None]]):
        self._d, self.name, self._on_accept = d, name, on_accept
        self._regs, self._keep = regs, keep
        self._accepted: asyncio.Queue = asyncio.Queue()
        self._key = callbacks.add(self)

    def __aiter__(self) -> "Publication":
        return self

    async def __anext__(self) -> Connection:
        got = await self._accepted.get()
        if got is None:
            self._accepted.put_nowait(None)
            raise StopAsyncIteration
        if isinstance(got, BaseException):
            raise got
        return got

    def _end(self) -> None:
        callbacks.forget(self._key)
        for mr in self._regs:
            self._d._ctx._unreg(mr)
        self._regs.clear()
        self._keep = None
        self._accepted.put_nowait(None)


def _dir_collected(ctx: Context, d: Any) -> None:
    """A Directory collected without close(): free it from the loop."""
    def release() -> None:
        if ctx._ctx is not None:
            lib.mw_dir_free(d)
    ctx._reaper.later(release)


class Directory:
    """A client of the directory's store (Context.directory).  ``async
    with`` closes it: its entries are removed from the store, its watches
    end, connections already accepted stay."""

    def __init__(self, ctx: Context, d: Any, prefix: Any):
        self._ctx, self._d, self._prefix = ctx, d, prefix
        self._watches: set = set()
        self._pubs: Dict[str, Publication] = {}
        self._collected = finalize(self, _dir_collected, ctx, d)
        ctx._owned.add(self)

    def _live(self) -> Any:
        if self._d is None:
            raise error(-108, "the directory is closed")   # ESHUTDOWN
        return self._d

    def _future(self, f: Any, what: str, **kw: Any) -> Any:
        if f == ffi.NULL:                  # a handle not live: errno says why
            raise error(-(ffi.errno or 12), f"{what}: refused")
        return self._ctx._await(f, what, **kw)

    async def publish(self, name: str, *, listen: Optional[str] = None,
                      addrs: Optional[str] = None, tag: Optional[str] = None,
                      shares: Optional[Dict[str, Any]] = None,
                      on_accept: Optional[Callable[[Connection], None]] = None,
                      **conn_opts: Any) -> Publication:
        """Publish @name under a lease renewed until unpublish() or
        close().  With @listen ("*:0": every address, a free port), listen
        there and publish the addresses listened on: peers connect by name
        and get @shares (name -> buffer) exported, with a region table;
        iterate the Publication for the connections (@on_accept, if given,
        is called with each at once, before its peer can use it: to ask
        for its immediates()).  Without it, publish @addrs as they are.
        Keyword options are for accepted connections (connect()'s)."""
        if (listen is None) == (addrs is None):
            raise TypeError("publish: give listen (to accept) or addrs (to name), one of them")
        if shares and listen is None:
            raise TypeError("publish: shares are exported on accepted connections: give listen")
        d = self._live()
        keep: list = []

        def cstr(s: Optional[str]) -> Any:
            if s is None:
                return ffi.NULL
            p = ffi.new(T.chars, s.encode())
            keep.append(p)
            return p

        pub = ffi.new(T.dir_pub_p)
        pub.listen, pub.addrs, pub.tag = cstr(listen), cstr(addrs), cstr(tag)
        if conn_opts:
            o = ffi.new(T.conn_opts_p)
            lib.mw_conn_opts_init(o)
            set_options(o, "connection", conn_opts)
            keep.append(o)
            pub.conn = o
        regs: list = []
        items = list((shares or {}).items())
        try:
            if items:
                arr = ffi.new(T.dir_shares, len(items))
                for i, (sname, buf) in enumerate(items):
                    p, n, mr = self._ctx._local(buf, writable=True)
                    if mr is not None:
                        regs.append(mr)
                    keep.append((buf, p))
                    arr[i].name, arr[i].addr, arr[i].len = cstr(sname), p, n
                pub.shares, pub.nshares = arr, len(items)
                keep.append(arr)
        except BaseException:
            for mr in regs:
                self._ctx._unreg(mr)
            keep.clear()
            raise
        publication = Publication(self, name, regs, keep, on_accept)
        if listen is not None:
            pub.on_accept, pub.arg = _on_accept, callbacks.arg(publication._key)
        old = self._pubs.get(name)
        try:
            await self._future(lib.mw_dir_publish(d, name.encode(), pub), f"publish {name}",
                               keep=(pub, keep))
        except BaseException:
            publication._end()
            raise
        if old is not None:                # published again: the new instance replaces it
            old._end()
        self._pubs[name] = publication
        return publication

    async def unpublish(self, name: str) -> None:
        """Remove @name from the store now.  Its listener closes; the
        connections it accepted stay, and shares from Context.alloc stay
        exported on them, but other shares are registered no more: a peer's
        access to them fails (over RDMA, its connection with it)."""
        f = lib.mw_dir_unpublish(self._live(), name.encode())
        pub = self._pubs.pop(name, None)
        try:
            await self._future(f, f"unpublish {name}")
        finally:
            if pub is not None:
                pub._end()

    async def lookup(self, name: str) -> Entry:
        """The entry of @name (FileNotFoundError when absent)."""
        f = lib.mw_dir_lookup(self._live(), name.encode())
        return (await self._future(f, f"lookup {name}", convert=_entries))[0]

    async def list(self, prefix: str = "") -> List[Entry]:
        """Every entry whose name starts with @prefix, sorted by name."""
        f = lib.mw_dir_list(self._live(), prefix.encode())
        return await self._future(f, f"list {prefix!r}", convert=_entries)

    def watch(self, prefix: str = "") -> Watch:
        """Entries under @prefix as they come and go: see Watch."""
        return Watch(self, prefix)

    async def connect(self, name: str, **opts: Any) -> Peer:
        """Connect to the process published as @name, with its shared
        regions by name (connect()'s keyword options)."""
        o = ffi.new(T.conn_opts_p)
        lib.mw_conn_opts_init(o)
        set_options(o, "connection", opts)
        f = lib.mw_dir_connect(self._live(), name.encode(), o)
        return await self._future(f, f"connect {name}", convert=self._peer,
                                  orphan=lambda peer: peer.conn.abort())

    def _peer(self, value: Any) -> Peer:
        p = ffi.cast(T.dir_peer_p, value)
        try:
            regions = {_str(p.names[i]): Remote(p.regions[i].addr, p.regions[i].len,
                                                p.regions[i].rkey) for i in range(p.nregions)}
            return Peer(Connection(self._ctx, p.conn), regions)
        finally:
            lib.mw_dir_peer_free(p)

    async def communicator(self, job: str, rank: int, nranks: int, **opts: Any) -> Any:
        """A communicator of @nranks ranks found through the directory
        under @job (mw_dir_comm_create): every rank calls it with its own
        @rank; keyword options as Context.communicator's."""
        from ._comm import Communicator, comm_opts
        o, keep = comm_opts(opts)
        f = lib.mw_dir_comm_create(self._live(), job.encode(), rank, nranks, o)
        return await self._future(
            f, f"communicator {job}", keep=keep,
            convert=lambda v: Communicator(self._ctx, ffi.cast(T.comm_p, v)),
            orphan=lambda comm: comm.free())

    def agent(self, name: str, listen: str = "*:0", tag: Optional[str] = None,
              **conn_opts: Any) -> Any:
        """A transfer agent named @name here (see meshwire.Agent), published
        with @tag: register its regions, then ``await agent.start()``."""
        from ._agent import Agent
        return Agent(self, name, listen, tag, conn_opts)

    def close(self) -> None:
        """Remove this directory's entries (sent, not waited for), end its
        watches and publications; its pending calls fail."""
        if self._d is None:
            return
        d, self._d = self._d, None
        self._collected.detach()
        self._ctx._owned.discard(self)
        for w in list(self._watches):
            w.close()
        lib.mw_dir_free(d)
        for pub in self._pubs.values():
            pub._end()
        self._pubs.clear()

    _drop = close

    async def __aenter__(self) -> "Directory":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


async def open_directory(ctx: Context, url: Optional[str], opts: Dict[str, Any]) -> Directory:
    """Context.directory: see there."""
    o = ffi.new(T.dir_opts_p)
    lib.mw_dir_opts_init(o)
    prefix = opts.pop("prefix", None)
    set_options(o, "directory", opts)
    pc = ffi.new(T.chars, prefix.encode()) if prefix is not None else ffi.NULL
    if prefix is not None:
        o.prefix = pc
    uc = ffi.new(T.chars, url.encode()) if url is not None else ffi.NULL
    f = lib.mw_dir_open(ctx._live(), uc, o)
    return await ctx._await(f, f"directory {url or '(MW_DIRECTORY)'}", keep=(o, pc, uc),
                            convert=lambda v: Directory(ctx, ffi.cast(T.dir_p, v), pc),
                            orphan=lambda d: d.close())
