#!/bin/bash
# tools/rxe-vm refuses what it does not understand, before booting anything:
# an option placed after the subcommand (it once went on as the command and
# failed inside the VM), a missing command, a count out of range.  Exit 125
# (the runner's own failure) and a message naming the mistake.
set -u
vm=$1/tools/rxe-vm
bad=0
check() {   # WHAT PATTERN ARG...
    local what=$1 pat=$2 out rc
    shift 2
    out=$(timeout 20 "$vm" "$@" 2>&1); rc=$?
    if [[ $rc != 125 || $out != *"$pat"* ]]; then
        echo "rxe-vm $*: exit $rc, output: $out (want 125 and '$pat': $what)"
        bad=1
    fi
}
check "-t after run" "unknown option -t" run -t 5 -- true
check "-t after mesh" "unknown option -t" mesh -n 2 -t 5 -- true
check "no command" "no command given" run -k 1
check "-k out of range" "-k wants 1..16" run -k 99 -- true
check "-n out of range" "-n wants 2..16" mesh -n 1 -- true
exit $bad
