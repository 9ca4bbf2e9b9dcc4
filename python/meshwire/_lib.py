"""libmeshwire through cffi's ABI mode: the declarations are meshwire.h's
own (generated at build time into _cdef.py); the library is the one this
copy of the package was made with (_libpath.py: the build tree's in
build/python, the installed one after meson install or pip install), else
whatever the dynamic linker finds by its soname."""
from __future__ import annotations

import os
from typing import Optional

from cffi import FFI

from ._cdef import CDEF
from ._libpath import LIB

ffi = FFI()
ffi.cdef(CDEF)

SONAME = "libmeshwire.so.0"


def _load():
    path = LIB if os.path.exists(LIB) else SONAME
    try:
        return ffi.dlopen(path)
    except OSError as e:
        gone = "" if path == LIB else f" ({LIB}, which this package was made with, is gone)"
        raise ImportError(f"cannot load {path}{gone}: {e}") from e


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
