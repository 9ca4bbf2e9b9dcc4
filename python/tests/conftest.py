"""Coroutine tests run here, each once on the default asyncio loop and
once on uvloop (a plain hook: no plugin needed)."""
import asyncio
import inspect

import pytest
import uvloop

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


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
        loop.run_until_complete(asyncio.wait_for(pyfuncitem.obj(**args), 60))   # names a hang
    finally:
        loop.close()
    return True


def pytest_sessionfinish(session, exitstatus):
    """All skipped (no RDMA here): tell meson so (77), not "passed"."""
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if exitstatus == 0 and tr and tr.stats.get("skipped") and not tr.stats.get("passed"):
        session.exitstatus = 77
