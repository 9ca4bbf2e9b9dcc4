"""meshwire for asyncio: RDMA connections, one-sided transfers and
collectives whose completions wake the running event loop, with no thread
and no polling.

    import asyncio, meshwire

    async def main():
        async with meshwire.Context() as ctx:
            conn = await ctx.connect("10.0.0.2:7470")
            await conn.send(b"hello")
            msg = await conn.recv()          # a memoryview, no copy

Options are keywords named as meshwire.h's option fields:
Context(log_level="info"), ctx.connect(addr, timeout_ms=2000,
transport="rdma").  Errors are OSError subclasses chosen by errno
(ConnectionRefusedError, TimeoutError, ConnectionResetError...), with
meshwire's message.  README.md's "Python (asyncio)" says more.
"""
from ._agent import Agent, RemoteAgent, Xfer
from ._batch import Batch
from ._comm import DTYPES, OPS, Communicator
from ._conn import Connection, Listener, Remote
from ._context import Context
from ._dir import Directory, Entry, Peer
from ._lib import ffi, lib
from ._metrics import Collector
from ._rails import Rails

__version__ = ffi.string(lib.mw_version()).decode()
__all__ = ["Context", "Connection", "Listener", "Remote", "Batch", "Rails", "Directory",
           "Entry", "Peer", "Agent", "RemoteAgent", "Xfer", "Collector", "Communicator",
           "DTYPES", "OPS"]
