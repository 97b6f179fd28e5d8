#!/usr/bin/env bash
# ctest driver: install the already built nanoddp into a scratch prefix, then configure, build
# and run tests/consumer against that install only.
set -euo pipefail
build_dir=$1 source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/tests/consumer" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
  -DNANODDP_EXAMPLES_DIR="$source_dir/examples" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
"$work/build/ddp_example"  # a world of one: no launcher variables
