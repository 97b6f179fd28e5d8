#!/usr/bin/env bash
# scripts/ci-failures.py on a real ctest run of a tiny project: a test that always fails, one
# that fails once and passes on the retry (ctest --repeat until-pass:2, as NANODDP_TEST_RETRIES=1
# asks), one that passes and one that is skipped. The recap names the first as failed and the
# second as flaky, each with its failed attempt's output, and exits 1; a log older than --since
# is ignored.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  echo "---- recap"
  cat "$tmp/recap"
  exit 1
}
mkdir -p "$tmp/src"
cat >"$tmp/src/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(recap NONE)
enable_testing()
add_test(NAME "passes" COMMAND sh -c "echo fine")
add_test(NAME "flaky: fails once" COMMAND sh -c "if [ -f $tmp/marker ]; then echo second; else touch $tmp/marker; echo first attempt failed; exit 1; fi")
add_test(NAME "always fails" COMMAND sh -c "for i in 1 2 3 4 5; do echo line \\\$i; done; exit 3")
add_test(NAME "skipped" COMMAND sh -c "exit 77")
set_tests_properties("skipped" PROPERTIES SKIP_RETURN_CODE 77)
CMAKE
cmake -S "$tmp/src" -B "$tmp/build" >/dev/null || fail "configure"
start=$(date +%s)
ctest --test-dir "$tmp/build" --repeat until-pass:2 >/dev/null 2>&1
python3 "$root/scripts/ci-failures.py" --lines 2 --slowest 0 --since "$start" "$tmp/build" >"$tmp/recap"
rc=$?
((rc == 1)) || fail "exit status $rc, expected 1"
grep -q "^==== failed in $tmp/build: 1$" "$tmp/recap" || fail "no 'failed: 1' section"
grep -q "^==== failed, then passed on a retry (flaky) in $tmp/build: 1$" "$tmp/recap" ||
  fail "no flaky section"
grep -q "^---- always fails (the failed attempt's last 2 of 5 lines)$" "$tmp/recap" ||
  fail "the failed test's tail is not announced"
grep -q "^  | line 5$" "$tmp/recap" || fail "the failed test's last line is missing"
grep -q "^  | line 3$" "$tmp/recap" && fail "more than --lines 2 lines printed"
grep -q "^  | first attempt failed$" "$tmp/recap" || fail "the flaky test's failed output is missing"
grep -q "passes\|skipped" "$tmp/recap" && fail "a passed or skipped test is listed"
# Where the time went: every test of the run, slowest first, with the total (the default).
python3 "$root/scripts/ci-failures.py" --since "$start" "$tmp/build" >"$tmp/recap"
grep -q "^==== $tmp/build: 4 tests, [0-9]* s of test time; the slowest 4:$" "$tmp/recap" ||
  fail "no slowest-tests section"
grep -q "^ *[0-9.]* s  passes$" "$tmp/recap" || fail "a test is missing from the slowest list"
python3 "$root/scripts/ci-failures.py" --since "$((start + 3600))" "$tmp/build" >"$tmp/recap"
rc=$?
((rc == 0)) && [[ ! -s "$tmp/recap" ]] || fail "a log from before --since was read (exit $rc)"
echo "ok: failed and flaky tests recapped with their output"
