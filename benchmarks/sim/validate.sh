#!/usr/bin/env bash
# Reproduces the validation in docs/simulator.md: nanoddp-sim's predicted step time against DDP
# runs measured on this machine with 1, 2, 3 and 4 CPU ranks.
#
#   benchmarks/sim/validate.sh [BIN_DIR] [OUT_DIR]      (defaults: build-cpu/bin, a temp dir)
#
# For each world size W:
#   1. nanoddp-bench-allreduce on W ranks (the transport nanoddp-train uses: shared memory on one
#      host, unless NANODDP_SHM=0) -> allreduce-W.jsonl; nanoddp-sim fits alpha and beta to it.
#   2. nanoddp-train on W ranks (W = 1: one plain process, no DDP) with --trace and --metrics.
#   3. Predictions for W ranks, network fitted at W:
#        A   profile from the 1-rank trace (compute measured alone), identical ranks, no core
#            limit: the simulator as it models GPUs;
#        Ac  A with --cores $(nproc): the ranks' compute and communication threads share the
#            cores (docs/simulator.md, "CPU time-sharing");
#        B0  profile from rank 0 of the W-rank trace (compute as it ran beside W-1 other ranks
#            and their communication), identical ranks, no core limit; its scaling baseline is
#            the 1-rank trace's plain step (--baseline-profile), the same 1-process baseline as
#            nanoddp-bench-ddp's (a W-rank profile alone gets no efficiency);
#        B   B0 with --cores $(nproc) and --peers traced: each collective waits for the slowest
#            rank of the trace.
#      Measured: the median step_ms of the metrics (data preparation excluded, step 1 left out).
# Environment: STEPS (default 40), MODEL (default "--hidden 1024 --layers 3 --batch 64"),
# WORLDS (default "1 2 3 4"), EXTRA_TRAIN_ARGS (e.g. "--bucket-cap-mb 1 --first-bucket-mb 0.5").
# The machine is shared: the script prints the load average before each run; rerun when busy.
set -euo pipefail

BIN=${1:-build-cpu/bin}
OUT=${2:-$(mktemp -d /tmp/nanoddp-sim-validate.XXXXXX)}
STEPS=${STEPS:-40}
MODEL=${MODEL:-"--hidden 1024 --layers 3 --batch 64"}
WORLDS=${WORLDS:-"1 2 3 4"}
EXTRA_TRAIN_ARGS=${EXTRA_TRAIN_ARGS:-}
mkdir -p "$OUT"
for exe in nanoddp-train nanoddp-run nanoddp-bench-allreduce nanoddp-sim; do
  [[ -x $BIN/$exe ]] || { echo "validate.sh: $BIN/$exe not found: build first" >&2; exit 2; }
done
# shellcheck disable=SC2206
model=($MODEL)
# shellcheck disable=SC2206
extra=($EXTRA_TRAIN_ARGS)
# The traces' "grad" markers give the simulator the model; the shape flags MODEL sets are passed
# on as a check (the simulator refuses them if they disagree with the markers).
shape=()
for flag in --in --out --hidden --layers; do
  for ((i = 0; i < ${#model[@]}; i++)); do
    [[ ${model[i]} == "$flag" ]] && shape+=("$flag" "${model[i + 1]}")
  done
done
ddp=()
for ((i = 0; i < ${#extra[@]}; i++)); do
  case ${extra[i]} in
    --bucket-cap-mb | --first-bucket-mb) ddp+=("${extra[i]}" "${extra[i + 1]}") ;;
    --no-overlap) ddp+=(--overlap off) ;;
  esac
done

cores=$(nproc)
echo "# output in $OUT; $cores cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
for w in $WORLDS; do
  echo "# W=$w  load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  train=("$BIN/nanoddp-train" "${model[@]}" "${extra[@]}" --steps "$STEPS" --trace-steps "$STEPS"
         --trace "$OUT/trace-$w.json" --metrics "$OUT/metrics-$w.jsonl" --log-every 1 --quiet)
  if [[ $w == 1 ]]; then
    "${train[@]}" > "$OUT/train-1.log"
  else
    "$BIN/nanoddp-run" --nproc-per-node "$w" "$BIN/nanoddp-bench-allreduce" -b 64K -e 32M -f 1.5 \
      -n 30 -w 5 --json "$OUT/allreduce-$w.jsonl" > "$OUT/allreduce-$w.log"
    "$BIN/nanoddp-run" --nproc-per-node "$w" "${train[@]}" > "$OUT/train-$w.log"
  fi
done

echo "# done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

[[ -f $OUT/trace-1.json ]] || { echo "validate.sh: WORLDS must include 1 (prediction A)" >&2; exit 2; }
for w in $WORLDS; do
  net=()
  peers=()
  base=()
  [[ $w != 1 ]] && net=(--fit-allreduce "$OUT/allreduce-$w.jsonl") && peers=(--peers traced) &&
    base=(--baseline-profile "$OUT/trace-1.json")
  sim=("$BIN/nanoddp-sim" "${shape[@]}" "${ddp[@]}" --nodes 1 --gpus-per-node "$w" "${net[@]}")
  "${sim[@]}" --profile "$OUT/trace-1.json" --json "$OUT/sim-A-$w.json" > "$OUT/sim-A-$w.txt"
  "${sim[@]}" --profile "$OUT/trace-1.json" --cores "$cores" --json "$OUT/sim-Ac-$w.json" \
    > "$OUT/sim-Ac-$w.txt"
  "${sim[@]}" --profile "$OUT/trace-$w.json" "${base[@]}" --json "$OUT/sim-B0-$w.json" \
    > "$OUT/sim-B0-$w.txt"
  "${sim[@]}" --profile "$OUT/trace-$w.json" "${base[@]}" --cores "$cores" "${peers[@]}" \
    --json "$OUT/sim-B-$w.json" > "$OUT/sim-B-$w.txt"
done

python3 - "$OUT" $WORLDS <<'EOF'
import json, statistics, sys
out, worlds = sys.argv[1], sys.argv[2:]
def measured(w):
    rows = [json.loads(l) for l in open(f"{out}/metrics-{w}.jsonl")]
    rows = [r for r in rows if r["step"] > 1]
    med = lambda k: statistics.median(r.get(k, 0.0) for r in rows)
    return med("step_ms"), med("comm_ms"), med("exposed_comm_ms")
variants = ("A", "Ac", "B0", "B")
print(f"{'ranks':>5} {'measured':>8}" + "".join(f" {v:>6} {'err':>6}" for v in variants)
      + f" {'comm meas':>9} {'comm B':>6} {'exp meas':>8} {'exp B':>6} {'eff meas':>8} {'eff B':>6}")
step1 = measured(worlds[0])[0] if worlds[0] == "1" else None
pct = lambda e: "n/a" if e is None else f"{100.0 * e:.1f}%"
for w in worlds:
    step, comm, exposed = measured(w)
    pred = {v: json.load(open(f"{out}/sim-{v}-{w}.json"))["step"] for v in variants}
    err = lambda p: 100.0 * (p["step_ms"] - step) / step
    b = pred["B"]
    print(f"{w:>5} {step:>8.2f}" + "".join(f" {pred[v]['step_ms']:>6.2f} {err(pred[v]):>+5.1f}%"
                                            for v in variants)
          + f" {comm:>9.2f} {b['comm_ms']:>6.2f} {exposed:>8.2f} {b['exposed_comm_ms']:>6.2f}"
          + f" {pct(step1 / step if step1 else None):>8} {pct(b['scaling_efficiency']):>6}")
print("(ms; measured = median step_ms of nanoddp-train's metrics, steps 2..N. A = profile of the "
      "1-rank trace; Ac = A with --cores; B0 = profile of the W-rank trace; B = B0 with --cores "
      "and --peers traced; eff = the 1-process step / the W-rank step, measured and B's, both "
      "against the same plain 1-rank baseline)")
EOF
