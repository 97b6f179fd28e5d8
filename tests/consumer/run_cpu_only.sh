#!/usr/bin/env bash
# ctest driver: a CPU-only nanoddp used on a machine without the CUDA toolkit.
# - nanoddp is configured with -DNANODDP_CUDA=OFF (the library layers only), built and installed,
#   with nvcc, the CUDA toolkit and NCCL hidden: PATH and LD_LIBRARY_PATH lose every CUDA entry,
#   CMake ignores the toolkit's prefixes and CUDAToolkit_ROOT points nowhere;
# - the installed package config names no CUDA target, no absolute CUDA/NCCL library path, and
#   says the CUDA and NCCL components are absent (find_package(... COMPONENTS CUDA) fails);
# - tests/consumer configures and builds against that install under the same hiding, trains, and
#   the README's example runs on 2 ranks (torchrun's variables, started here) with one checksum;
# - neither program links cudart, cuBLAS, NCCL or the driver (ldd and readelf say).
# The nanoddp build folder persists under the outer build folder, so a rerun rebuilds only what
# changed (and ccache serves a fresh one).
set -euo pipefail
build_dir=$1 source_dir=$2 cxx=${3:-c++}
cpu_build=$build_dir/consumer-cpu-only
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Hide the toolkit: a machine without it.
# Every PATH folder that holds nvcc goes (a wrapper in /usr/local/bin counts), and every folder
# named after CUDA.
without_cuda() { tr ':' '\n' <<<"$1" | grep -vi cuda | paste -sd: -; }
path=""
while IFS= read -r dir; do
  [ -n "$dir" ] && [ ! -e "$dir/nvcc" ] && path=${path:+$path:}$dir
done < <(without_cuda "$PATH" | tr ':' '\n')
export PATH=$path
export LD_LIBRARY_PATH=$(without_cuda "${LD_LIBRARY_PATH:-}")
unset CUDA_PATH CUDA_HOME CUDA_ROOT CUDAToolkit_ROOT NCCL_HOME CUDACXX
! command -v nvcc >/dev/null || fail "nvcc is still on PATH ($(command -v nvcc)): the test hides nothing"
hidden=(-DCMAKE_IGNORE_PREFIX_PATH="/usr/local/cuda;$(ls -d /usr/local/cuda-* 2>/dev/null | paste -sd';' -)"
        -DCUDAToolkit_ROOT="$work/no-cuda-here" -DCMAKE_CXX_COMPILER="$cxx" -G Ninja
        -DCMAKE_BUILD_TYPE=Release)

# 1. nanoddp, CPU only: the four layers, nothing else.
cmake -S "$source_dir" -B "$cpu_build" "${hidden[@]}" -DNANODDP_CUDA=OFF \
  -DNANODDP_BUILD_TESTS=OFF -DNANODDP_BUILD_APPS=OFF >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring a CPU-only nanoddp"; }
grep -q 'nanoddp: CUDA path OFF' "$work/configure.log" || fail "the CPU-only configure did not say 'CUDA path OFF'"
cmake --build "$cpu_build" -j2 >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log" >&2; fail "building a CPU-only nanoddp"; }
prefix=$work/prefix
cmake --install "$cpu_build" --prefix "$prefix" >/dev/null

# 2. The package config: nothing of CUDA.
config_dir=$prefix/lib/cmake/nanoddp
[ -f "$config_dir/nanoddpConfig.cmake" ] || fail "no nanoddpConfig.cmake under $config_dir"
if grep -nE 'CUDA::|nanoddp::nccl' "$config_dir/nanoddpTargets"*.cmake; then
  fail "the CPU-only package's targets name a CUDA or NCCL target (above)"
fi
if grep -nE '/[^ ";]*(cuda|cudart|cublas|nccl)[^ ";]*' "$config_dir"/*.cmake | grep -v '^[^:]*:[0-9]*:#'; then
  fail "the CPU-only package config holds an absolute CUDA/NCCL path (above)"
fi

# 3. The consumer, under the same hiding.
cmake -S "$source_dir/tests/consumer" -B "$work/build" "${hidden[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DNANODDP_EXAMPLES_DIR="$source_dir/examples" \
  >"$work/consumer.log" 2>&1 || { cat "$work/consumer.log" >&2; fail "configuring the consumer"; }
cmake --build "$work/build" >"$work/consumer-build.log" 2>&1 ||
  { cat "$work/consumer-build.log" >&2; fail "building the consumer"; }
# Asking for the CUDA component of a CPU-only nanoddp must fail, and say why.
if cmake -S "$source_dir/tests/consumer" -B "$work/build-cuda" "${hidden[@]}" \
     -DCMAKE_PREFIX_PATH="$prefix" -DNANODDP_COMPONENTS=CUDA >"$work/cuda.log" 2>&1; then
  fail "find_package(nanoddp REQUIRED COMPONENTS CUDA) succeeded on a CPU-only nanoddp"
fi
grep -q 'CUDA' "$work/cuda.log" || { cat "$work/cuda.log" >&2; fail "the COMPONENTS CUDA failure does not name CUDA"; }
grep -q 'lacks the component(s) CUDA (it has: CUDA and NCCL when built' "$work/cuda.log" ||
  { cat "$work/cuda.log" >&2; fail "the COMPONENTS CUDA failure is not one sentence"; }

# 4. Nothing of CUDA linked.
for exe in "$work/build/consumer" "$work/build/ddp_example"; do
  if ldd "$exe" | grep -iE 'cudart|cublas|nccl|libcuda'; then fail "$exe links CUDA (ldd above)"; fi
  if readelf -d "$exe" | grep -iE 'NEEDED.*(cudart|cublas|nccl|libcuda)'; then
    fail "$exe needs a CUDA library (readelf above)"
  fi
done

# 5. It runs: one process, then 2 ranks through torchrun's variables.
"$work/build/consumer"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for rank in 0 1; do
  RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port timeout 120 "$work/build/ddp_example" >"$work/rank$rank.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  wait "${pids[$i]}" || { cat "$work/rank0.log" "$work/rank1.log" >&2; fail "rank $i failed"; }
done
pids=()
sums=$(cat "$work/rank0.log" "$work/rank1.log" |
       grep -oE 'rank [01] of 2: parameters checksum [0-9a-f]{16}' | awk '{print $NF}' | sort -u)
if [ "$(cat "$work/rank0.log" "$work/rank1.log" | grep -c 'of 2: parameters checksum')" != 2 ] ||
   [ "$(grep -c . <<<"$sums")" != 1 ]; then
  cat "$work/rank0.log" "$work/rank1.log" >&2
  fail "the CPU-only example did not give 2 ranks with one checksum"
fi
echo "consumer (CPU only, no CUDA toolkit): 2 ranks, checksum $sums; no CUDA library linked"
