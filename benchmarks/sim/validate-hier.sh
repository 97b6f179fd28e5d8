#!/usr/bin/env bash
# The simulator against two runs it did not see (docs/simulator.md, "Validation", part 3):
#   shm   W = 2 ranks on one host (gloo+shm)
#   hier  2 "nodes" x 2 ranks: two network namespaces joined by a veth pair
#         (tests/support/two_node_netns.sh), the hierarchical all-reduce (gloo+shm+hier)
# Both predictions come from inputs measured apart from the runs they predict:
#   1. contention: nanoddp-bench-gemm's mlp-step row (the GEMMs of one training step, cold
#      caches) alone, then 2 copies at once, twice each; F = median(pair) / median(alone) of
#      the row's wall time, and F_cpu = the same ratio of each process's CPU time (user + sys,
#      /usr/bin/time): memory stalls count in CPU time, another process's time slices do not,
#      so F_cpu holds on a shared machine where the wall-clock ratio also counts time-sharing;
#      F_opt, the optimizer's: the CPU-time ratio of a 1-rank job whose step streams memory
#      (nanoddp-train --hidden 2048 --layers 3 --batch 1), alone and 2 at once
#   2. trace-1.json: a 1-rank nanoddp-train trace (the compute profile)
#   3. shm-2.jsonl: nanoddp-bench-allreduce on 2 ranks on one host (shared memory)
#   4. tcp-2.jsonl: nanoddp-bench-allreduce on 2 ranks, one per namespace (nanoddp's TCP ring over
#      the veth pair: what the leaders run in the hierarchical all-reduce's step 2)
# and the measured runs: 5. nanoddp-train on 2 ranks (shm); 6. nanoddp-train on 2 x 2 (hier).
# Measured = the median step_ms of rank 0's metrics (step 1 left out).
#
#   sudo benchmarks/sim/validate-hier.sh [BIN_DIR] [OUT_DIR]   (defaults: build/bin, a temp dir)
#   PREDICT_ONLY=1 benchmarks/sim/validate-hier.sh BIN_DIR OUT_DIR   (predictions again, no runs)
#   CALIBRATE_ONLY=1 benchmarks/sim/validate-hier.sh BIN_DIR CAL_DIR  (step 1 alone); then
#   PREDICT_ONLY=1 CALIBRATION_DIR=CAL_DIR ... OUT_DIR predicts with those factors
# Needs root for the namespaces (ip netns); they are removed on exit. Environment: STEPS (40),
# MODEL ("--hidden 1024 --layers 3 --batch 64"). The machine may be shared: the load average is
# printed before every measurement; read the figures with it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
BIN=${1:-$root/build/bin}
OUT=${2:-$(mktemp -d /tmp/nanoddp-sim-hier.XXXXXX)}
STEPS=${STEPS:-40}
MODEL=${MODEL:-"--hidden 1024 --layers 3 --batch 64"}
# shellcheck disable=SC2206
model=($MODEL)
mkdir -p "$OUT"
for exe in nanoddp-train nanoddp-run nanoddp-bench-allreduce nanoddp-bench-gemm nanoddp-sim; do
  [[ -x $BIN/$exe ]] || { echo "validate-hier.sh: $BIN/$exe not found: build first" >&2; exit 2; }
done
load() { echo "# $1  $(date -u '+%H:%M:%S UTC')  load average: $(cut -d' ' -f1-3 /proc/loadavg)" |
           tee -a "$OUT/load.txt"; }
train=("$BIN/nanoddp-train" "${model[@]}" --steps "$STEPS" --log-every 1)
bench=("$BIN/nanoddp-bench-allreduce" -b 64K -e 32M -f 1.5 -n 30 -w 5)

calibrate() {
  # 1. Contention: the hidden width and batch of MODEL; 4 Linear layers as nanoddp-bench-gemm's
  # mlp-step row has them.
  local hidden=1024 batch=64 i round a b
  for ((i = 0; i < ${#model[@]}; i++)); do
    [[ ${model[i]} == --hidden ]] && hidden=${model[i + 1]}
    [[ ${model[i]} == --batch ]] && batch=${model[i + 1]}
  done
  local gemm=(timeout 300 "$BIN/nanoddp-bench-gemm" --sizes 64 --batch "$batch" --hidden "$hidden"
              --linears 4 --repeats 40 --warmup 5 --threads 1)
  timed() {  # NAME: one copy, its CPU seconds in NAME.cpu
    /usr/bin/time -f "%U %S" -o "$OUT/$1.cpu" "${gemm[@]}" --json "$OUT/$1.jsonl" > "$OUT/$1.log"
  }
  # The optimizer's factor: a 1-rank job whose whole step streams memory (batch 1: the GEMMs
  # are matrix-vector products; AdamW over 12.6 M parameters), alone and 2 at once.
  local stream=(timeout 300 "$BIN/nanoddp-train" --hidden 2048 --layers 3 --batch 1 --steps 200
                --log-every 1)
  streamed() {  # NAME
    /usr/bin/time -f "%U %S" -o "$OUT/$1.cpu" "${stream[@]}" --metrics "$OUT/$1.jsonl" \
      > "$OUT/$1.log"
  }
  load "contention"
  for round in 1 2; do
    timed "gemm-alone-$round"
    timed "gemm-pair-$round-a" &
    a=$!
    timed "gemm-pair-$round-b" &
    b=$!
    wait $a
    wait $b
    streamed "stream-alone-$round"
    streamed "stream-pair-$round-a" &
    a=$!
    streamed "stream-pair-$round-b" &
    b=$!
    wait $a
    wait $b
  done
}

if [[ -n ${CALIBRATE_ONLY:-} ]]; then
  echo "# calibration only, into $OUT; $(date -u '+%Y-%m-%d')"
  calibrate
elif [[ -z ${PREDICT_ONLY:-} ]]; then
  : > "$OUT/load.txt"
  echo "# output in $OUT; $(nproc) cores; $(date -u '+%Y-%m-%d')"
  calibrate
  # 2.-5. on one host.
  load "trace-1"
  timeout 600 "${train[@]}" --trace "$OUT/trace-1.json" --trace-steps "$STEPS" \
    --metrics "$OUT/metrics-1.jsonl" > "$OUT/train-1.log"
  load "shm-2 (all-reduce)"
  timeout 600 "$BIN/nanoddp-run" --nproc-per-node 2 "${bench[@]}" --json "$OUT/shm-2.jsonl" \
    > "$OUT/shm-2.log"
  load "measured shm W=2"
  timeout 600 "$BIN/nanoddp-run" --nproc-per-node 2 "${train[@]}" \
    --metrics "$OUT/metrics-shm.jsonl" > "$OUT/train-shm.log"

  # 4. and 6. across two namespaces.
  source "$root/tests/support/two_node_netns.sh"
  two_node_netns_up s 10.231.17
  export NANODDP_TIMEOUT_S=120
  on_both() {  # NAME PORT PROCS NODE0-ONLY-ARGS -- ARGS...
    local name=$1 port=$2 procs=$3 node0=$4 rc=0
    shift 5
    local job=(--nnodes 2 --nproc-per-node "$procs" --master-addr "$addr_a" --master-port "$port")
    # shellcheck disable=SC2086
    timeout 600 ip netns exec "$ns_a" "$BIN/nanoddp-run" --node-rank 0 "${job[@]}" "$@" $node0 \
      > "$OUT/$name-0.log" 2>&1 &
    local a=$!
    timeout 600 ip netns exec "$ns_b" "$BIN/nanoddp-run" --node-rank 1 "${job[@]}" "$@" \
      > "$OUT/$name-1.log" 2>&1 &
    local b=$!
    wait $a || rc=$?
    wait $b || rc=$?
    [[ $rc == 0 ]] || { echo "validate-hier.sh: $name exited $rc" >&2;
                         tail -20 "$OUT/$name-0.log" "$OUT/$name-1.log" >&2; exit 1; }
  }
  load "tcp-2 (all-reduce, one rank per namespace)"
  on_both tcp 29771 1 "--json $OUT/tcp-2.jsonl" -- "${bench[@]}"
  load "measured hier 2x2"
  on_both hier 29772 2 "--metrics $OUT/metrics-hier.jsonl" -- "${train[@]}"
  grep -q "backend gloo+shm+hier" "$OUT/hier-0.log" ||
    { echo "validate-hier.sh: the 2 x 2 run did not use gloo+shm+hier" >&2; exit 1; }
  load "done"
fi

# Predictions. The contention factors from step 1 (CALIBRATION_DIR: another run's step 1).
CAL=${CALIBRATION_DIR:-$OUT}
read -r F FCPU FOPT < <(python3 - "$CAL" <<'EOF'
import glob, json, statistics, sys
cal = sys.argv[1]
def wall(path):
    for line in open(path):
        r = json.loads(line)
        if r.get("shape") == "mlp-step" and r.get("backend") == "nanoddp-cpu":
            return r["median_ms"]
    raise SystemExit(f"no nanoddp-cpu mlp-step row in {path}")
def cpu(path):
    user, system = open(path).read().split()[-2:]
    return float(user) + float(system)
def ratio(value, ext, what="gemm"):
    alone = statistics.median(value(p) for p in glob.glob(f"{cal}/{what}-alone-*.{ext}"))
    pair = statistics.median(value(p) for p in glob.glob(f"{cal}/{what}-pair-*.{ext}"))
    return f"{max(1.0, pair / alone):.3f}"
print(ratio(wall, "jsonl"), ratio(cpu, "cpu") if glob.glob(f"{cal}/gemm-*.cpu") else "-",
      ratio(cpu, "cpu", "stream") if glob.glob(f"{cal}/stream-*.cpu") else "-")
EOF
)
echo "# contention from $CAL: F = $F (wall time of 2 GEMM copies at once / one alone)," \
  "F_cpu = $FCPU (their CPU time), F_opt = $FOPT (CPU time of 2 streaming 1-rank jobs)"
[[ -n ${CALIBRATE_ONLY:-} ]] && exit 0
rm -f "$OUT"/sim-shm-*.json "$OUT"/sim-shm-*.txt "$OUT"/sim-hier-*.json "$OUT"/sim-hier-*.txt
variants=("none:" "F:--mem-contention $F")
[[ $FCPU != - ]] && variants+=("Fcpu:--mem-contention $FCPU")
[[ $FCPU != - && $FOPT != - ]] &&
  variants+=("Fopt:--mem-contention $FCPU --opt-contention $FOPT")
# W = 2 on one host: 2 cores; the fit's ranks and the profile measured on the same host.
# 2 x 2: the two "nodes" share this host's cores, so each has nproc / 2 of them; the inputs were
# measured on the whole host (--measured-cores).
node_cores=$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))
sim=("$BIN/nanoddp-sim" --profile "$OUT/trace-1.json")
shm=(--nodes 1 --gpus-per-node 2 --fit-allreduce "$OUT/shm-2.jsonl" --cores "$(nproc)")
hier=(--nodes 2 --gpus-per-node 2 --algo hier --fit-intra "$OUT/shm-2.jsonl"
      --fit-inter "$OUT/tcp-2.jsonl" --cores "$node_cores" --measured-cores "$(nproc)")
for v in "${variants[@]}"; do
  name=${v%%:*}
  # shellcheck disable=SC2206
  flags=(${v#*:})
  "${sim[@]}" "${shm[@]}" "${flags[@]}" --json "$OUT/sim-shm-$name.json" > "$OUT/sim-shm-$name.txt"
  "${sim[@]}" "${hier[@]}" "${flags[@]}" --json "$OUT/sim-hier-$name.json" \
    > "$OUT/sim-hier-$name.txt"
done

python3 - "$OUT" <<'EOF'
import json, os, statistics, sys
out = sys.argv[1]
def measured(name):
    rows = [json.loads(l) for l in open(f"{out}/metrics-{name}.jsonl")]
    rows = [r for r in rows if r["step"] > 1]
    med = lambda k: statistics.median(r.get(k, 0.0) for r in rows)
    return med("step_ms"), med("comm_ms"), med("exposed_comm_ms")
variants = [v for v in ("none", "F", "Fcpu", "Fopt") if os.path.exists(f"{out}/sim-shm-{v}.json")]
print(f"{'run':<24} {'measured':>8}" + "".join(f" {v:>7} {'err':>7}" for v in variants)
      + f" {'comm meas/pred':>15} {'exposed meas/pred':>18}")
for name, label in (("shm", "W=2, one host (shm)"), ("hier", "2 x 2 namespaces (hier)")):
    step, comm, exposed = measured(name)
    pred = {v: json.load(open(f"{out}/sim-{name}-{v}.json"))["step"] for v in variants}
    err = lambda p: 100.0 * (p["step_ms"] - step) / step
    last = pred[variants[-1]]
    print(f"{label:<24} {step:>8.2f}"
          + "".join(f" {pred[v]['step_ms']:>7.2f} {err(pred[v]):>+6.1f}%" for v in variants)
          + f" {comm:>7.2f}/{last['comm_ms']:<7.2f} {exposed:>9.2f}/{last['exposed_comm_ms']:<8.2f}")
one = statistics.median(json.loads(l)["step_ms"] for l in open(f"{out}/metrics-1.jsonl")
                        if json.loads(l)["step"] > 1)
print(f"(ms; 1-rank step {one:.2f}; measured = median step_ms of rank 0's metrics, steps 2..N; "
      "predictions from the 1-rank trace and the all-reduce fits: none = no contention factor, "
      "F = the wall-time factor, Fcpu = the CPU-time factor, Fopt = Fcpu with the optimizer's "
      "own; comm/exposed: the last variant's)")
EOF
cat "$OUT/load.txt"
