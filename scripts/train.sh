#!/usr/bin/env bash
# The main job, from a fresh machine: install, build, and train with sensible defaults.
# Arguments are passed to nanoddp-train (see build/bin/nanoddp-train --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec build/bin/nanoddp-train "$@"
