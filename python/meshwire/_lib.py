"""libmeshwire through cffi's ABI mode: the declarations are meshwire.h's
own, parsed at build time (_ffi.py, cffi's out-of-line ABI mode: importing
it parses nothing); the library is the one this
copy of the package was made with (_libpath.py: the build tree's in
build/python, the installed one after meson install or pip install), else
whatever the dynamic linker finds by its soname.  Every function is looked
up and every type the binding names parsed here, at import."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

try:
    from ._ffi import ffi
except ModuleNotFoundError as e:  # a venv made without --system-site-packages
    if e.name != "_cffi_backend":
        raise
    raise ImportError(
        "meshwire needs cffi, which this interpreter does not find: install Debian's "
        "(apt-get install python3-cffi), and in a venv make it with "
        "--system-site-packages (python3 -m venv --system-site-packages DIR)") from e
from ._libpath import LIB

SONAME = "libmeshwire.so.0"


def _load():
    path = LIB if os.path.exists(LIB) else SONAME
    try:
        return ffi.dlopen(path)
    except OSError as e:
        gone = "" if path == LIB else f" ({LIB}, which this package was made with, is gone)"
        raise ImportError(f"cannot load {path}{gone}: {e}") from e


lib = _load()


def _resolve_all() -> None:
    """Look up every function and constant of the library now: a library
    that lacks one (an older build) fails the import, not a later call, and
    no finalizer ever runs the first lookup of a name."""
    for name in dir(lib):
        getattr(lib, name)


_resolve_all()


class T:
    """Every C type the binding names, parsed once, here (by cffi's C
    parser: the declarations themselves were parsed at build time)."""
    char_p = ffi.typeof("char *")
    chars = ffi.typeof("char[]")
    void_p = ffi.typeof("void *")
    uintptr = ffi.typeof("uintptr_t")
    size_p = ffi.typeof("size_t *")
    strings = ffi.typeof("const char *[]")
    ctx_pp = ffi.typeof("mw_ctx_t **")
    ctx_opts_p = ffi.typeof("mw_ctx_opts_t *")
    ctx_stats_p = ffi.typeof("mw_ctx_stats_t *")
    conn_p = ffi.typeof("mw_conn_t *")
    conn_opts_p = ffi.typeof("mw_conn_opts_t *")
    conn_stats_p = ffi.typeof("mw_conn_stats_t *")
    listener_pp = ffi.typeof("mw_listener_t **")
    listener_stats_p = ffi.typeof("mw_listener_stats_t *")
    comm_p = ffi.typeof("mw_comm_t *")
    comm_opts_p = ffi.typeof("mw_comm_opts_t *")
    comm_stats_p = ffi.typeof("mw_comm_stats_t *")
    msg_p = ffi.typeof("mw_msg_t *")
    mr_pp = ffi.typeof("mw_mr_t **")
    remote = ffi.typeof("mw_remote_t")
    remote_p = ffi.typeof("mw_remote_t *")
    remotes = ffi.typeof("mw_remote_t[]")
    batch_pp = ffi.typeof("mw_batch_t **")
    batch_entries = ffi.typeof("mw_batch_entry_t[]")
    rails_pp = ffi.typeof("mw_rails_t **")
    dir_p = ffi.typeof("mw_directory_t *")
    dir_opts_p = ffi.typeof("mw_dir_opts_t *")
    dir_list_p = ffi.typeof("mw_dir_list_t *")
    dir_pub_p = ffi.typeof("mw_dir_pub_t *")
    dir_shares = ffi.typeof("mw_dir_share_t[]")
    dir_peer_p = ffi.typeof("mw_dir_peer_t *")
    rail_stats_p = ffi.typeof("mw_rail_stats_t *")


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


def fields(st: Any) -> Dict[str, Any]:
    """A stats struct (cdata pointer) as a dict by field name; char arrays
    (addresses, device names) as str."""
    out = {}
    for name, field in ffi.typeof(st).item.fields:
        v = getattr(st, name)
        out[name] = ffi.string(v).decode() if field.type.kind == "array" else v
    return out
