#!/usr/bin/env bash
# nanoddp-train matches PyTorch number for number: the same starting parameters (PyTorch's
# init, loaded with --init), the same data (.npy) in the same order, SGD with momentum and
# AdamW, for one process and for two DDP ranks with half the batch each (DDP = the big batch);
# tanh-GELU; and --grad-accum 2 with half the batch (accumulation = the big batch).
# tests/apps/pytorch_parity.py has the model, the data and the bound. Skipped (exit 77) where
# Debian's python3-torch is not installed.
#
#   tests/apps/pytorch_parity.sh BIN_DIR
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/torch_python.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" "$here/pytorch_parity.py" prepare "$work"
common=(--data "$work/X.npy" --targets "$work/Y.npy" --hidden 32 --layers 2 --no-shuffle
  --steps 16 --log-every 1 --quiet --init "$work/init.safetensors")
flags_sgd=(--optimizer sgd --lr 0.05 --momentum 0.9)
flags_adamw=(--optimizer adamw --lr 0.01 --weight-decay 0.01)
status=0
check() {  # RUN CONFIG nanoddp-train arguments...: train, then compare with PyTorch's CONFIG
  local run=$1 config=$2
  shift 2
  "$@" --save "$work/$run.safetensors" --metrics "$work/$run.jsonl" >"$work/$run.log" 2>&1 ||
    { cat "$work/$run.log"; status=1; return; }
  "$python" "$here/pytorch_parity.py" compare "$work" "$run" "$config" || status=1
}
for optimizer in sgd adamw; do
  flags_name="flags_${optimizer}[@]"
  flags=("${!flags_name}")
  check "one-$optimizer" "$optimizer" timeout 120 "$bin/nanoddp-train" "${common[@]}" \
    "${flags[@]}" --batch 32
  check "ddp-$optimizer" "$optimizer" timeout 120 "$bin/nanoddp-run" --nproc-per-node 2 \
    "$bin/nanoddp-train" "${common[@]}" "${flags[@]}" --batch 16
done
check one-gelu sgd-gelu timeout 120 "$bin/nanoddp-train" "${common[@]}" "${flags_sgd[@]}" \
  --batch 32 --activation gelu
check accum-sgd sgd timeout 120 "$bin/nanoddp-train" "${common[@]}" "${flags_sgd[@]}" \
  --batch 16 --grad-accum 2
exit $status
