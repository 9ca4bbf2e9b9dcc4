"""The context's metrics for prometheus_client (Debian's
python3-prometheus-client): ``REGISTRY.register(meshwire.Collector(ctx))``
and every scrape includes them, served by an aiohttp handler on the loop
(``generate_latest()``) or by prometheus_client's own HTTP thread."""
from __future__ import annotations

import concurrent.futures
import threading
import weakref
from typing import Any, Iterator


class Collector:
    """A prometheus_client collector of @ctx's metrics (Context.metrics).
    On the loop's thread it reads them at once; from another thread (the
    client's start_http_server) it asks the loop and waits up to
    @timeout seconds (a loop blocked that long yields nothing for this
    scrape).  A closed or collected context yields nothing."""

    def __init__(self, ctx: Any, timeout: float = 5.0):
        self._ctx = weakref.ref(ctx)
        self.timeout = timeout

    def _text(self) -> str:
        ctx = self._ctx()
        if ctx is None or ctx._ctx is None or ctx._closing:
            return ""
        if threading.get_ident() == ctx._reaper._thread:
            return ctx.metrics()
        done: concurrent.futures.Future = concurrent.futures.Future()

        def read() -> None:
            try:
                done.set_result(ctx.metrics() if ctx._ctx is not None else "")
            except BaseException as e:     # handed to the scraping thread
                done.set_exception(e)
        try:
            ctx._loop.call_soon_threadsafe(read)
            return done.result(timeout=self.timeout)
        except (RuntimeError, concurrent.futures.TimeoutError):
            return ""                      # the loop is closed, or blocked

    def collect(self) -> Iterator[Any]:
        from prometheus_client.parser import text_string_to_metric_families
        yield from text_string_to_metric_families(self._text())
