#!/usr/bin/env python3
"""Write meshwire/_cdef.py: include/meshwire.h as declarations cffi's cdef()
takes (comments, preprocessor lines, C++ guards and attributes removed;
integer #defines kept).  Run by meson, so the binding always declares
exactly what the header does.

    gen_cdef.py meshwire.h _cdef.py
"""
import re
import sys


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


def main() -> int:
    with open(sys.argv[1]) as f:
        cdef = cdef_of(f.read())
    with open(sys.argv[2], "w") as f:
        f.write('"""Generated from meshwire.h by gen_cdef.py: do not edit."""\n')
        f.write(f"CDEF = {cdef!r}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
