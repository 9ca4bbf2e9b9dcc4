#!/bin/bash
# What the README says about building against an uninstalled tree works:
# an example compiled with the build tree's meson-uninstalled pkg-config
# file runs.
#   pkgconfig.sh BUILD_ROOT SOURCE_ROOT
set -eu
build=$(realpath "$1") src=$(realpath "$2")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=$(PKG_CONFIG_PATH=$build/meson-uninstalled pkg-config --cflags --libs meshwire)
cc -std=c11 -Wall -Werror "$src/apps/examples/hello.c" $flags -Wl,-rpath,"$build/src" -o "$out/hello"
"$out/hello" --help 2>"$out/usage" && exit 1        # usage: exit status 2
grep -q "usage: hello" "$out/usage"
echo "built hello against $build/meson-uninstalled: ok"
