# Sourced by the tests that run the real PyTorch (tests/apps/pytorch_parity.sh,
# tests/benchmarks/vs_pytorch.sh): sets $python to an interpreter that imports torch and numpy
# (NANODDP_PYTHON, else Debian's /usr/bin/python3), or ends the test as Skipped (exit 77, which
# ctest's SKIP_RETURN_CODE reports) saying what to install.
python=${NANODDP_PYTHON:-/usr/bin/python3}
if ! "$python" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: PyTorch is not importable by $python (apt-get install python3-torch)"
  exit 77
fi
