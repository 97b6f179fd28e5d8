#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install, build, run every test. GPU tests (label
# `gpu`) report "Skipped" where no CUDA device exists.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 600
