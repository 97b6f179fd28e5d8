#!/usr/bin/env bash
# TorchStore against the real torch.distributed.TCPStore (tests/comm/torch_store.py). Skipped
# (exit 77) where Debian's python3-torch is not installed.
#
#   tests/comm/torch_store.sh BIN_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/torch_python.sh"
timeout 120 "$python" "$here/torch_store.py" "$1/nanoddp-test-torch-store"
