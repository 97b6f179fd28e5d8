#!/usr/bin/env bash
# The CPU test suite under sanitizers (docs/ci.md):
#   build-asan/  AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer
#   build-tsan/  ThreadSanitizer
# Both are built with CUDA off (nvcc takes no -fsanitize) and without -Werror (the normal build
# is the one that holds the warnings; GCC warns falsely under the sanitizers), and run
# `ctest -L cpu`. Every
# executable in a build directory is instrumented, so the workers that tests start
# (nanoddp-train, nanoddp-run, the comm test workers) are checked too.
#
# Usage: scripts/test-sanitizers.sh [asan] [tsan]      (default: both)
# Environment: NANODDP_SANITIZER_JOBS (ctest -j, default nproc).
#
# How a finding fails the run, even in a child process whose exit code a test does not look at:
# each report goes to a file (log_path) in build-<config>/sanitizer-logs/ as well as making the
# process exit with code 66 (halt_on_error); after ctest the script prints every report file
# and fails when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/install-deps.sh

configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(asan tsan)
jobs=${NANODDP_SANITIZER_JOBS:-$(nproc)}
# As scripts/test.sh: a failed test runs up to NANODDP_TEST_RETRIES more times.
retries=${NANODDP_TEST_RETRIES:-0}
[[ $retries =~ ^[0-9]+$ ]] || { echo "test-sanitizers.sh: NANODDP_TEST_RETRIES='$retries' is not a count" >&2; exit 2; }
repeat=()
((retries > 0)) && repeat=(--repeat "until-pass:$((retries + 1))")

# Tests excluded under sanitizers, with the reason:
#   consumer-find-package (label `install`): installs libnanoddp.a and builds an outside
#   project against it with plain flags; an instrumented static library does not link there
#   without the sanitizer runtime, and it tests packaging, not memory or thread safety.
exclude_labels=install
#   The tests whose subject is a program the sanitizers do not instrument, and which are among
#   the slowest under them (about 190 s of each sanitizer's test time on the CI machine, whose
#   run of 2026-12-04 reached CI's budget): PyTorch's torchrun and OpenMPI's mpirun starting
#   nanoddp's programs (the same programs run under the sanitizers in every other launcher
#   test), and scripts/gpu-check.sh (a shell script's time budget). They run in the normal suite.
launcher_names="^apps: torchrun \\(static|^apps: mpirun -np 2 without|^multinode-elastic-torchrun$|^scripts: gpu-check.sh"
# (Under TSan "comm:store: add is atomic across processes" used to be excluded: it forked from a
# process whose store server thread was running, and a child now and then deadlocked inside
# TSan's malloc. The test now forks before the server starts; 30 TSan runs, 0 hangs.)

overall=0
summary=()
for config in "${configs[@]}"; do
  case $config in
    # The test that takes every file descriptor on purpose does not run under UBSan: UBSan's vptr
    # check confirms an object is readable through a pipe, which then fails, and it reports valid
    # objects (a ShmError, fmt's buffer) as "invalid vptr". It runs in the normal suite and
    # under TSan.
    asan) sanitize=address,undefined openmp=ON exclude_names="no file descriptor left|$launcher_names" ;;
    # No OpenMP under TSan: libgomp is not instrumented, so TSan cannot see its barriers and
    # reports races between Eigen's GEMM threads that are not there. nanoddp's GEMM runs one
    # thread unless --threads asks for more, and without OpenMP Eigen stays single-threaded.
    tsan) sanitize=thread openmp=OFF exclude_names="$launcher_names" ;;
    *) echo "test-sanitizers: unknown configuration '$config' (asan or tsan)" >&2; exit 2 ;;
  esac
  dir=build-$config
  logs=$root/$dir/sanitizer-logs
  echo "== $config: configure and build $dir (NANODDP_SANITIZE=$sanitize)"
  start=$SECONDS
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
    -DNANODDP_CUDA=OFF -DNANODDP_SANITIZE=$sanitize -DNANODDP_OPENMP=$openmp \
    -DNANODDP_WERROR=OFF >/dev/null
  cmake --build "$dir" -j "$(nproc)"
  build_s=$((SECONDS - start))

  rm -rf "$logs" && mkdir -p "$logs"
  # halt_on_error: the first finding ends the process with exit code 66, which the tests see as
  # a failed worker (or a failed test process). detect_leaks: LeakSanitizer works here (it needs
  # ptrace-less stop-the-world, which runs as root and in containers without extra rights).
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:exitcode=66:log_path=$logs/asan:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
  export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=66:log_path=$logs/ubsan"
  # Suppressions for uninstrumented third-party code only (Gloo, libgomp): see the file.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:exitcode=66:log_path=$logs/tsan:suppressions=$root/tests/sanitizers/tsan.supp:print_suppressions=0"
  echo "== $config: ctest -L cpu -LE $exclude_labels"
  start=$SECONDS
  rc=0
  ctest --test-dir "$dir" -L cpu -LE "$exclude_labels" ${exclude_names:+-E "$exclude_names"} \
    --output-on-failure -j "$jobs" --timeout 600 "${repeat[@]}" || rc=$?
  test_s=$((SECONDS - start))
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS

  reports=$(find "$logs" -type f | sort)
  if [ -n "$reports" ]; then
    echo "== $config: sanitizer reports (also from processes whose exit code no test checked):"
    for f in $reports; do
      echo "---- $f"
      cat "$f"
    done
    rc=1
  fi
  result=passed
  [ $rc -ne 0 ] && result=FAILED && overall=1
  summary+=("$config: build ${build_s}s, tests ${test_s}s, $result")
done

echo "== sanitizers:"
printf '  %s\n' "${summary[@]}"
exit $overall
