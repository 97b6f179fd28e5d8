#!/usr/bin/env bash
# Runs nanoddp's benchmarks on small, bounded settings (a few minutes on 2 cores) and draws the
# charts that docs/benchmarks.md shows:
#   benchmarks/plot/make_charts.sh [OUT_DIR]        (default: docs/img)
# Executables come from $NANODDP_BIN_DIR, else build/bin, else build-cpu/bin. The benchmarks'
# JSON lines and the three traces go to OUT_DIR/data/ (kept so the charts can be redrawn and
# checked). nanoddp-bench-ddp is run when it has been built, and skipped with a message
# otherwise.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/docs/img}"
python="${NANODDP_PYTHON:-/usr/bin/python3}"  # Debian's python3-matplotlib is installed for it
plot="$root/benchmarks/plot"

if [ -n "${NANODDP_BIN_DIR:-}" ]; then
  bin="$NANODDP_BIN_DIR"
elif [ -x "$root/build/bin/nanoddp-train" ]; then
  bin="$root/build/bin"
else
  bin="$root/build-cpu/bin"
fi
for exe in nanoddp-run nanoddp-train nanoddp-bench-allreduce nanoddp-bench-gemm; do
  if [ ! -x "$bin/$exe" ]; then
    echo "make_charts.sh: error: $bin/$exe not found; build first (scripts/build.sh), or set" \
      "NANODDP_BIN_DIR to the directory holding the executables" >&2
    exit 2
  fi
done
if ! "$python" -c 'import matplotlib' 2>/dev/null; then
  echo "make_charts.sh: error: $python cannot import matplotlib; install python3-matplotlib" \
    "(scripts/install-deps.sh) or set NANODDP_PYTHON" >&2
  exit 2
fi

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
data="$out/data"
mkdir -p "$out" "$data"
traces="$data"
run2=("$bin/nanoddp-run" --nproc-per-node 2)

# Every JSON file is rewritten, so a failed run cannot leave an old file behind to be plotted.
step() { echo "== $*"; }

step "all-reduce, 2 ranks: shared memory; process group vs raw Gloo over TCP (one interleaved run)"
ar=(-b 8 -e 64M -f 2 -n 10 -w 5 -r 5)
rm -f "$data/allreduce_raw.jsonl"  # the raw side now comes from the --vs-raw run below
"${run2[@]}" "$bin/nanoddp-bench-allreduce" "${ar[@]}" --json "$data/allreduce_shm.jsonl" >/dev/null
# Engine and raw Gloo over the same transport, alternating rounds in one job: two separate runs
# on a shared machine see different loads, and small-message TCP times vary by 10x between them.
NANODDP_SHM=0 "${run2[@]}" "$bin/nanoddp-bench-allreduce" "${ar[@]}" --vs-raw \
  --json "$data/allreduce_tcp.jsonl" >/dev/null

step "GEMM: 1 and 2 threads"
for threads in 1 2; do
  "$bin/nanoddp-bench-gemm" --sizes 128,256,512,1024,2048 --repeats 10 --threads "$threads" \
    --json "$data/gemm_${threads}thread.jsonl" >/dev/null
done

ddp_json=()
if [ -x "$bin/nanoddp-bench-ddp" ]; then
  step "DDP: world 1 and 2, bucket caps 1/4/25 MiB, overlap on and off"
  "$bin/nanoddp-bench-ddp" --world 1,2 --hidden 1024 --layers 3 --bucket-cap-mb 1,4,25 \
    --overlap on,off --steps 20 --json "$data/ddp.jsonl" >/dev/null
  ddp_json=("$data/ddp.jsonl")
else
  # No charts from an earlier run next to this run's: every chart here is from one run.
  rm -f "$data/ddp.jsonl" "$out/ddp_scaling.png" "$out/ddp_breakdown.png"
  echo "== DDP: skipped ($bin/nanoddp-bench-ddp has not been built)"
fi

step "traces: 2 ranks, hidden 1024, 3 layers, batch 64, 1 MiB buckets, overlap on and off, --zero 2"
train=("$bin/nanoddp-train" --hidden 1024 --layers 3 --batch 64 --steps 30 --bucket-cap-mb 1
       --quiet)
"${run2[@]}" "${train[@]}" --trace "$traces/overlap.json" >/dev/null
"${run2[@]}" "${train[@]}" --no-overlap --trace "$traces/no_overlap.json" >/dev/null
"${run2[@]}" "${train[@]}" --zero 2 --trace "$traces/zero2.json" >/dev/null
"${run2[@]}" "${train[@]}" --zero 2 --zero-overlap-gather --trace "$traces/zero2_overlap.json" \
  >/dev/null

step "charts"
"$python" "$plot/plot.py" --out "$out" "$data"/allreduce_*.jsonl "$data"/gemm_*.jsonl \
  "${ddp_json[@]}"
# The commit the executables were built from, as their JSON lines record it (git may not see the
# checkout the binaries came from).
commit="$("$python" -c 'import json, sys
p = json.loads(open(sys.argv[1]).readline()).get("provenance", {})
print(str(p.get("commit", "unknown"))[:10] + (" (dirty)" if p.get("dirty") == "yes" else ""))' \
  "$data/allreduce_shm.jsonl" 2>/dev/null || echo unknown)"
footnote="nanoddp-train ${train[*]:1} --trace, 2 ranks (nanoddp-run); commit $commit;"
footnote+=" $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cpus, load at start $load_before"
"$python" "$plot/plot_trace.py" "$traces/overlap.json" --out "$out/trace_overlap.png" \
  --title "nanoddp-train, 2 ranks, overlap on (default): bucket all-reduces start during backward" \
  --footnote "$footnote"
"$python" "$plot/plot_trace.py" "$traces/overlap.json" --compare "$traces/no_overlap.json" \
  --labels "overlap on,overlap off" --out "$out/trace_overlap_on_off.png" \
  --title "nanoddp-train, 2 ranks: overlap on (default) and --no-overlap, one time axis" \
  --footnote "${footnote/--trace/--trace (and --no-overlap --trace)}"
"$python" "$plot/plot_trace.py" "$traces/zero2.json" --out "$out/trace_zero2.png" \
  --title "nanoddp-train --zero 2, 2 ranks: bucket reduce-scatters during backward, the parameter all-gather after the update" \
  --footnote "${footnote/--trace/--zero 2 --trace}"
"$python" "$plot/plot_trace.py" "$traces/zero2_overlap.json" --out "$out/trace_zero2_overlap.png" \
  --title "nanoddp-train --zero 2 --zero-overlap-gather, 2 ranks: each bucket's all-gather waited for before the first layer that reads it" \
  --footnote "${footnote/--trace/--zero 2 --zero-overlap-gather --trace}"

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "cpus: $(nproc)"
  echo "load average (1, 5, 15 min) at the start: $load_before"
  echo "load average (1, 5, 15 min) at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit: $commit"
} >"$data/machine.txt"
cat "$data/machine.txt"
