#!/usr/bin/env bash
# Installs what nanoddp needs to build and test, from Debian/Ubuntu packages only.
# As root it runs apt-get; otherwise it prints the exact command to run.
# Arguments are extra packages for optional tools (scripts/fuzz.sh passes clang and
# libclang-rt-dev, libFuzzer's runtime).
#
# Opt-in, for the tests that run the real launchers and PyTorch (Skipped without them):
#   NANODDP_WITH_TORCH=1  python3-torch (torch 1.13 and torchrun; about 165 packages, ~1 GB):
#                         the torchrun, TCPStore and PyTorch-parity tests; and OpenBLAS
#                         (libopenblas0-pthread): without it Debian's torch runs on the
#                         reference BLAS, more than 10x slower, which would make
#                         benchmarks/vs-pytorch.sh compare against a crippled PyTorch
#   NANODDP_WITH_MPI=1    openmpi-bin (mpirun; 17 packages): the mpirun test
#   NANODDP_WITH_GDB=1    gdb: a test that gives up on a program prints its threads' stacks
#                         (tests/support/process_snapshot.h; without gdb, /proc's view only);
#                         and strace, whose fault injection widens a race window in one test
# .ci/run sets all three, so CI runs those tests and says where a stuck program was.
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache pkg-config
  libeigen3-dev libfmt-dev doctest-dev libcli11-dev nlohmann-json3-dev libgloo-dev
  python3 python3-numpy python3-matplotlib
  "$@"
)
if [ "${NANODDP_WITH_TORCH:-0}" = 1 ]; then packages+=(python3-torch libopenblas0-pthread); fi
if [ "${NANODDP_WITH_MPI:-0}" = 1 ]; then packages+=(openmpi-bin); fi
if [ "${NANODDP_WITH_GDB:-0}" = 1 ]; then packages+=(gdb strace); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "nanoddp: installing missing packages: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "nanoddp: not root; run this, then try again:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
