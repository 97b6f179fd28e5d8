#!/usr/bin/env bash
# Installs what nanoddp needs to build and test, from Debian/Ubuntu packages only.
# As root it runs apt-get; otherwise it prints the exact command to run.
# Arguments are extra packages for optional tools (scripts/fuzz.sh passes clang and
# libclang-rt-dev, libFuzzer's runtime).
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache pkg-config
  libeigen3-dev libfmt-dev doctest-dev libcli11-dev nlohmann-json3-dev libgloo-dev
  python3 python3-numpy python3-matplotlib
  "$@"
)

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
