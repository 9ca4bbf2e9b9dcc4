"""A transfer agent: the shape an inference engine's KV connector already
speaks (NIXL's agent; Mooncake's transfer engine), each call awaitable and
nothing polling.  Agents find each other by name through the directory;
an agent shares named regions of registered memory; a prepared transfer
is a batch of (local block, remote region, offset) entries posted as often
as wanted, with a notification that reaches the peer only after the data
it announces."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, Iterable, List, Optional, Tuple

from ._batch import Batch
from ._conn import Connection, Remote
from ._dir import Directory, Peer, Publication

# What travels on a connection an agent made to a peer, as messages:
HELLO = b"meshwire-agent/1 "     # the first: the sender's name
NOTE = b"N"                      # N + k (4 bytes) + note: shown once immediate k came,
                                 # which rides on the last entry of a write transfer
PLAIN = b"P"                     # P + note: shown as it arrives


class _Inbox:
    """The notes of one peer's write transfers, held until their data is in
    place.  Note k is sent before its transfer, whose last entry carries
    immediate k: the note is shown once k came.  A transfer that failed or
    was cancelled never sends its immediate, and its note is dropped when a
    later one's arrives (immediates come in order).  k counts modulo 2**32
    (a note older than 2**31 transfers is not waited for)."""

    def __init__(self, show: Any):
        self._show = show
        self._held: Dict[int, bytes] = {}  # notes whose immediate is to come
        self._early: set = set()           # immediates come before their note
        self._last: Optional[int] = None   # the latest immediate

    @staticmethod
    def _before(a: int, b: int) -> bool:
        return 0 < (b - a) % (1 << 32) < 1 << 31

    def note(self, k: int, note: bytes) -> None:
        if k in self._early:
            self._early.discard(k)
            self._show(note)
        elif self._last is not None and self._before(k, self._last):
            pass                           # its transfer failed: a later one completed
        else:
            self._held[k] = note

    def immediate(self, k: int) -> None:
        if k in self._held:
            self._show(self._held.pop(k))
        else:
            self._early.add(k)
        self._last = k
        for old in [j for j in self._held if self._before(j, k)]:
            del self._held[old]            # their transfers failed


class Xfer:
    """A prepared transfer to one peer (Agent.prepare): post it with
    Agent.transfer as often as wanted; close() drops it."""

    def __init__(self, peer: "RemoteAgent", batch: Batch):
        self.peer, self._batch = peer, batch
        self.read = batch.read

    def __len__(self) -> int:
        return len(self._batch)

    def close(self) -> None:
        self._batch.close()

    def __enter__(self) -> "Xfer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RemoteAgent:
    """A peer agent (Agent.connect): its name, its regions by name, and the
    connection the transfers to it take."""

    def __init__(self, name: str, peer: Peer):
        self.name, self.conn, self.regions = name, peer.conn, peer.regions
        self._next = 0                     # the next write transfer's immediate

    def __repr__(self) -> str:
        return f"<meshwire.RemoteAgent {self.name} regions {sorted(self.regions)}>"


class Agent:
    """A transfer agent named @name in directory @d (Agent.start): register()
    the regions to share, start(), then connect() to peers by name,
    prepare() transfers and transfer() them; ``async for peer, msg in
    agent.notifications()`` takes what peers announced.  ``async with``
    closes it: its name leaves the directory, its connections close."""

    def __init__(self, d: Directory, name: str, listen: str, tag: Optional[str],
                 conn_opts: Dict[str, Any]):
        self._d, self.name, self._tag = d, name, tag
        self._ctx = d._ctx
        self._listen, self._conn_opts = listen, conn_opts
        self._shares: Dict[str, Any] = {}
        self._peers: Dict[str, RemoteAgent] = {}
        self._connecting: Dict[str, asyncio.Future] = {}
        self._pub: Optional[Publication] = None
        self._notifs: asyncio.Queue = asyncio.Queue()
        self._tasks: set = set()
        self._accepted: List[Connection] = []
        self._imms: Dict[int, AsyncIterator[int]] = {}   # accepted, not yet taken

    # --- memory and the name ------------------------------------------------

    def register(self, name: str, buf: Any) -> None:
        """Share @buf (memory from Context.alloc or Context.tensor, or any
        buffer or CPU tensor: registered) as region @name with every peer
        that connects.  Before start()."""
        if self._pub is not None:
            raise RuntimeError("register() the regions before start(): peers read them "
                               "from the directory entry")
        if name in self._shares:
            raise ValueError(f"region {name!r} is registered already")
        self._shares[name] = buf

    async def start(self) -> "Agent":
        """Listen, and publish the name with the regions."""
        self._pub = await self._d.publish(self.name, listen=self._listen, tag=self._tag,
                                          shares=self._shares, on_accept=self._take_imms,
                                          **self._conn_opts)
        self._spawn(self._accept_all(self._pub))
        return self

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _take_imms(self, conn: Connection) -> None:
        """At once, as the connection is accepted: its peer's first
        transfer may come before the loop runs _accept_all."""
        self._imms[id(conn)] = conn.immediates()

    async def _accept_all(self, pub: Publication) -> None:
        async for conn in pub:
            self._accepted.append(conn)
            self._spawn(self._receive(conn, self._imms.pop(id(conn))))

    async def _receive(self, conn: Connection, imms: AsyncIterator[int]) -> None:
        """The notes of a peer that connected to us: its first message names
        it; write transfers' notes wait for their immediates."""
        try:
            first = bytes(await conn.recv())
        except OSError:
            return
        if not first.startswith(HELLO):
            conn.abort()                   # not an agent: nothing of it is taken
            return
        name = first[len(HELLO):].decode(errors="replace")
        inbox = _Inbox(lambda note: self._notifs.put_nowait((name, note)))
        self._spawn(self._immediates(imms, inbox))
        try:
            while True:
                msg = bytes(await conn.recv())
                if msg[:1] == NOTE and len(msg) >= 5:
                    inbox.note(int.from_bytes(msg[1:5], "little"), msg[5:])
                elif msg[:1] == PLAIN:
                    self._notifs.put_nowait((name, msg[1:]))
                else:
                    conn.abort()           # not the protocol: the peer is cut off
                    return
        except OSError:
            return                         # the connection ended: so do its notes

    @staticmethod
    async def _immediates(imms: AsyncIterator[int], inbox: _Inbox) -> None:
        async for k in imms:
            inbox.immediate(k)

    # --- peers ----------------------------------------------------------------

    async def connect(self, name: str) -> RemoteAgent:
        """The peer agent published as @name, connected (once: later calls
        return the same)."""
        if name in self._peers:
            return self._peers[name]
        if name not in self._connecting:
            self._connecting[name] = asyncio.ensure_future(self._connect(name))
        try:
            return await asyncio.shield(self._connecting[name])
        finally:
            if self._connecting.get(name) is not None and self._connecting[name].done():
                self._connecting.pop(name, None)

    def forget(self, name: str) -> None:
        """Drop peer @name (it left the directory): its connection is
        aborted, transfers on it fail, and a later connect() makes a new one
        (to the process published under that name then)."""
        remote = self._peers.pop(name, None)
        if remote is not None:
            remote.conn.abort()

    async def _connect(self, name: str) -> RemoteAgent:
        peer = await self._d.connect(name, **self._conn_opts)
        try:
            await peer.conn.send(HELLO + self.name.encode())
        except BaseException:
            peer.conn.abort()
            raise
        remote = RemoteAgent(name, peer)
        self._peers[name] = remote
        return remote

    # --- transfers ------------------------------------------------------------

    def prepare(self, peer: RemoteAgent, local: Iterable[Any],
                remote: Iterable[Tuple[str, int]], *, read: bool = False) -> Xfer:
        """A transfer of local blocks to (or, @read, from) @peer's regions:
        entry i moves all of local[i] to region remote[i][0] at offset
        remote[i][1].  Every entry is checked now (bounds, memory)."""
        local, remote = list(local), list(remote)
        if len(local) != len(remote):
            raise ValueError(f"prepare: {len(local)} local blocks, {len(remote)} remote ones")
        entries = []
        for i, (buf, (region, offset)) in enumerate(zip(local, remote)):
            r: Optional[Remote] = peer.regions.get(region)
            if r is None:
                raise KeyError(f"entry {i}: {peer.name} shares no region {region!r} "
                               f"(it shares {sorted(peer.regions)})")
            entries.append((buf, r, offset))
        return Xfer(peer, peer.conn.batch(entries, read=read))

    async def transfer(self, xfer: Xfer, notif: Optional[bytes] = None) -> None:
        """Carry out @xfer; with @notif, the peer's notifications() get it
        once all of the data is in place, never before, and never for a
        transfer that failed or was cancelled.  A write's note travels
        ahead and is shown when the immediate riding on the transfer's last
        entry arrives (no round trip); a read's is sent once the data was
        read (the peer may then reuse its memory).  A failed transfer's
        OSError has ``done`` (see Batch.post)."""
        if notif is None or xfer.read:
            await xfer._batch.post()
            if notif is not None:
                await xfer.peer.conn.send(PLAIN + notif)
            return
        peer = xfer.peer
        k, peer._next = peer._next, (peer._next + 1) % (1 << 32)
        note = peer.conn._send(NOTE + k.to_bytes(4, "little") + notif)
        try:
            post, done = xfer._batch._start(k)
        except BaseException:
            note.close()                   # sent: shown only if a later k is missing it
            raise
        # both to their end, so that done is read once the post is over
        got = await asyncio.gather(post, note, return_exceptions=True)
        failed = next((r for r in got if isinstance(r, BaseException)), None)
        if failed is not None:
            if isinstance(failed, OSError):
                failed.done = done[0]
            raise failed

    async def send_notif(self, peer: RemoteAgent, msg: bytes) -> None:
        """A notification with no transfer."""
        await peer.conn.send(PLAIN + msg)

    def notifications(self) -> AsyncIterator[Tuple[str, bytes]]:
        """(peer name, message) for every notification, in each peer's
        order: ``async for peer, msg in agent.notifications()``."""
        return self._next_notif()

    async def _next_notif(self) -> AsyncIterator[Tuple[str, bytes]]:
        while True:
            got = await self._notifs.get()
            if got is None:
                self._notifs.put_nowait(None)
                return
            yield got

    # --- the end ----------------------------------------------------------------

    async def close(self) -> None:
        """Leave the directory and close every connection, once what is
        under way on them finished; notifications() ends."""
        if self._pub is not None:
            self._pub = None
            try:
                await self._d.unpublish(self.name)
            except OSError:
                pass                       # the directory closed first: gone with it
        for t in list(self._tasks):
            t.cancel()
        conns = [p.conn for p in self._peers.values()] + self._accepted
        self._peers.clear()
        self._accepted = []
        # gracefully: what is under way on them finishes first
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        self._notifs.put_nowait(None)

    async def __aenter__(self) -> "Agent":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

