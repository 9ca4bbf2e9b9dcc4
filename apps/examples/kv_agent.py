#!/usr/bin/python3
"""kv_agent.py: KV-cache blocks moved between two processes by meshwire's
transfer agent, the shape of a disaggregated inference server's connector.

    kv_agent.py decode  DIRECTORY JOB [REQUESTS]
        share a KV pool (a bf16 torch tensor over registered memory) as
        JOB/decode/0, then take REQUESTS notes (default 8): each says which
        pool slots a request's blocks went to, and they are there already
    kv_agent.py prefill DIRECTORY JOB [REQUESTS]
        find JOB/decode/0 by name and write each request's blocks into
        its pool with one prepared transfer and a note

DIRECTORY is the store's URL ("redis://HOST" or "unix:PATH").  Nothing
polls: both loops sleep between completions.  The prefill side's loop is
the README's agent example, verbatim."""
import asyncio
import sys

import torch

import meshwire

LAYERS, HEADS, HEAD_DIM = 4, 8, 64          # one block: one token's K and V, all layers
BLOCK = 2 * LAYERS * HEADS * HEAD_DIM       # bf16 elements
SLOTS = 1024                                # the pool's blocks
TOKENS = 16                                 # tokens per request


def blocks_of(rid: int) -> torch.Tensor:
    """Request @rid's KV (what prefill computed): TOKENS blocks."""
    g = torch.Generator().manual_seed(rid)
    return torch.randn(TOKENS, BLOCK, generator=g).to(torch.bfloat16)


async def decode(url: str, job: str, requests: int) -> int:
    async with meshwire.Context() as ctx, await ctx.directory(url) as d:
        pool = ctx.tensor((SLOTS, BLOCK), torch.bfloat16)    # registered: shared as it is
        agent = d.agent(f"{job}/decode/0")
        agent.register("kv", pool)
        async with await agent.start():
            print("decode: listening", flush=True)
            got = 0
            async for peer, note in agent.notifications():
                rid, first = map(int, note.decode().split())
                ok = torch.equal(pool[first:first + TOKENS], blocks_of(rid))
                print(f"decode: request {rid} from {peer} in slots {first}.."
                      f"{first + TOKENS - 1}: {'in place' if ok else 'WRONG'}", flush=True)
                if not ok:
                    return 1
                got += 1
                if got == requests:
                    return 0
    return 1


async def prefill(url: str, job: str, requests: int) -> int:
    async with meshwire.Context() as ctx, await ctx.directory(url) as d:
        async with await d.agent(f"{job}/prefill/0").start() as agent:
            # README: begin
            decoder = await agent.connect(f"{job}/decode/0")       # by name, via the directory
            for rid in range(requests):
                kv = blocks_of(rid)                                 # this request's KV blocks
                first = rid * TOKENS % SLOTS                        # where decode wants them
                slots = [("kv", (first + t) * BLOCK * 2) for t in range(TOKENS)]
                with agent.prepare(decoder, list(kv), slots) as xfer:   # checked once
                    await agent.transfer(xfer, f"{rid} {first}".encode())   # note after data
            # README: end
            print(f"prefill: {requests} requests sent", flush=True)
    return 0


def main() -> int:
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in ("decode", "prefill"):
        print(__doc__, file=sys.stderr)
        return 2
    role, url, job = sys.argv[1:4]
    requests = int(sys.argv[4]) if len(sys.argv) == 5 else 8
    return asyncio.run((decode if role == "decode" else prefill)(url, job, requests))


if __name__ == "__main__":
    sys.exit(main())
