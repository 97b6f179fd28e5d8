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

# Found by an outside tester. (1) A TERM mid-step: the summary and the archive come out at once,
# not when the running step's own limit ends.
rm -rf "$tmp/out" "$tmp/work"
OUT="$tmp/out" GPU_CHECK_WORK="$tmp/work" GPU_CHECK_BUDGET_S=200 \
  GPU_CHECK_FAKE_STEP="sleep 1" GPU_CHECK_FAKE_HANG=ctest \
  timeout 90 bash "$root/scripts/gpu-check.sh" >"$tmp/stdout" 2>&1 &
pid=$!
sleep 8
start=$SECONDS
kill -TERM "$pid"
wait "$pid"
rc=$?
((SECONDS - start <= 10)) || fail "a TERM took $((SECONDS - start)) s to give the summary"
((rc == 1)) || fail "exit status $rc after a TERM, expected 1"
grep -Eq '^interrupted +FAIL' "$tmp/stdout" || fail "no 'interrupted' row after a TERM"
[[ -f "$tmp/out/gpu-check.tar.gz" && -f "$tmp/out/summary.txt" ]] || fail "no archive after a TERM"
sleep 4  # the stopped step's grace period: nothing of it may be left running
pgrep -f "sleep 1000" >/dev/null && pgrep -af "sleep 1000" | grep -q "$tmp" && fail "the stopped step is still running"

# (2) An $OUT that cannot be written: refused before anything runs.
touch "$tmp/a-file"
OUT="$tmp/a-file/out" GPU_CHECK_WORK="$tmp/work" GPU_CHECK_FAKE_STEP=true \
  timeout 30 bash "$root/scripts/gpu-check.sh" >"$tmp/stdout" 2>&1
rc=$?
((rc == 1)) || fail "exit status $rc with an unwritable OUT, expected 1"
grep -q 'is not a writable folder; nothing was run' "$tmp/stdout" || fail "no message for an unwritable OUT"

# (3) A failed build fails the check, even when every later step passes (a warm machine keeps
# an earlier call's binaries, which the later steps would run).
rm -rf "$tmp/out" "$tmp/work"
OUT="$tmp/out" GPU_CHECK_WORK="$tmp/work" GPU_CHECK_BUDGET_S=200 \
  GPU_CHECK_FAKE_STEP='[ "$GPU_CHECK_STEP_LOG" != build.log ] || exit 3' \
  timeout 60 bash "$root/scripts/gpu-check.sh" >"$tmp/stdout" 2>&1
rc=$?
grep -Eq '^build +FAIL' "$tmp/stdout" || fail "the failed build has no FAIL row"
((rc == 1)) || fail "exit status $rc after a failed build, expected 1"
# (4) A step that floods its log: the archive stays under the device tool's 16 MiB.
rm -rf "$tmp/out" "$tmp/work"
OUT="$tmp/out" GPU_CHECK_WORK="$tmp/work" GPU_CHECK_BUDGET_S=200 \
  GPU_CHECK_FAKE_STEP='[ "$GPU_CHECK_STEP_LOG" != build.log ] || head -c 40000000 /dev/urandom | base64' \
  timeout 60 bash "$root/scripts/gpu-check.sh" >"$tmp/stdout" 2>&1
size=$(stat -c %s "$tmp/out/gpu-check.tar.gz")
((size < 16 * 1024 * 1024)) || fail "the archive is $size bytes, over the tool's 16 MiB"
tar -xzf "$tmp/out/gpu-check.tar.gz" -C "$tmp" logs/build.log || fail "no build.log in the archive"
grep -q "cut by gpu-check.sh" "$tmp/logs/build.log" || fail "the flooded log was not cut"

# (5) A budget that is not a number is refused with a message.
GPU_CHECK_BUDGET_S=abc OUT="$tmp/out" timeout 10 bash "$root/scripts/gpu-check.sh" >"$tmp/stdout" 2>&1
(($? == 1)) || fail "GPU_CHECK_BUDGET_S=abc: exit status, expected 1"
grep -q "not a whole number of seconds" "$tmp/stdout" || fail "GPU_CHECK_BUDGET_S=abc: no message"
echo "ok: a TERM gives the summary at once; an unwritable OUT is refused; a failed build fails;" \
  "a flooded log is cut under 16 MiB; a bad budget is refused"
