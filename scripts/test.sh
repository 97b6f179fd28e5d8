#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install, build, run every test. GPU tests (label
# `gpu`) report "Skipped" where no CUDA device exists.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
# NANODDP_TEST_RETRIES=N runs a failed test up to N more times (CI sets 1): a test that passes on
# a retry passes the run, and scripts/ci-failures.py lists it as flaky with its failed output.
retries=${NANODDP_TEST_RETRIES:-0}
[[ $retries =~ ^[0-9]+$ ]] || { echo "test.sh: NANODDP_TEST_RETRIES='$retries' is not a count" >&2; exit 2; }
repeat=()
((retries > 0)) && repeat=(--repeat "until-pass:$((retries + 1))")
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600 "${repeat[@]}"
