#!/usr/bin/env bash
# Fuzzing with libFuzzer (docs/ci.md): builds the targets in fuzz/ with clang, ASan and UBSan
# into build-fuzz/ (CUDA off), replays fuzz/regressions/<target>/ (inputs that once crashed),
# then fuzzes each target for a bounded time starting from fuzz/corpus/<target>/.
#
# Usage: scripts/fuzz.sh [TARGET...]     (default: store_protocol torch_store_protocol safetensors npy)
# Environment: NANODDP_FUZZ_SECONDS   seconds per target (default 60)
#              NANODDP_FUZZ_SEED      libFuzzer's -seed (default 1, so CI retraces the same path
#                                     from the same corpus; 0 = a random seed, for exploring)
#
# New inputs libFuzzer finds go to build-fuzz/corpus/<target>/ (not into the repository). A
# crash leaves its input in build-fuzz/artifacts/<target>/ and fails the script: fix the code,
# then copy the input to fuzz/regressions/<target>/ so it is replayed from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# clang and libFuzzer's runtime (Debian 12: libclang-rt-dev, libclang-rt-14-dev).
scripts/install-deps.sh clang libclang-rt-dev

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(store_protocol torch_store_protocol safetensors npy)
seconds=${NANODDP_FUZZ_SECONDS:-60}
seed=${NANODDP_FUZZ_SEED:-1}
dir=build-fuzz

start=$SECONDS
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DNANODDP_CUDA=OFF -DNANODDP_FUZZ=ON -DNANODDP_SANITIZE=address,undefined \
  -DNANODDP_BUILD_TESTS=OFF -DNANODDP_BUILD_APPS=OFF -DNANODDP_OPENMP=OFF >/dev/null
# The build's lines go to a file (CI keeps only the log's tail); printed when the build fails.
if ! cmake --build "$dir" -j "$(nproc)" --target "${targets[@]/#/fuzz-}" >"$dir/build.log" 2>&1; then
  tail -n 80 "$dir/build.log"
  echo "== fuzz: the build failed (whole log: $dir/build.log)"
  exit 1
fi
echo "== fuzz: built in $((SECONDS - start))s"

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
overall=0
summary=()
for t in "${targets[@]}"; do
  fuzzer=$root/$dir/bin/fuzz-$t
  result=passed
  # 1. The regressions: every file once; any crash fails.
  mapfile -t regressions < <(find "fuzz/regressions/$t" -type f 2>/dev/null | sort)
  if [ ${#regressions[@]} -gt 0 ]; then
    echo "== fuzz $t: replaying ${#regressions[@]} regression input(s)"
    if ! "$fuzzer" "${regressions[@]}" >"$dir/replay-$t.log" 2>&1; then
      cat "$dir/replay-$t.log"
      result="FAILED (a regression input crashes again)"
    fi
  fi
  # 2. Fuzzing for a bounded time from the seed corpus.
  corpus=$dir/corpus/$t artifacts=$dir/artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  echo "== fuzz $t: ${seconds}s"
  if ! "$fuzzer" -seed="$seed" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "fuzz/corpus/$t" \
      >"$dir/fuzz-$t.log" 2>&1; then
    tail -n 60 "$dir/fuzz-$t.log"
    result="FAILED (crash input in $artifacts/)"
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/fuzz-$t.log" | tail -1)
  [ "$result" = passed ] || overall=1
  summary+=("$t: ${execs:-?} runs in ${seconds}s, $result")
done
echo "== fuzz:"
printf '  %s\n' "${summary[@]}"
exit $overall
