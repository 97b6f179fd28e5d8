#!/usr/bin/env bash
# The research ops (engine/functional.h) agree with PyTorch: nanoddp's engine tests write each
# op's inputs, output and gradients; tests/engine/torch_ops.py recomputes them with torch in
# float64. Skipped (exit 77) where python3-torch is not installed.
#
#   tests/engine/torch_ops.sh BIN_DIR
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/torch_python.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
NANODDP_SOURCE_DIR="$here/../.." NANODDP_TORCH_OPS_OUT="$work/cases.json" \
  timeout 120 "$bin/nanoddp-tests-engine" -tc="functional: cases for the PyTorch comparison" >"$work/log" 2>&1 ||
  { cat "$work/log"; exit 1; }
"$python" "$here/torch_ops.py" "$work/cases.json"
