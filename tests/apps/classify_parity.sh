#!/usr/bin/env bash
# nanoddp-train --task classify matches PyTorch number for number: the same starting parameters
# (PyTorch's init, loaded with --init), the same data (int64 labels, and the same as int32) in
# the same order, cross-entropy with SGD+momentum and AdamW, on one process and on two DDP ranks
# with half the batch each, and with --grad-accum 2 (accumulation = the big batch). The loss and
# the train accuracy of every step are compared too. tests/apps/classify_parity.py has the model,
# the data and the bound. Skipped (exit 77) where Debian's python3-torch is not installed.
#
#   tests/apps/classify_parity.sh BIN_DIR
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/torch_python.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" "$here/classify_parity.py" prepare "$work"
common=(--task classify --classes 5 --data "$work/X.npy" --hidden 32 --layers 2 --no-shuffle
  --steps 16 --log-every 1 --quiet --init "$work/init.safetensors")
flags_sgd=(--optimizer sgd --lr 0.1 --momentum 0.9)
flags_adamw=(--optimizer adamw --lr 0.01 --weight-decay 0.01)
status=0
check() {  # RUN CONFIG nanoddp-train arguments...: train, then compare with PyTorch's CONFIG
  local run=$1 config=$2
  shift 2
  "$@" --save "$work/$run.safetensors" --metrics "$work/$run.jsonl" >"$work/$run.log" 2>&1 ||
    { cat "$work/$run.log"; status=1; return; }
  "$python" "$here/classify_parity.py" compare "$work" "$run" "$config" || status=1
}
for optimizer in sgd adamw; do
  flags_name="flags_${optimizer}[@]"
  flags=("${!flags_name}")
  check "one-$optimizer" "$optimizer" timeout 120 "$bin/nanoddp-train" "${common[@]}" \
    --targets "$work/Y.npy" "${flags[@]}" --batch 32
  check "ddp-$optimizer" "$optimizer" timeout 120 "$bin/nanoddp-run" --nproc-per-node 2 \
    "$bin/nanoddp-train" "${common[@]}" --targets "$work/Y32.npy" "${flags[@]}" --batch 16
done
check accum-sgd sgd timeout 120 "$bin/nanoddp-train" "${common[@]}" --targets "$work/Y.npy" \
  "${flags_sgd[@]}" --batch 16 --grad-accum 2
exit $status
