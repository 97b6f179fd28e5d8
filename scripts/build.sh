#!/usr/bin/env bash
# Configures and builds nanoddp into build/ (executables in build/bin/). Extra arguments go to
# CMake's configure step, e.g. scripts/build.sh -DNANODDP_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release "$@" >/dev/null
cmake --build --preset release -j "$(nproc)"
