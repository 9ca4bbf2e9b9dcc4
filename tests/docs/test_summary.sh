#!/bin/bash
# scripts/test's verdict (test-summary.py): a suite passes only on results
# read; a log that is missing, or empty (a VM stopped at its time limit
# before meson wrote it), fails the command as a failed test does.
set -u
summary=$1/scripts/test-summary.py
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
echo '{"result": "OK"}' >"$d/ok.json"
echo '{"result": "FAIL"}' >"$d/fail.json"
: >"$d/empty.json"
verdict() { python3 "$summary" "$d" "$@" >/dev/null; echo $?; }
bad=0
check() {   # WANT WHAT SPEC...
    local want=$1 what=$2 got
    shift 2
    got=$(verdict "$@")
    if [[ $got != "$want" ]]; then
        echo "test-summary: $what: exit $got, want $want"
        bad=1
    fi
}
check 0 "results, all passed" a=ok b=ok
check 1 "a failed test" a=ok b=fail
check 1 "an empty log" a=ok b=empty
check 1 "a missing log" a=ok b=none
exit $bad
