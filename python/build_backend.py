"""The PEP 517 backend behind `pip install ./python` (pyproject.toml).

It makes the wheel of the package meshwire for the libmeshwire that
pkg-config finds: the one PKG_CONFIG_PATH or the system's paths name (the
installed one after `meson install -C build`), else this checkout's build
tree, `build/` beside this directory.  The wheel's
_ffi.py is generated from that library's meshwire.h and its _libpath.py
names that library's file, so the package loads exactly the library it was
made for, with no environment variable.  Standard library only, and
pyproject.toml requires nothing: pip downloads nothing to build it.
"""
from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SONAME = "libmeshwire.so.0"


CHECKOUT_BUILD = HERE.parent / "build" / "meson-uninstalled"


def _run_pkgconfig(args: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["pkg-config", *args, "meshwire"], capture_output=True,
                              text=True, env=env)
    except FileNotFoundError:
        raise RuntimeError("pkg-config is not installed: it finds libmeshwire for this build") from None


def _pkgconfig(*args: str) -> list[str]:
    """pkg-config's answer for meshwire: where it looks by itself first, then
    this checkout's build tree (so `pip install ./python` after the README's
    build needs no variable set)."""
    r = _run_pkgconfig(args, dict(os.environ))
    if r.returncode and CHECKOUT_BUILD.is_dir():
        env = dict(os.environ, PKG_CONFIG_PATH=str(CHECKOUT_BUILD))
        r = _run_pkgconfig(args, env)
    if r.returncode:
        raise RuntimeError(
            f"pkg-config finds no libmeshwire ({r.stderr.strip()}), nor is there a build "
            f"in {CHECKOUT_BUILD.parent}: build it (meson setup build && ninja -C build), "
            "install it (meson install -C build), or set PKG_CONFIG_PATH=BUILD/meson-uninstalled")
    return r.stdout.split()


def _find(name: str, dirs: list[str]) -> Path:
    for d in dirs:
        if (Path(d) / name).is_file():
            return Path(d) / name
    raise RuntimeError(f"{name} is in none of pkg-config's directories for meshwire: {dirs}")


def _library() -> tuple[Path, Path, str]:
    """libmeshwire's file, its meshwire.h and its version, as pkg-config says."""
    libdirs = _pkgconfig("--variable=libdir") + [a[2:] for a in _pkgconfig("--libs-only-L")]
    incdirs = _pkgconfig("--variable=includedir") + [a[2:] for a in _pkgconfig("--cflags-only-I")]
    return _find(SONAME, libdirs), _find("meshwire.h", incdirs), _pkgconfig("--modversion")[0]


def _metadata(version: str) -> str:
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["project"]
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {version}",
             f"Summary: {project['description']}",
             f"Requires-Python: {project['requires-python']}"]
    lines += [f"Requires-Dist: {d}" for d in project["dependencies"]]
    return "\n".join(lines) + "\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _ffi_module(header: Path) -> bytes:
    """meshwire._ffi for @header, made by gen_cdef.py with cffi.  pip's
    isolated build environment has no cffi (and may not download one): the
    interpreter this environment was made from has it, as it must to run
    the package."""
    exe = getattr(sys, "_base_executable", None) or sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}   # pip's overlay
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "_ffi.py"
        run = subprocess.run([exe, str(HERE / "gen_cdef.py"), str(header), str(out)],
                             capture_output=True, text=True, env=env)
        if run.returncode != 0:
            raise RuntimeError(f"cannot make meshwire/_ffi.py with {exe} (it needs cffi: "
                               f"apt-get install python3-cffi): {run.stderr.strip()}")
        return out.read_bytes()


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    so, header, version = _library()
    files = {f"meshwire/{p.name}": p.read_bytes()
             for p in sorted((HERE / "meshwire").iterdir())
             if p.suffix == ".py" or p.name == "py.typed"}
    files["meshwire/_ffi.py"] = _ffi_module(header)
    files["meshwire/_libpath.py"] = (f'"""Where libmeshwire is (pkg-config, when pip built this)."""\n'
                                     f"LIB = {str(so)!r}\n").encode()
    info = f"meshwire-{version}.dist-info"
    files[f"{info}/METADATA"] = _metadata(version).encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: meshwire build_backend.py\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"meshwire-{version}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as whl:
        for n, d in files.items():
            whl.writestr(n, d)
    return name
