#!/usr/bin/env bash
# Where one CPU training step's time goes, next to the GEMMs it cannot avoid.
#
#   benchmarks/step-anatomy.sh [--hidden H] [--batch B] [--layers L] [--steps N]
#
# Runs, one after the other on this machine:
#   1. nanoddp-bench-gemm for the MLP's three GEMM shapes: the sum of the step's 3(L+1)-1 GEMMs
#      timed one at a time with warm caches (the reference of issue #2's 1.15x target), and the
#      same GEMMs in training order over per-layer buffers (cold caches, as in a step);
#   2. nanoddp-train --in H --out H --hidden H --layers L --batch B --threads 1 with SGD and
#      AdamW, each with the optimizer step after backward and with --optimizer-in-backward;
#      the median of its logged windows of forward_ms, backward_ms, optimizer_ms, step_ms and
#      data_ms (data preparation is not part of the step).
# and prints one table: each phase in ms and the step as a multiple of the warm GEMM sum.
# Measure on an idle machine: the two vCPUs of the dev VM give +-5% from run to run.
set -euo pipefail

hidden=1024 batch=64 layers=3 steps=400
given=" "  # the flags seen: a second --hidden would silently replace the first
while (($#)); do
  case $1 in
    --hidden | --batch | --layers | --steps)
      (($# >= 2)) || { echo "step-anatomy.sh: $1 needs a value (see --help)" >&2; exit 2; }
      [[ $given != *" $1 "* ]] ||
        { echo "step-anatomy.sh: $1 is given twice: give it once" >&2; exit 2; }
      given+="$1 "
      printf -v "${1#--}" '%s' "$2"
      shift 2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "step-anatomy.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for value in "$hidden" "$batch" "$layers" "$steps"; do
  [[ $value =~ ^[0-9]+$ ]] || { echo "step-anatomy.sh: '$value' is not a whole number" >&2; exit 2; }
done
((steps >= 20)) || { echo "step-anatomy.sh: --steps must be at least 20" >&2; exit 2; }
# Checked here, by their own names: bench-gemm would refuse them as its --sizes or --linears.
for limit in hidden:1048576 batch:16777216 layers:999; do
  flag=${limit%%:*} max=${limit#*:}
  value=${!flag}
  ((${#value} <= 8 && 10#$value >= 1 && 10#$value <= max)) ||
    { echo "step-anatomy.sh: --$flag $value is out of range (1 to $max)" >&2; exit 2; }
done

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${NANODDP_BIN_DIR:-$root/build/bin}
for exe in nanoddp-bench-gemm nanoddp-train; do
  [[ -x $bin/$exe ]] || { echo "step-anatomy.sh: $bin/$exe not found: build first" >&2; exit 2; }
done
python=${NANODDP_PYTHON:-/usr/bin/python3}
[[ -x $python ]] || python=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

linears=$((layers + 1))
"$bin/nanoddp-bench-gemm" --batch "$batch" --hidden "$hidden" --linears "$linears" --sizes "$hidden" \
  --json "$work/gemm.jsonl" >"$work/gemm.txt"

log_every=$((steps / 4))
for optimizer in sgd adamw; do
  for mode in after in-backward; do
    extra=()
    [[ $mode == in-backward ]] && extra=(--optimizer-in-backward)
    "$bin/nanoddp-train" --in "$hidden" --out "$hidden" --hidden "$hidden" --layers "$layers" \
      --batch "$batch" --threads 1 --steps "$steps" --log-every "$log_every" \
      --optimizer "$optimizer" --quiet --metrics "$work/$optimizer-$mode.jsonl" \
      ${extra[@]+"${extra[@]}"} >/dev/null
  done
done

"$python" - "$work" "$linears" <<'EOF'
import json, statistics, sys
work, linears = sys.argv[1], int(sys.argv[2])
rows = [json.loads(line) for line in open(f"{work}/gemm.jsonl")]
def ms(name):
    return next(r["median_ms"] for r in rows if r["backend"] == "nanoddp-cpu" and r["shape"] == name)
# One forward GEMM per layer, one weight-gradient GEMM per layer, an input-gradient GEMM for
# every layer but the first.
warm = linears * ms("mlp-forward") + linears * ms("mlp-weight-grad") + (linears - 1) * ms("mlp-input-grad")
cold = ms("mlp-step")
step = next(r for r in rows if r["backend"] == "nanoddp-cpu" and r["shape"] == "mlp-step")
print(f"GEMMs of one step: {warm:.3f} ms warm (one at a time), {cold:.3f} ms in training order "
      f"(cold caches)")
per = lambda total, count: total / count if count else 0.0
print(f"per GEMM, in training order (warm): forward {per(step['forward_ms'], linears):.3f} "
      f"({ms('mlp-forward'):.3f}), input grad {per(step['input_grad_ms'], linears - 1):.3f} "
      f"({ms('mlp-input-grad'):.3f}), weight grad {per(step['weight_grad_ms'], linears):.3f} "
      f"({ms('mlp-weight-grad'):.3f}) ms\n")
print(f"{'optimizer':<10} {'step':<12} {'forward':>8} {'backward':>9} {'optimizer':>10} "
      f"{'step':>8} {'x warm':>7} {'x cold':>7} {'data':>7}")
for optimizer in ("sgd", "adamw"):
    for mode in ("after", "in-backward"):
        lines = [json.loads(l) for l in open(f"{work}/{optimizer}-{mode}.jsonl")][1:]  # no warm-up
        med = {k: statistics.median(l[k] for l in lines)
               for k in ("forward_ms", "backward_ms", "optimizer_ms", "step_ms", "data_ms")}
        print(f"{optimizer:<10} {mode:<12} {med['forward_ms']:>8.3f} {med['backward_ms']:>9.3f} "
              f"{med['optimizer_ms']:>10.3f} {med['step_ms']:>8.3f} {med['step_ms'] / warm:>6.2f}x "
              f"{med['step_ms'] / cold:>6.2f}x {med['data_ms']:>7.3f}")
print("\nms per step, median of the logged windows after the first; x warm / x cold: the step over "
      "the GEMMs' time; with in-backward the updates are part of backward")
EOF
