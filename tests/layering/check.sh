#!/usr/bin/env bash
# ctest driver for tests/layering: the control case builds; each upward include fails with
# "No such file" for the header of the layer above (not for any other reason).
set -uo pipefail
build_dir=$1
status=0
if ! out=$(cmake --build "$build_dir" --target layering-comm_includes_comm 2>&1); then
  echo "FAIL: the control case (comm includes every layer) does not build:"
  echo "$out" | tail -20
  status=1
fi
for case in kernels_includes_engine:nanoddp/engine/tensor.h engine_includes_nn:nanoddp/nn/module.h \
            nn_includes_comm:nanoddp/comm/ddp.h; do
  name=${case%%:*} header=${case#*:}
  if out=$(cmake --build "$build_dir" --target "layering-$name" 2>&1); then
    echo "FAIL: $name built: a layer can include $header from above it"
    status=1
  elif ! grep -q "$header: No such file" <<<"$out"; then
    echo "FAIL: $name failed, but not because $header is out of reach:"
    echo "$out" | tail -20
    status=1
  else
    echo "ok: $name does not build ($header: No such file or directory)"
  fi
done
exit $status
