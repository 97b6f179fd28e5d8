#!/usr/bin/env bash
# The hierarchical all-reduce against the flat TCP ring on 2 "nodes" x 2 ranks: two network
# namespaces joined by a veth pair (tests/support/two_node_netns.sh), world 4.
#   1. nanoddp-bench-allreduce at 16-64 MiB, float32 sum: flat (NANODDP_HIER=0), hierarchical,
#      then both once more (on a shared machine two runs see different loads; the second pair
#      shows how much);
#   2. nanoddp-bench-ddp, 4 x Linear(1024) (--hidden 1024 --layers 3) at batch 64 per rank:
#      flat, hierarchical, flat, hierarchical.
# JSON lines go to OUT_DIR/data/hier_*.jsonl, the chart to OUT_DIR (benchmarks/plot/plot.py),
# and a summary table to stdout.
#
#   sudo benchmarks/hierarchical-two-nodes.sh [OUT_DIR]     (default: docs/img/hier)
# Needs root (ip netns). Executables from $NANODDP_BIN_DIR, else build/bin.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/docs/img/hier}"
bin="${NANODDP_BIN_DIR:-$root/build/bin}"
python="${NANODDP_PYTHON:-/usr/bin/python3}"
for exe in nanoddp-run nanoddp-bench-allreduce nanoddp-bench-ddp; do
  [ -x "$bin/$exe" ] || { echo "error: $bin/$exe not found; build first" >&2; exit 2; }
done
source "$root/tests/support/two_node_netns.sh"
two_node_netns_up b 10.231.15
mkdir -p "$out/data"
export NANODDP_TIMEOUT_S=120
port=29700

# Runs COMMAND... on both nodes (node 0 with --json FILE); fails unless both exit 0.
both() {  # HIER(0|1) JSON COMMAND...
  local hier=$1 json=$2 rc=0
  shift 2
  port=$((port + 1))
  NANODDP_HIER=$hier timeout 900 ip netns exec "$ns_a" "$@" --node-rank 0 --master-port "$port" \
    --json "$json" >"$work/node0.log" 2>&1 &
  local a=$!
  NANODDP_HIER=$hier timeout 900 ip netns exec "$ns_b" "$@" --node-rank 1 --master-port "$port" \
    >"$work/node1.log" 2>&1 &
  local b=$!
  wait $a || rc=$?
  wait $b || rc=$?
  if [ $rc -ne 0 ]; then
    echo "error: $* (NANODDP_HIER=$hier) exited $rc" >&2
    tail -20 "$work/node0.log" "$work/node1.log" >&2
    exit 1
  fi
}

# nanoddp-bench-allreduce is a worker: nanoddp-run starts its 2 ranks per node. --json is the
# benchmark's flag; nanoddp-run's own flags go first.
allreduce() {  # HIER JSON
  local hier=$1 json=$2
  port=$((port + 1))
  local job=(--nnodes 2 --nproc-per-node 2 --master-addr "$addr_a" --master-port "$port")
  local bench=("$bin/nanoddp-bench-allreduce" -b 16M -e 64M -f 2 -n 5 -w 2 -r 3)
  NANODDP_HIER=$hier timeout 900 ip netns exec "$ns_a" "$bin/nanoddp-run" --node-rank 0 "${job[@]}" \
    "${bench[@]}" --json "$json" >"$work/ar0.log" 2>&1 &
  local a=$!
  NANODDP_HIER=$hier timeout 900 ip netns exec "$ns_b" "$bin/nanoddp-run" --node-rank 1 "${job[@]}" \
    "${bench[@]}" >"$work/ar1.log" 2>&1 &
  local b=$!
  local rc=0
  wait $a || rc=$?
  wait $b || rc=$?
  [ $rc -eq 0 ] || { echo "error: all-reduce (NANODDP_HIER=$hier) exited $rc" >&2;
                     tail -20 "$work/ar0.log" "$work/ar1.log" >&2; exit 1; }
  sed "s/^\[rank 0\] //" "$work/ar0.log" | grep -E "transport|#  +size|^ +[0-9]"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -f "$out"/data/hier_*.jsonl
for round in 1 2; do
  echo "== all-reduce, flat TCP ring (NANODDP_HIER=0), round $round"
  allreduce 0 "$out/data/hier_allreduce_flat$round.jsonl"
  echo "== all-reduce, hierarchical, round $round"
  allreduce 1 "$out/data/hier_allreduce_hier$round.jsonl"
done
ddp=("$bin/nanoddp-bench-ddp" --nnodes 2 --master-addr "$addr_a" --world 2 --hidden 1024
     --layers 3 --batch 64 --steps 20 --warmup 5 --quiet)
for round in 1 2; do
  echo "== DDP step, flat, round $round"
  both 0 "$out/data/hier_ddp_flat$round.jsonl" "${ddp[@]}"
  echo "== DDP step, hierarchical, round $round"
  both 1 "$out/data/hier_ddp_hier$round.jsonl" "${ddp[@]}"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# Summary: in-place busbw per size, and the DDP point's median step.
"$python" - "$out/data" <<'EOF'
import glob, json, os, sys
data = sys.argv[1]
def lines(pattern):
    for path in sorted(glob.glob(os.path.join(data, pattern))):
        for line in open(path):
            yield os.path.basename(path), json.loads(line)
print("\nall-reduce, in place, busbw GB/s (median round)")
rows = {}
for name, r in lines("hier_allreduce_*.jsonl"):
    if r.get("placement", "in-place") == "in-place":
        rows.setdefault(r["bytes"], {})[name.split("_")[2].split(".")[0]] = r["busbw_gbps"]
for size in sorted(rows):
    cols = rows[size]
    flat = [cols[k] for k in sorted(cols) if k.startswith("flat")]
    hier = [cols[k] for k in sorted(cols) if k.startswith("hier")]
    print(f"  {size >> 20:3d} MiB  flat {' / '.join(f'{v:.3f}' for v in flat)}  "
          f"hier {' / '.join(f'{v:.3f}' for v in hier)}  "
          f"ratio {' / '.join(f'{h / f:.2f}' for h, f in zip(hier, flat))}")
print("\nDDP step (median ms), 4 x Linear(1024), batch 64 per rank, world 4")
for name, r in lines("hier_ddp_*.jsonl"):
    if r.get("config", {}).get("ddp"):
        backend = r.get("backend") or r.get("config", {}).get("backend")
        print(f"  {name}: backend {backend}, step {r['step_ms_median']:.1f} ms, "
              f"all-reduce {r.get('allreduce_ms', float('nan')):.1f} ms, "
              f"exposed {r.get('exposed_comm_ms', float('nan')):.1f} ms")
EOF
if "$python" -c 'import matplotlib' 2>/dev/null; then
  "$python" "$root/benchmarks/plot/plot.py" --out "$out" "$out"/data/hier_allreduce_*.jsonl
fi
