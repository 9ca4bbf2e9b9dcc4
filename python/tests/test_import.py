"""`import meshwire` the ways a user does it, each in a new process whose
environment holds PATH and little else (as env -i makes it), with torch and numpy
imported first, last or not at all (torch takes glibc's static TLS reserve,
which a library with initial-exec TLS loaded later would need): Debian's
/usr/bin/python3 on the build tree, a C program embedding Python, and a venv
after `pip install` of python/.  No GLIBC_TUNABLES, LD_PRELOAD or variable of
meshwire's.  Each process then uses jemalloc's arena (ctx.alloc), whose
thread-local storage is the point."""
import functools
import json
import os
import subprocess

import pytest

BUILD_PY = os.environ["MW_TEST_BUILD_PYTHON"]      # build/python
EMBED = os.environ["MW_TEST_EMBED"]                # the embedding program, or ""
SOURCE_PY = os.environ["MW_TEST_SOURCE_PYTHON"]    # python/, for pip install
UNINSTALLED = os.environ["MW_TEST_UNINSTALLED"]    # build/meson-uninstalled
LIB = os.environ["MW_TEST_LIB"]                    # build/src/libmeshwire.so.0.1.0
VERSION = os.environ["MW_TEST_VERSION"]
BUILD_ROOT = os.path.dirname(UNINSTALLED)

USE = """
import asyncio
async def use():
    async with meshwire.Context() as ctx:
        buf = ctx.alloc(1 << 20)              # from the jemalloc arena
        buf[:4] = b"mesh"
        assert bytes(buf[:4]) == b"mesh"
        del buf
asyncio.run(use())
print(meshwire.__version__)
"""
ORDERS = ["import meshwire", "import torch, meshwire", "import numpy, torch, meshwire",
          "import meshwire, torch"]


def run(argv, env, timeout=120):
    """@argv with exactly @env (plus PATH): its stdout, or the failure shown."""
    r = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"{argv} failed ({r.returncode}):\n{r.stdout}{r.stderr}"
    return r.stdout


@functools.cache
def need_torch():
    r = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True)
    assert r.returncode == 0, "python3-torch is not installed (scripts/setup installs it)"


@pytest.mark.parametrize("imports", ORDERS)
def test_debians_python3_from_the_build_tree(imports):
    if "torch" in imports:
        need_torch()
    out = run(["/usr/bin/python3", "-c", imports + USE], {"PYTHONPATH": BUILD_PY})
    assert out.strip() == VERSION


@pytest.mark.parametrize("imports", ["import meshwire", "import torch, meshwire"])
def test_a_c_program_embedding_python(imports):
    assert EMBED, "not built: Python's embedding library is missing (scripts/setup installs python3-dev)"
    if "torch" in imports:
        need_torch()
    out = run([EMBED, imports + USE], {"PYTHONPATH": BUILD_PY})
    assert out.strip() == VERSION


def installed_pc():
    """Whether pkg-config finds an installed meshwire by itself."""
    return subprocess.run(["pkg-config", "--exists", "meshwire"],
                          env={"PATH": os.environ["PATH"]}).returncode == 0


def test_a_venv_after_pip_install(tmp_path):
    """As the README: a venv on Debian's python3 seeing its packages, pip
    install of python/ with nothing downloaded (--no-index makes sure), for
    the library pkg-config finds, else the checkout's build/.  The tree under
    test is that build/ (no variable, as the README) or another one, named by
    PKG_CONFIG_PATH (installed libraries may exist on this machine)."""
    need_torch()
    venv = tmp_path / "v"
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], {})
    env = {"HOME": str(tmp_path), "PIP_NO_INPUT": "1"}
    checkout_build = os.path.join(os.path.dirname(os.path.abspath(SOURCE_PY)), "build")
    if os.path.realpath(BUILD_ROOT) != os.path.realpath(checkout_build) or installed_pc():
        env["PKG_CONFIG_PATH"] = UNINSTALLED
    run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", SOURCE_PY], env)
    out = run([str(venv / "bin" / "python"), "-c", "import torch, meshwire" + USE
               + "import meshwire._libpath as p; print(p.LIB)"], {"HOME": str(tmp_path)})
    version, lib = out.split()
    assert version == VERSION
    assert lib == os.path.join(BUILD_ROOT, "src", "libmeshwire.so.0")


def test_a_venv_without_debians_packages_says_what_it_lacks(tmp_path):
    """A plain venv (no --system-site-packages) has no cffi: the import
    fails naming cffi and what gives it, not with cffi's internals."""
    venv = tmp_path / "bare"
    run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], {})
    p = subprocess.run([str(venv / "bin" / "python"), "-c", "import meshwire"],
                       env={"PYTHONPATH": BUILD_PY, "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "ImportError: meshwire needs cffi" in p.stderr
    assert "--system-site-packages" in p.stderr


def test_meson_installs_the_package_where_debians_python3_looks():
    """meson install itself writes to the prefix, so not here: what it would
    install, read from meson: the package in one of /usr/bin/python3's site
    directories, its _libpath.py naming the library installed beside it."""
    installed = json.loads(run(["meson", "introspect", "--installed", BUILD_ROOT], {}))
    package = os.path.dirname(next(dst for src, dst in installed.items()
                                   if src.endswith("python/meshwire/__init__.py")))
    libpath = next(src for src, dst in installed.items() if dst == package + "/_libpath.py")
    lib = installed["libmeshwire.so.0"]
    sites = run(["/usr/bin/python3", "-c", "import site; print(*site.getsitepackages())"],
                {}).split()
    assert os.path.dirname(package) in sites, f"{package} is in none of {sites}"
    assert f'LIB = "{lib}"' in open(libpath).read()


def test_the_library_has_no_static_tls_and_keeps_its_jemalloc_to_itself():
    """What the above rest on, read from the file: no DF_STATIC_TLS (which
    initial-exec TLS sets: such a library loads late only while glibc's
    reserve lasts), no libjemalloc.so needed, and only the mw_ API exported
    (jemalloc's own functions, mw__je_*, are hidden), so libmeshwire is
    never the process's malloc."""
    dynamic = run(["readelf", "-dW", LIB], {})
    assert "STATIC_TLS" not in dynamic and "jemalloc" not in dynamic
    names = [line.split()[-1].split("@")[0]
             for line in run(["nm", "-D", "--defined-only", LIB], {}).splitlines()]
    assert "mw_alloc" in names
    assert [n for n in names if not n.startswith("mw_") or n.startswith("mw__")] == ["MESHWIRE_0"]
