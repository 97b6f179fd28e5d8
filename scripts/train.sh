#!/usr/bin/env bash
# The main job, from a fresh machine: install, build, and train an MLP with DDP on 2 CPU
# processes (nanoddp-run starts the ranks; Gloo reduces the gradients). Arguments are passed to
# nanoddp-train (see build/bin/nanoddp-train --help); NANODDP_NPROC changes the process count.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec build/bin/nanoddp-run --nproc-per-node "${NANODDP_NPROC:-2}" build/bin/nanoddp-train "$@"
