#!/usr/bin/env bash
# nanoddp against PyTorch's DistributedDataParallel on the same MLP, in one run on this machine.
#
#   benchmarks/vs-pytorch.sh [--hidden H] [--linears L] [--batch B] [--steps N] [--warmup W]
#                            [--ranks 1,2] [--bf16] [--json FILE]
#
# The model of both: L x Linear(H, H) with ReLU between them, MSE loss, SGD (lr 0.01, no
# momentum), batch B per rank, one thread per rank. For each rank count R it runs
#   pytorch              benchmarks/peer/torch_ddp_mlp.py (R = 1: its plain loop, no DDP;
#                        R > 1: DDP over Gloo on loopback TCP, started with mp.spawn)
#   nanoddp              nanoddp-train (R > 1: under nanoddp-run; ranks on one host reduce
#                        through shared memory, as NCCL does within a node)
#   nanoddp (tcp)        R > 1 only: the same with NANODDP_SHM=0, Gloo over loopback TCP like
#                        PyTorch's run: the same transport, so the engines compare directly
#   nanoddp (tcp bf16)   R > 1 and --bf16: the same over TCP with the bf16 comm hook (half the
#                        bytes on the wire; PyTorch's run stays float32, as its default)
# and prints one table: the median step time of the W+1-th to W+N-th steps (PyTorch: the
# slowest rank's, per step; nanoddp: rank 0's; neither counts making the batch), the 10th and
# 90th percentiles, samples per second over all ranks and the speed relative to PyTorch.
# --json FILE writes the same rows as JSON lines, each with the steps, warm-up and threads, the
# load average at the start and the end, and the "provenance", "machine" and "build" objects the
# C++ benchmarks write (from nanoddp-provenance: commit, command, UTC time, ...).
#
# Needs PyTorch for Debian's python (exit 3 with the command to install it otherwise):
#   apt-get install -y python3-torch libopenblas0-pthread
# NANODDP_PYTHON picks another interpreter; NANODDP_BIN_DIR the executables (build/bin).
# Measure on an idle machine: the dev VM's two vCPUs vary +-5% from run to run.
set -euo pipefail

command=("$0" "$@")  # what the user typed, for the provenance
hidden=1024 linears=4 batch=64 steps=200 warmup=20 ranks=1,2 json="" bf16=0
given=" "  # the flags seen: a second --hidden would silently replace the first
while (($#)); do
  case $1 in
    --hidden | --linears | --batch | --steps | --warmup | --ranks | --json)
      (($# >= 2)) || { echo "vs-pytorch.sh: $1 needs a value (see --help)" >&2; exit 2; }
      [[ $given != *" $1 "* ]] ||
        { echo "vs-pytorch.sh: $1 is given twice: give it once" >&2; exit 2; }
      given+="$1 "
      printf -v "${1#--}" '%s' "$2"
      shift 2 ;;
    --bf16)
      [[ $given != *" --bf16 "* ]] ||
        { echo "vs-pytorch.sh: --bf16 is given twice: give it once" >&2; exit 2; }
      given+="--bf16 "; bf16=1; shift ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "vs-pytorch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# `--json "$OUT"` with OUT unset would measure for minutes and write nothing.
[[ $given != *" --json "* || -n $json ]] ||
  { echo "vs-pytorch.sh: --json: an empty path; give a file name, or leave the flag out" >&2; exit 2; }
for value in "$hidden" "$linears" "$batch" "$steps" "$warmup"; do
  [[ $value =~ ^[0-9]+$ ]] || { echo "vs-pytorch.sh: '$value' is not a whole number" >&2; exit 2; }
  # Past 2^20 a value is a typo, and bash's arithmetic (or PyTorch's) would fail on it later.
  ((${#value} <= 7 && 10#$value <= 1048576)) ||
    { echo "vs-pytorch.sh: '$value' is more than 1048576 (2^20)" >&2; exit 2; }
done
((hidden >= 1 && linears >= 1 && batch >= 1)) ||
  { echo "vs-pytorch.sh: --hidden, --linears and --batch must be at least 1" >&2; exit 2; }
((steps >= 5)) || { echo "vs-pytorch.sh: --steps must be at least 5" >&2; exit 2; }
[[ $ranks =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
  { echo "vs-pytorch.sh: --ranks '$ranks' is not a comma-separated list of counts (e.g. 1,2)" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${NANODDP_BIN_DIR:-$root/build/bin}
for exe in nanoddp-train nanoddp-run nanoddp-provenance; do
  [[ -x $bin/$exe ]] || { echo "vs-pytorch.sh: $bin/$exe not found: build first" >&2; exit 2; }
done
python=${NANODDP_PYTHON:-/usr/bin/python3}
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "vs-pytorch.sh: PyTorch is not importable by $python; install Debian's (as root):" >&2
  echo "  apt-get install -y python3-torch libopenblas0-pthread" >&2
  echo "or point NANODDP_PYTHON at an interpreter that has it" >&2
  exit 3
fi
peer=$root/benchmarks/peer/torch_ddp_mlp.py
# Debian's torch calls whichever BLAS /usr/lib/.../libblas.so.3 points at: the reference BLAS
# (netlib) unless OpenBLAS is installed, and then its GEMMs run more than 10x slower (about 5
# against 90 GFLOP/s on one thread of the dev VM). A comparison against that is not a comparison
# with PyTorch. The name alone can mislead (a copy or LD_PRELOAD under another name), so the
# peer also times one GEMM; an optimised BLAS on one thread does well over 12 GFLOP/s.
read -r blas gflops < <("$python" "$peer" --print-blas)
if [[ $blas == */blas/libblas.so* ]] || ! awk -v g="$gflops" 'BEGIN { exit !(g >= 12) }'; then
  echo "vs-pytorch.sh: PyTorch's GEMMs run at $gflops GFLOP/s on one thread, on $blas: the" >&2
  echo "reference BLAS or one as slow, more than 10x slower than an optimised one, so its figures" >&2
  echo "would not be PyTorch's. Install OpenBLAS (as root): apt-get install -y libopenblas0-pthread" >&2
  echo "If it is installed, look for an override: LD_LIBRARY_PATH='${LD_LIBRARY_PATH:-}'" \
    "LD_PRELOAD='${LD_PRELOAD:-}' (or set in the NANODDP_PYTHON wrapper); a loaded machine" \
    "can also slow the GEMM this much: rerun on a quiet one." >&2
  exit 3
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Before measuring: its time and load average are the run's start.
provenance_args=()
[[ -z $json ]] || provenance_args=(--json "$json")
"$bin/nanoddp-provenance" ${provenance_args[@]+"${provenance_args[@]}"} -- "${command[@]}" \
  >"$work/provenance.json"

total=$((warmup + steps))
# nanoddp-train counts hidden layers: L Linear modules are L-1 hidden layers.
train_args=(--in "$hidden" --out "$hidden" --hidden "$hidden" --layers "$((linears - 1))"
  --batch "$batch" --optimizer sgd --lr 0.01 --threads 1 --steps "$total" --log-every 1 --quiet)
peer_args=(--layers "$linears" --hidden "$hidden" --batch "$batch" --steps "$steps"
  --warmup "$warmup" --threads 1)

IFS=, read -r -a counts <<<"$ranks"
for r in "${counts[@]}"; do
  echo "vs-pytorch.sh: $r rank(s): PyTorch, then nanoddp ..." >&2
  if ((r == 1)); then
    "$python" "$peer" "${peer_args[@]}" --no-ddp >"$work/pytorch-$r.json"
    "$bin/nanoddp-train" "${train_args[@]}" --metrics "$work/nanoddp-$r.jsonl" >/dev/null
  else
    "$python" "$peer" "${peer_args[@]}" --world-size "$r" >"$work/pytorch-$r.json"
    "$bin/nanoddp-run" --nproc-per-node "$r" "$bin/nanoddp-train" "${train_args[@]}" \
      --metrics "$work/nanoddp-$r.jsonl" >/dev/null
    NANODDP_SHM=0 "$bin/nanoddp-run" --nproc-per-node "$r" "$bin/nanoddp-train" \
      "${train_args[@]}" --metrics "$work/nanoddp-tcp-$r.jsonl" >/dev/null
    if ((bf16)); then
      NANODDP_SHM=0 "$bin/nanoddp-run" --nproc-per-node "$r" "$bin/nanoddp-train" \
        "${train_args[@]}" --comm-hook bf16 --metrics "$work/nanoddp-tcp-bf16-$r.jsonl" >/dev/null
    fi
  fi
done

"$python" - "$work" "$ranks" "$warmup" "$hidden" "$linears" "$batch" "$steps" "$json" "$bf16" <<'EOF'
import json, os, statistics, sys
work, ranks, warmup, hidden, linears, batch, steps, json_path, bf16 = sys.argv[1:]
warmup, batch, steps = int(warmup), int(batch), int(steps)

def percentile(sorted_ms, q):  # the peer script's own definition, so both columns agree
    return sorted_ms[int(q * (len(sorted_ms) - 1))]

rows, version, blas = [], "", ""
for r in map(int, ranks.split(",")):
    peer = json.loads(open(f"{work}/pytorch-{r}.json").read().strip().splitlines()[-1])
    version, blas = peer["torch"], "/".join(peer["blas"].split("/")[-2:])
    base = peer["median_ms"]
    rows.append({"ranks": r, "engine": "pytorch" if r == 1 else "pytorch (tcp)",
                 "step_ms": base, "p10_ms": peer["p10_ms"], "p90_ms": peer["p90_ms"]})
    runs = [("nanoddp", f"nanoddp-{r}.jsonl")]
    if r > 1:
        runs = [("nanoddp (shm)", f"nanoddp-{r}.jsonl"), ("nanoddp (tcp)", f"nanoddp-tcp-{r}.jsonl")]
        if bf16 == "1":
            runs.append(("nanoddp (tcp bf16)", f"nanoddp-tcp-bf16-{r}.jsonl"))
    for engine, name in runs:
        lines = [json.loads(l) for l in open(f"{work}/{name}")]
        ms = sorted(l["step_ms"] for l in lines if l["step"] > warmup)
        rows.append({"ranks": r, "engine": engine, "step_ms": round(statistics.median(ms), 3),
                     "p10_ms": round(percentile(ms, 0.1), 3), "p90_ms": round(percentile(ms, 0.9), 3)})
    for row in rows:
        if row["ranks"] == r:
            row["samples_per_s"] = round(1000.0 * r * batch / row["step_ms"], 1)
            row["vs_pytorch"] = round(base / row["step_ms"], 3)

print(f"nanoddp vs PyTorch {version} DDP ({blas}): {linears} x Linear({hidden}, {hidden}), "
      f"batch {batch} per rank, SGD, 1 thread per rank, {steps} steps after {warmup} warm-up\n")
print(f"{'ranks':>5}  {'engine':<18} {'step ms':>8} {'p10':>8} {'p90':>8} {'samples/s':>10} "
      f"{'vs PyTorch':>10}")
for row in rows:
    print(f"{row['ranks']:>5}  {row['engine']:<18} {row['step_ms']:>8.3f} {row['p10_ms']:>8.3f} "
          f"{row['p90_ms']:>8.3f} {row['samples_per_s']:>10.1f} {row['vs_pytorch']:>9.2f}x")
print("\nstep ms: median per step (PyTorch: the slowest rank; nanoddp: rank 0; without making the "
      "batch); vs PyTorch: its step time over this row's (above 1: faster)")
if json_path:
    # As the C++ benchmarks record a measurement (nanoddp-provenance wrote these objects).
    recorded = json.load(open(f"{work}/provenance.json"))
    load_start = recorded["provenance"]["load_average"][0] if recorded["provenance"].get(
        "load_average") else None
    with open(json_path, "w") as f:
        for row in rows:
            f.write(json.dumps({"torch": version, "hidden": int(hidden), "linears": int(linears),
                                "batch_per_rank": batch, **row, "steps": steps,
                                "warmup": warmup, "threads": 1,
                                "load_average_1m": [load_start, os.getloadavg()[0]],
                                **recorded}) + "\n")
EOF
