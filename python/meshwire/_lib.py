"""libmeshwire through cffi's ABI mode: the declarations are meshwire.h's
own (generated at build time into _cdef.py), the library is found by its
soname, or at $MESHWIRE_LIB (the build tree's tests set it)."""
from __future__ import annotations

import os
from typing import Optional

from cffi import FFI

from ._cdef import CDEF

ffi = FFI()
ffi.cdef(CDEF)

_TLS_HINT = (
    "libmeshwire links jemalloc, whose thread-local storage needs about 2.6 KiB of "
    "glibc's static TLS reserve, more than a process started without it leaves for "
    "libraries loaded later: start Python with "
    "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096 (or LD_PRELOAD=libjemalloc.so.2)"
)


def _load():
    path = os.environ.get("MESHWIRE_LIB") or "libmeshwire.so.0"
    try:
        return ffi.dlopen(path)
    except OSError as e:
        if "static TLS" in str(e):
            raise ImportError(f"cannot load {path}: {_TLS_HINT}") from e
        raise ImportError(f"cannot load {path}: {e}") from e


lib = _load()


def error(err: int, message: Optional[str] = None) -> OSError:
    """The exception for meshwire error @err (a negative errno): an OSError
    whose errno is -err and whose text is meshwire's message.  Python picks
    the subclass from the errno: ConnectionRefusedError, TimeoutError,
    ConnectionResetError, ConnectionAbortedError, PermissionError..."""
    text = message or ffi.string(lib.mw_strerror(err)).decode(errors="replace")
    return OSError(-err, text)


def check(rc: int, what: str) -> int:
    """@rc when it is not an error, else raise error(rc) naming @what."""
    if rc < 0:
        raise error(rc, f"{what}: {ffi.string(lib.mw_strerror(rc)).decode()}")
    return rc
