#!/usr/bin/env python3
"""The README's examples are quoted from whole programs: every ```c or
```python block in README.md follows a line "<!-- example: apps/examples/NAME.c -->"
(or NAME.py) and is, verbatim (dedented), the part of that file between
"/* README: begin */" and "/* README: end */" ("# README: begin" and "# README:
end" in Python); and every such part is quoted.  The programs themselves are
built by meson and run in the rxe suite, so the README cannot rot.
usage: readme_examples.py SOURCE_ROOT"""
import re
import sys
import textwrap
from pathlib import Path


MARKS = {".c": ("/* README: begin */", "/* README: end */"),
         ".py": ("# README: begin", "# README: end")}


def region(path):
    lines = path.read_text().splitlines()
    begin, end = MARKS[path.suffix]
    try:
        b = next(i for i, l in enumerate(lines) if l.strip() == begin)
        e = next(i for i, l in enumerate(lines) if l.strip() == end)
    except StopIteration:
        return None
    return textwrap.dedent("\n".join(lines[b + 1:e])).strip("\n")


def main():
    root = Path(sys.argv[1])
    readme = (root / "README.md").read_text().splitlines()
    bad, quoted = [], set()
    i = 0
    while i < len(readme):
        if readme[i].strip() not in ("```c", "```python"):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(readme)) if readme[j].strip() == "```")
        block = "\n".join(readme[i + 1:end]).strip("\n")
        prev = next((readme[j] for j in range(i - 1, -1, -1) if readme[j].strip()), "")
        m = re.fullmatch(r"<!-- example: (\S+) -->", prev.strip())
        if not m:
            bad.append(f"README.md:{i + 1}: a code block without '<!-- example: FILE -->' before it")
        else:
            src = root / m.group(1)
            want = region(src) if src.exists() else None
            quoted.add(m.group(1))
            if want is None:
                bad.append(f"README.md:{i + 1}: {m.group(1)} has no README region")
            elif want != block:
                bad.append(f"README.md:{i + 1}: differs from {m.group(1)}:\n--- README\n{block}\n"
                           f"--- {m.group(1)}\n{want}")
        i = end + 1
    for src in sorted(p for p in (root / "apps" / "examples").iterdir() if p.suffix in MARKS):
        name = str(src.relative_to(root))
        if region(src) is not None and name not in quoted:
            bad.append(f"{name}: its README region is quoted nowhere")
    for b in bad:
        print(b)
    print(f"{len(quoted)} examples quoted, {len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
