#!/usr/bin/env bash
# Downloads (does not install) the Debian packages that nanoddp needs to build, into .gpu-debs/
# at the repository root, for scripts/gpu-check.sh to unpack on a GPU machine that has CUDA,
# CMake, ninja and a compiler but none of these -dev packages and no network.
#
# Run it HERE, on a Debian 12 (bookworm) machine that can reach its apt mirror:
#     scripts/gpu-debs.sh
# .gpu-debs/ is git-ignored, so it must be named in the device tool's `carry` list.
#
# The list is the build dependencies plus everything they need at build or run time that a bare
# CUDA image may lack (checked with apt-cache depends): Gloo's shared library needs hiredis and
# libibverbs (and that needs libnl); its headers include hiredis' and libibverbs' headers. libc,
# libstdc++ and libgcc are assumed present (every image with a compiler has them).
set -euo pipefail

readonly PACKAGES=(
  libeigen3-dev      # header-only
  libfmt-dev libfmt9 # fmt::fmt (shared library)
  doctest-dev        # header-only + doctest.cmake (test discovery)
  libcli11-dev       # header-only
  nlohmann-json3-dev # header-only
  libgloo-dev libgloo0
  libhiredis-dev libhiredis0.14
  libibverbs-dev libibverbs1
  libnl-3-200 libnl-route-3-200 libnl-3-dev libnl-route-3-dev
)

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.gpu-debs"
mkdir -p "$dest"
rm -f "$dest"/*.deb

cd "$dest"
if ! apt-get download "${PACKAGES[@]}"; then
  echo "gpu-debs: apt-get download failed; refreshing the package lists and trying once more" >&2
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq
  else
    sudo apt-get update -qq
  fi
  apt-get download "${PACKAGES[@]}"
fi

# A manifest, so that gpu-check.sh can say exactly what it built against.
{
  for deb in *.deb; do
    printf '%s\t%s\t%s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" \
      "$(sha256sum "$deb" | cut -d' ' -f1)"
  done
} >MANIFEST.tsv

debs=(./*.deb)
count=${#debs[@]}
size=$(du -sh . | cut -f1)
echo "gpu-debs: $count packages ($size) in $dest"
echo "gpu-debs: pass \".gpu-debs\" in the device tool's carry list, then run scripts/gpu-check.sh"
