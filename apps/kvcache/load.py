#!/usr/bin/python3
"""load.py: N requests to decode.py, C at a time; checks every answer and
prints one line: requests, seconds, requests/s, MiB/s of KV pages, latency
p50/p99 in ms, pages found bad.  Exit 1 if any page was bad or any
request failed.

    load.py URL N C [PAGES_PER_REQUEST PAGE_BYTES]
"""
import asyncio
import sys
import time

import aiohttp


async def main():
    url, n, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    per, page = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (64, 65536)
    lat, bad, failed = [], 0, 0
    sem = asyncio.Semaphore(c)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def one(i):
            nonlocal bad, failed
            async with sem:
                t0 = time.monotonic()
                try:
                    async with http.get(f"{url}/request/{i}") as r:
                        body = await r.json()
                    bad += len(body["bad"])
                    failed += body["pages"] != per
                except (aiohttp.ClientError, KeyError, ValueError) as e:
                    print(f"load: request {i}: {e}", file=sys.stderr)
                    failed += 1
                lat.append(time.monotonic() - t0)
        t0 = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        secs = time.monotonic() - t0
    lat.sort()
    print(f"requests {n} seconds {secs:.2f} req_per_s {n / secs:.1f} "
          f"MiB_per_s {n * per * page / secs / 2**20:.1f} p50_ms {lat[len(lat) // 2] * 1e3:.1f} "
          f"p99_ms {lat[int(len(lat) * 0.99) - 1] * 1e3:.1f} bad_pages {bad} failed {failed}")
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
