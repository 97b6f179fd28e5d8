#!/usr/bin/env bash
# scripts/gpu-check.sh's orchestration without a GPU (GPU_CHECK_FAKE_STEP): with a 45 s budget
# and the GPU tests hanging, the script must end inside the budget, print every step's row as
# it ends and the summary, skip the steps that no longer fit, and leave in $OUT only what the
# device tool returns (at most 8 files): one archive holding the logs, and summary.txt.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  echo "---- output"
  cat "$tmp/stdout"
  exit 1
}

budget=45
start=$SECONDS
OUT="$tmp/out" GPU_CHECK_WORK="$tmp/work" GPU_CHECK_BUDGET_S=$budget \
  GPU_CHECK_FAKE_STEP="sleep 1" GPU_CHECK_FAKE_HANG=ctest \
  timeout 90 bash "$root/scripts/gpu-check.sh" >"$tmp/stdout" 2>&1
rc=$?
elapsed=$((SECONDS - start))

((rc == 1)) || fail "exit status $rc, expected 1 (a step timed out)"
((elapsed <= budget)) || fail "took ${elapsed} s, past the ${budget} s budget"
grep -q '^---- summary' "$tmp/stdout" || fail "no summary on stdout"
# The row of each step is printed when it ends, before the summary repeats it.
first_row="$(grep -n '^configure  *ok' "$tmp/stdout" | head -1 | cut -d: -f1)"
summary_at="$(grep -n '^---- summary' "$tmp/stdout" | cut -d: -f1)"
[[ -n "$first_row" && "$first_row" -lt "$summary_at" ]] || fail "the configure row was not printed as it ended"
grep -Eq '^ctest-gpu +TIMEOUT' "$tmp/stdout" || fail "the hanging GPU tests were not stopped by their limit"
grep -Eq '^bench-gemm +SKIPPED .*budget left' "$tmp/stdout" ||
  fail "the step after the hang was not skipped for the budget"
grep -Eq '^bench-ddp +SKIPPED' "$tmp/stdout" || fail "the last step was not skipped"

mapfile -t files < <(cd "$tmp/out" && find . -type f | sort)
[[ "${files[*]}" == "./gpu-check.tar.gz ./summary.txt" ]] ||
  fail "\$OUT holds ${files[*]}, expected the archive and summary.txt"
tar -tzf "$tmp/out/gpu-check.tar.gz" >"$tmp/listing" || fail "the archive does not open"
for name in logs/summary.txt logs/configure.log logs/ctest.log logs/bench-gemm.log; do
  grep -qx "$name" "$tmp/listing" || fail "$name is not in the archive"
done
echo "ok: ended after ${elapsed} s of a ${budget} s budget; \$OUT: ${files[*]}"
