"""cluster.py: disagg.py's processes on one machine -- a redis-server for
the directory, the prefill and decode workers -- started, stopped and
asked as the test and the bench need them."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import tempfile
from typing import Dict, List, Optional

from aiohttp import ClientSession

HERE = os.path.dirname(os.path.abspath(__file__))


class Proc:
    """A child process whose output lines are shown (prefixed) and can be
    waited for."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process):
        self.name, self.proc, self.lines = name, proc, []
        self._seen = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                print(f"[{self.name}] {line}", file=sys.stderr, flush=True)
                self._seen.set()
        finally:
            self._seen.set()                  # the end is news too

    async def wait_for(self, pattern: str, timeout: float, start: int = 0) -> re.Match:
        """The first line from line @start on that matches @pattern."""
        async def look() -> re.Match:
            i = start
            while True:
                for line in self.lines[i:]:
                    m = re.search(pattern, line)
                    if m:
                        return m
                i = len(self.lines)
                if self.proc.returncode is not None or self._reader.done():
                    raise RuntimeError(f"{self.name} ended ({self.proc.returncode}) "
                                       f"before printing /{pattern}/")
                self._seen.clear()
                await self._seen.wait()
        return await asyncio.wait_for(look(), timeout)

    async def stop(self, timeout: float = 60) -> int:
        """SIGTERM, and its exit status."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(self.proc.wait(), timeout)
        await self._reader
        return rc


async def spawn(name: str, *args: str, env: Optional[Dict[str, str]] = None) -> Proc:
    p = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=dict(os.environ, **(env or {})))
    return Proc(name, p)


class Cluster:
    """Start with ``async with Cluster(job) as c``: a redis-server; then
    start_prefill() and start_decode(ID) as needed."""

    def __init__(self, job: str, startup_s: float = 300, env: Optional[Dict[str, str]] = None):
        self.job, self.startup_s, self.env = job, startup_s, env
        self.decoders: Dict[str, Proc] = {}
        self.prefill: Optional[Proc] = None
        self.url = ""
        self.http: Optional[ClientSession] = None
        self.base = ""

    async def __aenter__(self) -> "Cluster":
        self._tmp = tempfile.TemporaryDirectory(prefix="disagg-")
        sock = os.path.join(self._tmp.name, "redis.sock")
        self.redis = await spawn("redis", "/usr/bin/redis-server", "--port", "0",
                                 "--unixsocket", sock, "--save", "", "--appendonly", "no",
                                 "--loglevel", "warning",
                                 "--notify-keyspace-events", "Kgx")
        for _ in range(100):
            if os.path.exists(sock):
                break
            await asyncio.sleep(0.1)
        self.url = f"unix:{sock}"
        self.http = ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for p in list(self.decoders.values()) + [self.prefill]:
            if p is not None and p.proc.returncode is None:
                p.proc.kill()
                await p.proc.wait()
        await self.http.close()
        self.redis.proc.kill()
        await self.redis.proc.wait()
        self._tmp.cleanup()

    def _script(self, *args: str) -> List[str]:
        return [sys.executable, os.path.join(HERE, "disagg.py"), *args]

    async def start_prefill(self) -> None:
        self.prefill = await spawn("prefill", *self._script("prefill", self.url, self.job, "0"),
                                   env=self.env)
        m = await self.prefill.wait_for(r"prefill: (http://\S+)", self.startup_s)
        self.base = m.group(1)

    async def start_decode(self, wid: str, pages: Optional[int] = None) -> Proc:
        """Decode worker @wid, serving; once the prefill (if started) took it."""
        args = ["decode", self.url, self.job, wid] + ([str(pages)] if pages else [])
        seen = len(self.prefill.lines) if self.prefill else 0
        p = self.decoders[wid] = await spawn(f"decode {wid}", *self._script(*args), env=self.env)
        await p.wait_for(r"serving", self.startup_s)
        if self.prefill is not None:
            await self.prefill.wait_for(rf"worker {self.job}/decode/{wid} joined", 60, seen)
        return p

    async def stop_decode(self, wid: str) -> int:
        return await self.decoders.pop(wid).stop()

    async def _post(self, path: str, body: dict) -> dict:
        async with self.http.post(f"{self.base}{path}", json=body) as r:
            answer = await r.json()
            if r.status != 200:
                raise RuntimeError(f"POST {path}: HTTP {r.status}: {answer}")
            return answer

    async def generate(self, prompt: str, tokens: int, via: str = "meshwire") -> dict:
        return await self._post("/generate", {"prompt": prompt, "tokens": tokens, "via": via})

    async def get(self, path: str) -> str:
        async with self.http.get(f"{self.base}{path}") as r:
            if r.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {r.status}")
            return await r.text()

    async def move(self, via: str, requests: int, length: int) -> dict:
        return await self._post("/move", {"via": via, "requests": requests, "len": length})
