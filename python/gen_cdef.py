#!/usr/bin/env python3
"""Write meshwire/_ffi.py: include/meshwire.h as declarations cffi's cdef()
takes (comments, preprocessor lines, C++ guards and attributes removed;
integer #defines kept), parsed now and emitted as cffi's out-of-line ABI
module.  Importing it parses nothing: no pycparser at run time (seconds
per import in an emulated VM), and none of the Python parser's lock, which
a finalizer once waited on for good.  Run by meson (and by pip, through
build_backend.py), so the binding always declares exactly what the header
does.

    gen_cdef.py meshwire.h _ffi.py
"""
import os
import re
import sys
import tempfile


def cdef_of(header: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    out, skip = [], 0
    for line in text.splitlines():
        s = line.strip()
        if skip:                          # inside #ifdef __cplusplus
            skip += s.startswith("#if")
            skip -= s.startswith("#endif")
            continue
        if s.startswith("#ifdef __cplusplus"):
            skip = 1
            continue
        if s.startswith("#"):
            m = re.match(r"#define\s+(MW_\w+)\s+(\d+)\s*$", s)
            if m:
                out.append(f"#define {m[1]} {m[2]}")
            continue
        out.append(line)
    text = "\n".join(out).replace("MW_EXTERN", "")
    text = re.sub(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)", "", text)
    return "struct event_base;\n" + re.sub(r"\n\s*\n+", "\n", text).strip() + "\n"


def ffi_module(header: str) -> bytes:
    """The source of meshwire._ffi for the header text @header."""
    from cffi import FFI
    ffi = FFI()
    ffi.cdef(cdef_of(header))
    ffi.set_source("meshwire._ffi", None)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "_ffi.py")
        ffi.emit_python_code(out)
        with open(out, "rb") as f:
            return f.read()


def main() -> int:
    with open(sys.argv[1]) as f:
        code = ffi_module(f.read())
    with open(sys.argv[2], "wb") as f:
        f.write(code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
