"""Coroutine tests run here, each once on the default asyncio loop and
once on uvloop (a plain hook: no plugin needed).  MW_TEST_LOOPS=asyncio
(a comma-separated list) runs them on those loops only: the test command's
run over RDMA in the soft-RoCE VM, where the loop's part is the same as on
the host's runs and only the transport under it differs."""
import asyncio
import inspect
import os
import socket
import subprocess
import time

import pytest
import uvloop

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
if os.environ.get("MW_TEST_LOOPS"):
    _asked = os.environ["MW_TEST_LOOPS"].split(",")
    _unknown = set(_asked) - set(LOOPS)
    if _unknown:
        raise pytest.UsageError(f"MW_TEST_LOOPS: no loop {', '.join(sorted(_unknown))} ({', '.join(LOOPS)})")
    LOOPS = {k: v for k, v in LOOPS.items() if k in _asked}


@pytest.fixture
def loop_kind(request):
    return request.param


def pytest_generate_tests(metafunc):
    if inspect.iscoroutinefunction(metafunc.function):
        metafunc.fixturenames.append("loop_kind")
        metafunc.parametrize("loop_kind", list(LOOPS), indirect=True)


def pytest_pyfunc_call(pyfuncitem):
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames
            if name != "loop_kind"}
    loop = LOOPS[pyfuncitem.callspec.params["loop_kind"]]()
    try:
        # names a hang (meson's timeout would only name the file): well
        # beyond the slowest test, the torch one at 65 s in a soft-RoCE VM
        # whose host also runs other work (its first import of torch too)
        loop.run_until_complete(asyncio.wait_for(pyfuncitem.obj(**args), 180))
    finally:
        loop.close()
    return True


def pytest_sessionfinish(session, exitstatus):
    """All skipped (no RDMA here): tell meson so (77), not "passed"."""
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if exitstatus == 0 and tr and tr.stats.get("skipped") and not tr.stats.get("passed"):
        session.exitstatus = 77


def _tied(argv):
    """@argv killed when this process dies, however it dies (meson's timeout
    too): util-linux's setpriv sets its parent-death signal."""
    setpriv = "/usr/bin/setpriv"
    return [setpriv, "--pdeathsig", "KILL", *argv] if os.access(setpriv, os.X_OK) else argv


def _redis(d, *config):
    """A redis-server (Debian's, as scripts/setup installs it) on a unix
    socket in directory @d, with @config options: (process, "unix:SOCK")."""
    server = "/usr/bin/redis-server"
    if not os.access(server, os.X_OK):
        pytest.fail("redis-server not installed (scripts/setup installs it)")
    sock = str(d / "redis.sock")
    p = subprocess.Popen(_tied([server, "--port", "0", "--unixsocket", sock, "--save", "",
                                "--appendonly", "no", "--dir", str(d), *config]),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(500):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock)
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return p, f"unix:{sock}"
        except OSError:
            time.sleep(0.01)
    p.terminate()
    p.wait()
    pytest.fail(f"redis-server did not answer on {sock} within 5 s")


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """The test module's own store, set up for meshwire by its owner
    (keyspace notifications on)."""
    p, url = _redis(tmp_path_factory.mktemp("redis"), "--notify-keyspace-events", "Kgx")
    try:
        yield url
    finally:
        p.terminate()
        p.wait()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _etcd(d):
    """An etcd (Debian's etcd-server, as scripts/setup installs it) on free
    loopback ports with its data in @d: (process, "etcd://127.0.0.1:PORT")."""
    server = "/usr/bin/etcd"
    if not os.access(server, os.X_OK):
        pytest.fail("etcd not installed (scripts/setup installs etcd-server)")
    port, peer = _free_port(), _free_port()
    client, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
    p = subprocess.Popen(_tied([server, "--name", "t", "--data-dir", str(d / "data"),
                                "--listen-client-urls", client, "--advertise-client-urls",
                                client, "--listen-peer-urls", peer_url,
                                "--initial-advertise-peer-urls", peer_url,
                                "--initial-cluster", f"t={peer_url}",
                                "--logger", "zap", "--log-level", "error"]),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ask = b"POST /v3/maintenance/status HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    for _ in range(1000):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(ask)
                if s.recv(16).startswith(b"HTTP/1.1 200"):
                    return p, f"etcd://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.01)
    p.terminate()
    p.wait()
    pytest.fail(f"etcd did not answer on port {port} within 10 s")


@pytest.fixture(scope="module", params=["redis", "etcd"])
def store_url(request, tmp_path_factory):
    """Each store the directory runs on: the module's own Redis (set up for
    meshwire by its owner), or its own etcd."""
    if request.param == "redis":
        yield request.getfixturevalue("redis_url")
        return
    p, url = _etcd(tmp_path_factory.mktemp("etcd"))
    try:
        yield url
    finally:
        p.terminate()
        p.wait()


@pytest.fixture
def stock_redis_url(tmp_path):
    """A store as Debian's package starts it: keyspace notifications off."""
    p, url = _redis(tmp_path)
    try:
        yield url
    finally:
        p.terminate()
        p.wait()


@pytest.fixture(scope="session")
def promtool():
    """Debian's promtool (scripts/setup unpacks it into deps/prometheus):
    a callable checking a metrics text, returning promtool's complaints."""
    tool = os.path.join(os.path.dirname(__file__), "..", "..", "deps", "prometheus", "promtool")
    if not os.access(tool, os.X_OK):
        pytest.fail(f"{tool} missing: scripts/setup (scripts/promtool) puts it there")

    def check(text):
        r = subprocess.run([tool, "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=60)
        return r.returncode, (r.stdout + r.stderr).decode()
    return check
