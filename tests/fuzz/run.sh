#!/bin/bash
# Build a libFuzzer target with clang (ASan + UBSan) and run it for a
# bounded time from its seed corpus; a crash or a broken invariant fails.
#   run.sh SOURCE_ROOT TARGET SECONDS     (meson's suite 'fuzz')
#   TARGET: wire (src/cm/wire.c), names (apps/meshcat/names.c), dir
#   (src/dir/entry.c, with src/cm/nic.c's address rules) or etcd (what an
#   etcd store answers: src/dir/etcd/resp.c and json.c) or lqp (what a
#   stream channel's peer sends: src/cm/lqp.c)
set -euo pipefail
root=$1 target=$2 secs=$3
case $target in
    wire) srcs=("$root/src/cm/wire.c") ;;
    names) srcs=("$root/apps/meshcat/names.c") ;;
    dir) srcs=("$root/src/dir/entry.c" "$root/src/cm/nic.c" -libverbs -lrdmacm) ;;
    etcd) srcs=("$root/src/dir/etcd/resp.c" "$root/src/dir/etcd/json.c" -levent_core -ljson-c) ;;
    lqp) srcs=("$root/src/cm/lqp.c" -levent_core) ;;
    *) echo "unknown fuzz target $target" >&2; exit 2 ;;
esac
command -v clang >/dev/null || { echo "SKIP: clang not installed (scripts/setup installs it)"; exit 77; }
exe=$PWD/fuzz-$target
clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$root/include" -I"$root/src" -I"$root/apps/meshcat" \
    "$root/tests/fuzz/fuzz_$target.c" "${srcs[@]}" -o "$exe"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# new inputs go to the scratch corpus; the seeds in the tree stay as they are
# the fuzzer's status, not grep's ("|| true" here made a crash pass), and 1 for a
# crash: libFuzzer's default, 77, is what meson counts as skipped
set +e
"$exe" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 -error_exitcode=1 \
    -artifact_prefix="$PWD/fuzz-$target-" "$work" "$root/tests/fuzz/corpus/$target" 2>&1 |
    grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added|==|SUMMARY|.*ERROR|.*Assertion)"
exit "${PIPESTATUS[0]}"
