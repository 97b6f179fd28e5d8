#!/usr/bin/env bash
# The one script that verifies nanoddp's CUDA path on a GPU machine (H200, sm_90): unpack the
# build dependencies, configure with CUDA, build, run the GPU tests (ctest -L gpu), the GEMM
# benchmark, GPU training (hand GEMM and cuBLAS), the NCCL all-reduce benchmark and the DDP
# benchmark, and print a summary. Run from the repository root; it takes under 10 minutes.
#
# The GPU machine has CUDA 13, CMake, ninja, a compiler and Python, but none of the Debian -dev
# packages and no network. So the packages travel as .deb files:
#   1. HERE (with network):   scripts/gpu-debs.sh        -> .gpu-debs/*.deb (git-ignored)
#   2. THERE (device tool):   run(command="bash scripts/gpu-check.sh", carry=[".gpu-debs"],
#                                 timeout_s=600)
#      .gpu-debs is git-ignored, so it travels ONLY when named in `carry`.
# What comes back: the device tool returns at most 8 files from $OUT (at most 2 folders deep),
# so $OUT gets two: gpu-check.tar.gz (every log, the JSON results, the trace and summary.txt)
# and summary.txt. The summary is also printed on stdout (the tool returns its tail), and each
# step's row is printed the moment the step ends, so even a run cut short shows what ran.
# Parameter files (.safetensors) stay in a scratch folder: they are only compared here.
# Exit status: 0 all passed, 1 a step failed or did not fit the budget, 2 the GPU tests were
# skipped (no usable GPU).
#
# Budget: the device tool stops a command at 600 s. Every step runs under `timeout` with the
# smaller of its own cap and what is left of GPU_CHECK_BUDGET_S (default 570) minus a reserve
# for the summary and the archive; a step whose minimum no longer fits is SKIPPED, never started
# with less. So the summary is printed before the budget ends, whatever hangs. A TERM or INT
# stops the running step and prints the summary at once. $OUT must be writable before anything
# runs (exit 1 otherwise), and a build that failed fails the check even when later steps pass.
#
# Knobs (environment): GPU_CHECK_PREFIX (where the .debs are unpacked, default
# /tmp/nanoddp-deps), GPU_CHECK_BUILD_DIR (default build-gpu), GPU_CHECK_BUILD_ALL=1 (build every
# target, not only the GPU test and the executables the steps run), GPU_CHECK_DEPS_ONLY=1 (unpack, patch
# and configure only: how the dependency part is tested on a machine without a GPU),
# CUDA_ARCHS (default 90), GPU_CHECK_CMAKE_ARGS (extra configure arguments), GPU_CHECK_BUDGET_S,
# GPU_CHECK_WORK (logs and scratch, default a fresh folder under /tmp).
# Testing the orchestration without a GPU (tests/scripts/gpu_check_budget.sh):
# GPU_CHECK_FAKE_STEP="sleep 1" runs that command instead of every step's (no dependencies,
# no build), and GPU_CHECK_FAKE_HANG=STEP makes STEP hang (sleep 1000) instead.
set -uo pipefail

readonly START=$SECONDS
# The device tool allows 600 s per command; keep a margin.
readonly BUDGET_S="${GPU_CHECK_BUDGET_S:-570}"
if ! [[ "$BUDGET_S" =~ ^[0-9]{1,6}$ ]]; then
  echo "gpu-check: GPU_CHECK_BUDGET_S='$BUDGET_S' is not a whole number of seconds" >&2
  exit 1
fi
((BUDGET_S > 590)) &&
  echo "gpu-check: warning: GPU_CHECK_BUDGET_S=$BUDGET_S: the device tool stops a command at 600 s" >&2
# Kept free for what comes after the last step: the summary, the archive, and a killed step's
# grace period (timeout -k).
readonly RESERVE_S=8
readonly KILL_GRACE_S=3
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
OUT="${OUT:-/tmp/gpu-check-out}"
# Checked before anything runs: a check whose results cannot be kept is not worth starting.
if ! mkdir -p "$OUT" 2>/dev/null || ! touch "$OUT/.gpu-check-probe" 2>/dev/null; then
  echo "gpu-check: OUT=$OUT is not a writable folder; nothing was run" >&2
  exit 1
fi
rm -f "$OUT/.gpu-check-probe"
WORK="${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
LOGS="$WORK/logs"        # archived into $OUT/gpu-check.tar.gz
SCRATCH="$WORK/scratch"  # parameter files: compared here, not returned
rm -rf "$LOGS" "$SCRATCH"
mkdir -p "$LOGS" "$SCRATCH"
PREFIX="${GPU_CHECK_PREFIX:-/tmp/nanoddp-deps}"
BUILD="${GPU_CHECK_BUILD_DIR:-build-gpu}"
ARCHS="${CUDA_ARCHS:-90}"
JOBS="$(nproc 2>/dev/null || echo 8)"
FAKE="${GPU_CHECK_FAKE_STEP:-}"
FAKE_HANG="${GPU_CHECK_FAKE_HANG:-}"
GPU_LINE="gpu: (not probed yet)"
MULTIARCH=x86_64-linux-gnu

declare -a ROWS=()
row() {  # step status seconds note: kept for the summary and printed at once
  local line
  line="$(printf '%-22s %-8s %6ss  %s' "$1" "$2" "$3" "$4")"
  ROWS+=("$line")
  printf '%s\n' "$line"
}
remaining() { echo $((BUDGET_S - (SECONDS - START))); }
# A step's time limit: its own cap, or what is left of the budget minus the reserve, whichever
# is smaller; 0 when less than the step's minimum is left (the step is then skipped).
limit() {  # cap minimum
  local cap=$1 minimum=$2 left
  left=$(($(remaining) - RESERVE_S - KILL_GRACE_S))
  ((left < minimum)) && { echo 0; return; }
  ((cap < left)) && echo "$cap" || echo "$left"
}
# Runs one step under its limit; its output goes to $LOGS/LOG. Returns the command's status,
# 124 for a timeout, or 125 when the step did not fit the budget (the caller's row says which).
run_limited() {  # cap minimum log command...
  local cap=$1 minimum=$2 log=$3 seconds
  shift 3
  seconds="$(limit "$cap" "$minimum")"
  if ((seconds == 0)); then
    echo "skipped: $(remaining) s of the budget left, the step needs $minimum s" >"$LOGS/$log"
    return 125
  fi
  if [[ -n "$FAKE" ]]; then
    if [[ "$log" == "$FAKE_HANG".log ]]; then
      set -- sleep 1000
    else
      set -- env GPU_CHECK_STEP_LOG="$log" bash -c "$FAKE"  # the fake knows its step's log
    fi
  fi
  # In the background and waited for, so that a TERM or INT to this script runs its trap at
  # once (bash defers traps while a foreground child runs), which then stops the step.
  timeout -k "$KILL_GRACE_S" "$seconds" "$@" >"$LOGS/$log" 2>&1 &
  STEP_PID=$!
  wait "$STEP_PID"
  local rc=$?
  STEP_PID=
  return $rc
}
STEP_PID=
stop_step() {
  [[ -n "$STEP_PID" ]] && kill -TERM "$STEP_PID" 2>/dev/null
  STEP_PID=
}
# The status word for run_limited's return code.
verdict() {  # rc
  case $1 in
    0) echo ok ;;
    124 | 137) echo TIMEOUT ;;
    125) echo SKIPPED ;;
    *) echo FAIL ;;
  esac
}
# A failed or skipped step's note: why it was skipped, or where its log is.
why() {  # rc log
  if (($1 == 125)); then head -1 "$LOGS/$2"; else echo "rc $1; see $2"; fi
}
FINISHED=0
finish() {
  ((FINISHED)) && exit "$1"
  FINISHED=1
  trap - TERM INT
  {
    echo "nanoddp gpu-check ($(date -u +%FT%TZ), $((SECONDS - START)) s of a $BUDGET_S s budget)"
    echo "$GPU_LINE"
    printf '%-22s %-8s %7s  %s\n' step status time note
    printf '%s\n' "${ROWS[@]}"
    echo "logs: $OUT/gpu-check.tar.gz (logs/*.log, *.json, summary.txt); exit status $1"
  } >"$LOGS/summary.txt"
  echo "---- summary"
  cat "$LOGS/summary.txt"
  cp "$LOGS/summary.txt" "$OUT/summary.txt"
  # The device tool returns a file of at most 16 MiB: a step that flooded its log must not cost
  # every log. Over 12 MiB in all, each log over 1 MiB keeps its last 1 MiB (where errors are).
  if (($(du -sb "$LOGS" | cut -f1) > 12 * 1024 * 1024)); then
    local f
    for f in "$LOGS"/*.log; do
      if (($(stat -c %s "$f") > 1024 * 1024)); then
        { echo "(cut by gpu-check.sh: the last 1 MiB of $(stat -c %s "$f") bytes)"; tail -c 1048576 "$f"; } >"$f.cut"
        mv "$f.cut" "$f"
      fi
    done
  fi
  timeout -k 2 30 tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" logs 2>/dev/null ||
    echo "could not write $OUT/gpu-check.tar.gz"
  exit "$1"
}
die() {  # step message
  row "$1" FAIL "$((SECONDS - START))" "$2"
  finish 1
}
# Stopped from outside (the tool's own timeout, ^C): the summary still comes out.
trap 'stop_step; row interrupted FAIL "$((SECONDS - START))" "stopped by a signal"; finish 1' TERM INT

# ---- 0. the machine ------------------------------------------------------------------------
GPU_LINE="gpu: $(timeout -k 2 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)"
[[ "$GPU_LINE" == "gpu: " ]] && GPU_LINE="gpu: (nvidia-smi unavailable)"
NVCC="$(command -v nvcc || true)"
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
[[ -z "$NVCC" ]] && die setup "nvcc not found (PATH or /usr/local/cuda/bin)"
CUDA_HOME="${CUDA_HOME:-$(cd "$(dirname "$NVCC")/.." && pwd)}"
export PATH="$CUDA_HOME/bin:$PATH"
GPU_LINE="$GPU_LINE | nvcc $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') | cmake $(cmake --version | head -1 | awk '{print $3}')"

# Sections 1 and 2 (skipped with GPU_CHECK_FAKE_STEP: nothing is built then).
prepare_dependencies() {
# ---- 1. unpack the .debs into a private prefix -----------------------------------------------
t=$SECONDS
shopt -s nullglob
debs=("$root"/.gpu-debs/*.deb)
((${#debs[@]} == 0)) && die deps "no .gpu-debs/*.deb: run scripts/gpu-debs.sh on a networked machine and pass \".gpu-debs\" in the device tool's carry list"
rm -rf "$PREFIX" && mkdir -p "$PREFIX"
unpack() {  # deb: dpkg -x where dpkg exists, else ar + tar (a .deb is an ar archive)
  if command -v dpkg >/dev/null; then
    dpkg -x "$1" "$PREFIX"
  else
    local tmp
    tmp="$(mktemp -d)"
    (cd "$tmp" && ar x "$1" && tar -xf data.tar.* -C "$PREFIX")
    rm -rf "$tmp"
  fi
}
for deb in "${debs[@]}"; do unpack "$deb" || die deps "could not unpack $(basename "$deb")"; done
# Debian's files assume they live under /usr. Absolute symlinks are re-pointed into the prefix,
# and CMake package files that hard-code "/usr" (doctest's targets file, Gloo's library path,
# fmt's "/usr move" check) are patched to the prefix. Files that compute their prefix from their
# own location (Eigen, CLI11, nlohmann_json, fmt's targets) need nothing.
while IFS= read -r link; do
  target="$(readlink "$link")"
  [[ "$target" == /* ]] && ln -sfn "$PREFIX$target" "$link"
done < <(find "$PREFIX" -type l)
find "$PREFIX" -name '*.cmake' -print0 |
  xargs -0 sed -i -e "s#\"/usr/#\"$PREFIX/usr/#g" -e "s#\"/usr\"#\"$PREFIX/usr\"#g"
if grep -rlE '"/usr(/|")' --include='*.cmake' "$PREFIX" >/dev/null; then
  die deps "a CMake file under $PREFIX still points at /usr"
fi
LIBDIRS="$PREFIX/usr/lib/$MULTIARCH:$PREFIX/usr/lib"
export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
row deps ok "$((SECONDS - t))" "${#debs[@]} packages -> $PREFIX"

# ---- 2. NCCL: beside nvcc, in $NCCL_HOME, the system, or PyTorch's pip wheel -------------------
# The CMake project looks for nccl.h and libnccl.so beside nvcc and under $NCCL_HOME. A CUDA
# image without NCCL often still has it as the nvidia-nccl-cu13 wheel (include/ and
# lib/libnccl.so.2, without the unversioned libnccl.so that find_library wants): link that into
# a small NCCL_HOME.
t=$SECONDS
nccl_note=""
if [[ -f "$CUDA_HOME/include/nccl.h" ]] && compgen -G "$CUDA_HOME/lib*/libnccl.so*" >/dev/null; then
  nccl_note="beside nvcc ($CUDA_HOME)"
elif [[ -n "${NCCL_HOME:-}" && -f "$NCCL_HOME/include/nccl.h" ]]; then
  nccl_note="\$NCCL_HOME=$NCCL_HOME"
elif [[ -f /usr/include/nccl.h ]] && compgen -G "/usr/lib/$MULTIARCH/libnccl.so*" >/dev/null; then
  export NCCL_HOME="$PREFIX/nccl"
  mkdir -p "$NCCL_HOME/include" "$NCCL_HOME/lib"
  ln -sf /usr/include/nccl.h /usr/include/nccl_net.h "$NCCL_HOME/include/" 2>/dev/null
  lib="$(ls /usr/lib/$MULTIARCH/libnccl.so* | head -1)"
  ln -sf "$lib" "$NCCL_HOME/lib/libnccl.so"
  nccl_note="system ($lib)"
else
  wheel="$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
  if [[ -n "$wheel" && -f "$wheel/include/nccl.h" ]]; then
    export NCCL_HOME="$PREFIX/nccl"
    mkdir -p "$NCCL_HOME/lib"
    ln -sfn "$wheel/include" "$NCCL_HOME/include"
    lib="$(ls "$wheel"/lib/libnccl.so* | head -1)"
    ln -sf "$lib" "$NCCL_HOME/lib/libnccl.so"
    ln -sf "$lib" "$NCCL_HOME/lib/$(basename "$lib")"
    export LD_LIBRARY_PATH="$NCCL_HOME/lib:$LD_LIBRARY_PATH"
    nccl_note="pip wheel ($wheel)"
  else
    die nccl "no NCCL found (beside nvcc, \$NCCL_HOME, /usr, or python3's nvidia.nccl)"
  fi
fi
row nccl ok "$((SECONDS - t))" "$nccl_note"
}
if [[ -z "$FAKE" ]]; then
  prepare_dependencies
else
  row deps FAKE 0 "GPU_CHECK_FAKE_STEP: no dependencies, no build"
fi

# ---- 3. configure ----------------------------------------------------------------------------
t=$SECONDS
cmake_args=(
  -S "$root" -B "$BUILD" -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DNANODDP_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" "-DCMAKE_CUDA_COMPILER=$NVCC"
  # Each package from the unpacked prefix, named explicitly: no search can wander off to
  # whatever else the image has installed.
  "-DEigen3_DIR=$PREFIX/usr/share/eigen3/cmake"
  "-Dfmt_DIR=$PREFIX/usr/lib/$MULTIARCH/cmake/fmt"
  "-Ddoctest_DIR=$PREFIX/usr/lib/cmake/doctest"
  "-DCLI11_DIR=$PREFIX/usr/share/cmake/CLI11"
  "-Dnlohmann_json_DIR=$PREFIX/usr/share/cmake/nlohmann_json"
  "-DGloo_DIR=$PREFIX/usr/share/cmake/Gloo"
  "-DCMAKE_PREFIX_PATH=$PREFIX/usr"
  "-DCMAKE_INCLUDE_PATH=$PREFIX/usr/include"
  "-DCMAKE_LIBRARY_PATH=$PREFIX/usr/lib/$MULTIARCH;$PREFIX/usr/lib"
  # The linker must find the libraries that libgloo.so itself needs (hiredis, ibverbs, libnl).
  "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$PREFIX/usr/lib/$MULTIARCH:$PREFIX/usr/lib"
  "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,$PREFIX/usr/lib/$MULTIARCH:$PREFIX/usr/lib"
  # CMake 4 (pip's cmake) refuses package files that ask for policies older than 3.5, as
  # doctest's does (cmake_minimum_required(VERSION 3.0)); older CMake ignores this variable.
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5
  # The GPU machine's host compiler may be newer than the dev machine's (GCC 13 adds warnings
  # with false positives, e.g. -Wdangling-reference): a new warning must not cost the one
  # chance to run the GPU tests. configure.log/build.log still show every warning.
  -DNANODDP_WERROR=OFF
  --no-warn-unused-cli
)
# GPU_CHECK_CMAKE_ARGS: extra arguments, e.g. -DCMAKE_IGNORE_PREFIX_PATH=/usr when testing that
# the prefix alone suffices on a machine that also has the packages installed.
read -r -a extra_args <<<"${GPU_CHECK_CMAKE_ARGS:-}"
run_limited 120 10 configure.log cmake "${cmake_args[@]}" "${extra_args[@]}"
rc=$?
((rc == 0)) || die configure "$(verdict $rc): $(why $rc configure.log): $(grep -m1 -A2 'CMake Error' "$LOGS/configure.log" | tr '\n' ' ' | cut -c1-160)"
row configure ok "$((SECONDS - t))" "$BUILD (CUDA archs $ARCHS)"

if [[ "${GPU_CHECK_DEPS_ONLY:-0}" == 1 ]]; then
  # Where each package came from, for whoever tests this part on a machine without a GPU.
  grep -E '^(Eigen3|fmt|doctest|CLI11|nlohmann_json|Gloo)_DIR' "$BUILD/CMakeCache.txt" | tee -a "$LOGS/configure.log"
  finish 0
fi

# ---- 4. build --------------------------------------------------------------------------------
t=$SECONDS
targets=(nanoddp-tests-gpu)
available="$(timeout -k 2 30 cmake --build "$BUILD" --target help 2>/dev/null)"
for target in nanoddp-bench-gemm nanoddp-train nanoddp-run nanoddp-bench-allreduce \
  nanoddp-bench-ddp; do
  if [[ -n "$FAKE" ]] || grep -q "$target" <<<"$available"; then targets+=("$target"); fi
done
if [[ "${GPU_CHECK_BUILD_ALL:-0}" == 1 ]]; then targets=(all); fi
# -k 0: keep going, so that one broken benchmark does not hide the test binary.
run_limited 330 30 build.log cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" -- -k 0
build_rc=$?
if [[ -z "$FAKE" && ! -x "$BUILD/bin/nanoddp-tests-gpu" ]]; then
  die build "$(verdict $build_rc) (rc $build_rc), no nanoddp-tests-gpu; see build.log: $(grep -m1 -E 'error|FAILED' "$LOGS/build.log" | cut -c1-160)"
fi
if ((build_rc == 0)); then
  row build ok "$((SECONDS - t))" "${targets[*]}"
else
  row build "$(verdict $build_rc)" "$((SECONDS - t))" "$(why $build_rc build.log): $(grep -c '^FAILED' "$LOGS/build.log") target(s) failed"
fi
# Whether an executable is there to run (with GPU_CHECK_FAKE_STEP every one is).
have() { [[ -n "$FAKE" || -x "$1" ]]; }

# ---- 5. the GPU tests --------------------------------------------------------------------------
t=$SECONDS
run_limited 240 20 ctest.log ctest --test-dir "$BUILD" -L gpu --output-on-failure -V
ctest_rc=$?
cases="$(grep -E '\[doctest\] test cases:' "$LOGS/ctest.log" | tail -1 | sed 's/.*test cases: *//')"
asserts="$(grep -E '\[doctest\] assertions:' "$LOGS/ctest.log" | tail -1 | sed 's/.*assertions: *//')"
skipped=0
if grep -q 'SKIPPED: GPU tests' "$LOGS/ctest.log"; then
  # On the machine this script is for, a skip means nothing was verified: exit 2 below.
  skipped=1
  row ctest-gpu SKIPPED "$((SECONDS - t))" \
    "$(grep -m1 'SKIPPED' "$LOGS/ctest.log" | sed -E 's/^[0-9]+: //' | cut -c1-160)"
elif ((ctest_rc == 0)); then
  row ctest-gpu ok "$((SECONDS - t))" "cases: $cases; assertions: $asserts"
else
  row ctest-gpu "$(verdict $ctest_rc)" "$((SECONDS - t))" "$(why $ctest_rc ctest.log); cases: ${cases:-?}"
  grep -E 'ERROR:|FATAL ERROR|TEST CASE:' "$LOGS/ctest.log" | head -20 | sed 's/^/    /' >>"$LOGS/ctest-failures.txt"
  [[ -f "$LOGS/ctest-failures.txt" ]] && cat "$LOGS/ctest-failures.txt"
fi

# ---- 6. the GEMM benchmark, then the DDP path on the GPU: training (hand GEMM and cuBLAS), the
# NCCL all-reduce through the launcher, the DDP benchmark. One GPU: a world of one. Its DDP step
# issues no collective (the average over one rank is the gradient itself), so these steps check
# training on the GPU under the launcher; the Reducer's NCCL path (the communication stream and
# its events) is run by ctest above (tests/comm/test_ddp_gpu.cpp asks a world of one to issue
# its collectives), and NCCL itself by nanoddp-bench-allreduce.
extra_fail=0
gpu_step() {  # step cap_seconds log_file executable [args...]
  local step=$1 cap=$2 log=$3 t0=$SECONDS rc
  shift 3
  if ! have "$1"; then
    row "$step" absent 0 "$(basename "$1") was not built"
    extra_fail=1
    return
  fi
  run_limited "$cap" 5 "$log" "$@"
  rc=$?
  if ((rc == 0)); then
    row "$step" ok "$((SECONDS - t0))" "$(tail -1 "$LOGS/$log" | cut -c1-120)"
  else
    row "$step" "$(verdict $rc)" "$((SECONDS - t0))" "$(why $rc "$log")"
    extra_fail=1
  fi
}
# A check in Python over files the steps wrote (the verdict's last line is the note).
py_check() {  # step script args...
  local step=$1 script=$2 rc f
  shift 2
  if [[ -n "$FAKE" ]]; then
    row "$step" FAKE 0 "not checked (GPU_CHECK_FAKE_STEP)"
    return
  fi
  for f in "$@"; do
    if [[ ! -s "$f" ]]; then
      row "$step" SKIPPED 0 "no $(basename "$f") (its step failed or was skipped)"
      extra_fail=1
      return
    fi
  done
  run_limited 30 2 "$step.log" python3 - "$@" <<<"$script"
  rc=$?
  if ((rc == 0)); then
    row "$step" ok 0 "$(tail -1 "$LOGS/$step.log" | cut -c1-140)"
  else
    row "$step" "$(verdict "$rc")" 0 "$(tail -1 "$LOGS/$step.log" | cut -c1-140)"
    extra_fail=1
  fi
}
bin="$BUILD/bin"
gpu_step bench-gemm 120 bench-gemm.log "$bin/nanoddp-bench-gemm" --json "$LOGS/bench-gemm.json"
gpu_step train-hand 60 train-hand.log "$bin/nanoddp-train" --device cuda --gemm hand \
  --in 1024 --out 1024 --hidden 1024 --layers 3 --batch 256 --steps 200 --log-every 50
gpu_step train-cublas 60 train-cublas.log "$bin/nanoddp-train" --device cuda --gemm cublas \
  --in 1024 --out 1024 --hidden 1024 --layers 3 --batch 256 --steps 200 --log-every 50 \
  --metrics "$LOGS/train-cublas-metrics.jsonl"
# How often the host waited for the GPU: one read per logged step is the design; more are a
# host that ran ahead waiting for a staging buffer (reported, not failed: the GPU was busy).
py_check host-syncs '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
print("host syncs per logged window: " +
      ", ".join(f"{l['"'"'host_syncs_per_step'"'"'] * l['"'"'steps_in_window'"'"']:g}" for l in lines))
' "$LOGS/train-cublas-metrics.jsonl"
# The same with the batches prepared on a CPU worker while the GPU computes (compare samples/s).
gpu_step train-prefetch 60 train-prefetch.log "$bin/nanoddp-train" --device cuda --gemm cublas \
  --in 1024 --out 1024 --hidden 1024 --layers 3 --batch 256 --steps 200 --log-every 50 --prefetch
# The optimizer in backward through the Reducer's bucket hook on NCCL (a world of one under
# nanoddp-run): its saved parameters must equal the plain step's, bit for bit.
train_small=("$bin/nanoddp-train" --device cuda --in 256 --out 64 --hidden 512 --layers 3
  --batch 64 --steps 50 --quiet --bucket-cap-mb 0.5 --first-bucket-mb 0.25)
gpu_step train-ddp-step 60 train-ddp-step.log "$bin/nanoddp-run" --nproc-per-node 1 \
  "${train_small[@]}" --save "$SCRATCH/ddp-step.safetensors"
gpu_step train-ddp-inbwd 60 train-ddp-inbwd.log "$bin/nanoddp-run" --nproc-per-node 1 \
  "${train_small[@]}" --optimizer-in-backward --save "$SCRATCH/ddp-inbwd.safetensors"
py_check optimizer-in-backward '
import sys
same = open(sys.argv[1], "rb").read() == open(sys.argv[2], "rb").read()
print("the same bits as the step after backward" if same else "saved parameters differ from the plain step'"'"'s")
sys.exit(0 if same else 1)
' "$SCRATCH/ddp-step.safetensors" "$SCRATCH/ddp-inbwd.safetensors"
# The GPU trains like the CPU: the same seed gives the same initial parameters and data (Philox,
# bit-identical on both), so after 50 SGD steps the saved parameters may differ only by the
# GEMMs' float rounding (another summation order): within 1e-4 of each tensor's largest value.
# (SGD, not AdamW: AdamW's m/sqrt(v) turns a rounding-level sign flip of a near-zero gradient
# into a whole lr-sized step.)
small=(--in 64 --out 16 --hidden 128 --layers 2 --batch 64 --steps 50 --quiet --optimizer sgd
  --lr 0.01 --momentum 0.9)
gpu_step cpu-reference 60 train-cpu-ref.log "$bin/nanoddp-train" --device cpu "${small[@]}" \
  --save "$SCRATCH/params-cpu.safetensors"
compare_params='
import array, json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    return {k: array.array("f", body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}
cpu, gpu = load(sys.argv[1]), load(sys.argv[2])
assert sorted(cpu) == sorted(gpu), (sorted(cpu), sorted(gpu))
worst = max(max(abs(a - b) for a, b in zip(cpu[k], gpu[k])) / max(abs(a) for a in cpu[k])
            for k in cpu)
print(f"max |gpu - cpu| / max |cpu| = {worst:.2e} over {len(cpu)} tensors")
sys.exit(0 if worst <= 1e-4 else 1)
'
for gemm in hand cublas; do
  gpu_step "gpu-$gemm-params" 60 "train-params-$gemm.log" "$bin/nanoddp-train" --device cuda \
    --gemm "$gemm" "${small[@]}" --save "$SCRATCH/params-$gemm.safetensors"
  py_check "cpu-vs-$gemm" "$compare_params" "$SCRATCH/params-cpu.safetensors" \
    "$SCRATCH/params-$gemm.safetensors"
done

# A timeline of DDP on the GPU (device-timed spans: events on the compute stream); the JSON
# comes back in the archive for docs/ and benchmarks/plot/plot_trace.py.
gpu_step train-trace 60 train-trace.log "$bin/nanoddp-run" --nproc-per-node 1 \
  "${train_small[@]}" --trace "$LOGS/gpu-trace.json" --trace-steps 3
py_check gpu-trace '
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
spans = [e for e in events if e.get("ph") == "X"]
backward = sum(e["dur"] for e in spans if e["name"].startswith("backward ")) / 1000.0
comm = sum(e["dur"] for e in spans if e["name"].startswith("all-reduce")) / 1000.0
print(f"{len(spans)} spans; backward {backward:.3f} ms and all-reduce {comm:.3f} ms of GPU time "
      f"over the traced steps")
' "$LOGS/gpu-trace.json"
gpu_step allreduce 60 bench-allreduce-nccl.log "$bin/nanoddp-run" --nproc-per-node 1 \
  "$bin/nanoddp-bench-allreduce" --backend nccl -b 8 -e 256M -f 8 \
  --json "$LOGS/bench-allreduce-nccl.json"
gpu_step bench-ddp 90 bench-ddp.log "$bin/nanoddp-bench-ddp" --device cuda --backend nccl \
  --world 1 --hidden 4096 --layers 4 --batch 256 --bucket-cap-mb 1,25 --steps 20 --warmup 5 \
  --json "$LOGS/bench-ddp.json"

# A build that failed or did not fit may have left an earlier call's binaries behind (a warm
# machine keeps build-gpu/): whatever ran after it, the check did not pass.
if ((ctest_rc != 0 || extra_fail || build_rc != 0)); then finish 1; fi
if ((skipped)); then finish 2; fi
finish 0
