"""What prefill.py and decode.py share: the page layout and its contents.

Page i of the prefill pool holds (j + i) mod 256 at byte j: cheap to make,
and every byte of every page can be checked on the decode side."""
import numpy as np
from aiohttp import web


def pattern(page_bytes: int) -> np.ndarray:
    return (np.arange(page_bytes) % 256).astype(np.uint8)


def fill(pool: np.ndarray) -> None:
    base = pattern(pool.shape[1])
    for i in range(pool.shape[0]):
        np.add(base, np.uint8(i % 256), out=pool[i])


def page_ok(page: np.ndarray, i: int, base: np.ndarray) -> bool:
    return bool(np.array_equal(page, base + np.uint8(i % 256)))


def pages_of(request: int, npages: int, count: int) -> list:
    """The pages request @request needs: @count of them, scattered."""
    return np.random.default_rng(request).choice(npages, count, replace=False).tolist()


async def serve_http(app: web.Application, addr: str) -> None:
    """Serve @app at "HOST:PORT" (no access log: it would cost more than
    the requests)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = addr.rsplit(":", 1)
    await web.TCPSite(runner, host, int(port)).start()
