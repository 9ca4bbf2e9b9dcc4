#!/usr/bin/python3
"""hello.py: hello.c in Python on asyncio, speaking the same protocol, so
either end may be C or Python.

    hello.py -l [ADDR][:PORT]   wait for one client, export 1 MiB to it, send
                                it the descriptor, and check what it wrote
    hello.py HOST[:PORT]        connect, write 1 MiB into the server's export
                                with one-sided RDMA, then say so in a message

Default port 7470.  The loop sleeps between completions: meshwire's one
descriptor is a reader of the running loop.  The client's part is the
README's Python example, verbatim."""
import asyncio
import sys

import numpy as np

import meshwire

SIZE = 1 << 20


async def client(addr: str) -> int:
    # README: begin
    async with meshwire.Context() as ctx:                  # joins the running loop
        async with await ctx.connect(addr) as conn:         # closed at the end
            remote = meshwire.Remote.from_bytes(await conn.recv())   # the server's export
            buf = ctx.alloc(SIZE)                           # registered memory, a buffer
            np.frombuffer(buf, np.uint8)[:] = ord("x")     # no copy: numpy views it
            await conn.write(buf, remote)                   # one-sided, bounds-checked
            await conn.send(b"done\0")                      # messages: any size, in order
    # README: end
    print(f"hello.py: wrote {SIZE} bytes into {addr}'s memory")
    return 0


async def server(addr: str) -> int:
    async with meshwire.Context() as ctx:
        async with ctx.listen(addr) as listener:
            print(f"hello.py: listening on port {listener.port}", flush=True)
            conn = await listener.accept()
        mem = np.frombuffer(ctx.alloc(SIZE), np.uint8)
        mem[:] = 0
        await conn.send(bytes(conn.export(mem)))
        said = bytes(await conn.recv()).rstrip(b"\0").decode(errors="replace")
        good = int(np.argmin(mem == ord("x"))) if not (mem == ord("x")).all() else SIZE
        print(f'hello.py: client said "{said}"; {good} of {SIZE} bytes written')
        await conn.close()
    return 0 if good == SIZE else 1


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "-l":
        return asyncio.run(server(sys.argv[2]))
    if len(sys.argv) == 2 and sys.argv[1] not in ("-h", "--help"):
        try:
            return asyncio.run(client(sys.argv[1]))
        except OSError as e:
            print(f"hello.py: {e.strerror}", file=sys.stderr)
            return 1
    print("usage: hello.py -l [ADDR][:PORT]   (server)\n"
          "       hello.py HOST[:PORT]        (client)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
