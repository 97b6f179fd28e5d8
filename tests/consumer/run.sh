#!/usr/bin/env bash
# ctest driver: install the already built nanoddp into a scratch prefix, then configure, build
# and run tests/consumer against that install only:
# - the consumer includes <nanoddp/nanoddp.h> and trains (its loss must fall);
# - the README's API example, built against the install, runs on 2 ranks under the INSTALLED
#   nanoddp-run, and both ranks end with the same parameters;
# - internal headers (sockets, the store's wire protocol, CUDA plumbing) are not installed.
set -euo pipefail
build_dir=$1 source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
for internal in comm/unique_fd.h comm/store_socket.h comm/store_protocol.h comm/gloo_context.h \
                comm/shm_segment.h comm/tcp_store_server_impl.h comm/gloo_group_impl.h \
                comm/cuda engine/cuda kernels/cuda engine/debug_log.h engine/env.h; do
  if [ -e "$prefix/include/nanoddp/$internal" ]; then
    echo "FAIL: internal header installed: include/nanoddp/$internal" >&2
    exit 1
  fi
done
for public in nanoddp.h config.h engine/tensor.h nn/module.h comm/ddp.h kernels/types.h; do
  [ -f "$prefix/include/nanoddp/$public" ] || { echo "FAIL: missing include/nanoddp/$public" >&2; exit 1; }
done
cmake -S "$source_dir/tests/consumer" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DNANODDP_EXAMPLES_DIR="$source_dir/examples" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
"$work/build/ddp_example"  # a world of one: no launcher variables
out=$(cd "$work" && timeout 120 "$prefix/bin/nanoddp-run" --nproc-per-node 2 \
        "$work/build/ddp_example" 2>&1) || { echo "$out"; exit 1; }
sums=$(grep -oE 'rank [01] of 2: parameters checksum [0-9a-f]{16}' <<<"$out" | awk '{print $NF}' | sort -u)
if [ "$(grep -c . <<<"$sums")" != 1 ] || [ "$(grep -c 'of 2: parameters checksum' <<<"$out")" != 2 ]; then
  echo "FAIL: the installed nanoddp-run did not give 2 ranks with one checksum:" >&2
  echo "$out" >&2
  exit 1
fi
echo "consumer: 2 ranks under the installed nanoddp-run, checksum $sums"
