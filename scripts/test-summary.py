#!/usr/bin/env python3
"""Add up meson test logs (<logbase>.json) of several suites into one summary
in meson's own format. usage: test-summary.py LOGDIR SUITE=LOGBASE[,LOGBASE...]...
Exit status 1 when anything failed or a log is missing."""
import json
import sys

KEYS = [("OK", "Ok"), ("EXPECTEDFAIL", "Expected Fail"), ("FAIL", "Fail"),
        ("UNEXPECTEDPASS", "Unexpected Pass"), ("SKIP", "Skipped"),
        ("TIMEOUT", "Timeout")]


def count(path):
    """The results in @path; OSError when it has none (a run cut short
    creates its log and writes nothing into it)."""
    c = {k: 0 for k, _ in KEYS}
    with open(path) as f:
        for line in f:
            r = json.loads(line).get("result", "FAIL")
            c[r if r in c else "FAIL"] += 1     # ERROR counts as a failure
    if not any(c.values()):
        raise OSError(f"{path} is empty")
    return c


def main():
    logdir, specs = sys.argv[1], sys.argv[2:]
    total = {k: 0 for k, _ in KEYS}
    bad = False
    print("\n== meshwire test summary ==")
    print(f"{'suite':<8}{'logs':>5}{'ok':>6}{'fail':>6}{'skip':>6}{'timeout':>9}")
    for spec in specs:
        suite, bases = spec.split("=", 1)
        c = {k: 0 for k, _ in KEYS}
        n = 0
        for base in filter(None, bases.split(",")):
            try:
                path = base if base.startswith("/") else f"{logdir}/{base}"
                for k, v in count(f"{path}.json").items():
                    c[k] += v
                n += 1
            except OSError:
                print(f"{suite}: no results in {base}.json (the suite did not run, or "
                      "did not finish)")
                bad = True
        for k in c:
            total[k] += c[k]
        print(f"{suite:<8}{n:>5}{c['OK']:>6}{c['FAIL'] + c['UNEXPECTEDPASS']:>6}"
              f"{c['SKIP']:>6}{c['TIMEOUT']:>9}")
    print()
    for k, name in KEYS:
        print(f"{name + ':':<20}{total[k]}")
    failed = total["FAIL"] + total["TIMEOUT"] + total["UNEXPECTEDPASS"]
    print(f"\n{total['OK'] + total['EXPECTEDFAIL']} passed, {failed} failed, "
          f"{total['SKIP']} skipped")
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
