#!/usr/bin/env bash
# Two machines on one: two network namespaces joined by a veth pair, each running
# `nanoddp-run --nnodes 2 --node-rank R --nproc-per-node 2` over its own address, so the job's
# store, rendezvous and Gloo traffic really cross a (virtual) network link between "nodes"; then
# the same for a two-node nanoddp-bench-ddp sweep.
#
# Usage: two_nodes.sh BIN_DIR
# Needs root (ip netns); exits 77 (ctest: Skipped) where namespaces cannot be made.
set -uo pipefail
bin=$1
source "$(dirname "$0")/../support/two_node_netns.sh"
two_node_netns_up m 10.231.7

# The same job on both nodes; node 1 reaches rank 0's store over the link.
job=(--nnodes 2 --nproc-per-node 2 --master-addr "$addr_a" --master-port 29631 --grace-period 2
     "$bin/nanoddp-train" --in 16 --out 4 --hidden 32 --layers 2 --batch 8 --steps 60
     --log-every 20 --lr 0.01 --save "$work/params.safetensors")
export NANODDP_TIMEOUT_S=30
timeout 120 ip netns exec "$ns_a" "$bin/nanoddp-run" --node-rank 0 "${job[@]}" >"$work/a.log" 2>&1 &
pid_a=$!
timeout 120 ip netns exec "$ns_b" "$bin/nanoddp-run" --node-rank 1 "${job[@]}" >"$work/b.log" 2>&1 &
pid_b=$!
wait "$pid_a"; rc_a=$?
wait "$pid_b"; rc_b=$?

echo "---- node 0 (exit $rc_a)"; cat "$work/a.log"
echo "---- node 1 (exit $rc_b)"; cat "$work/b.log"
[ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ] || { echo "FAILED: a node exited non-zero"; exit 1; }
grep -q "4 rank(s) x batch 8" "$work/a.log" || { echo "FAILED: rank 0 did not see a world of 4"; exit 1; }
[ -s "$work/params.safetensors" ] || { echo "FAILED: no parameters saved"; exit 1; }
echo "two namespaced nodes trained together over $veth_a <-> $veth_b"

# A scaling sweep across the two nodes: nanoddp-bench-ddp on each, 2 ranks per node (world 4),
# node 0 measures its 1-rank baseline and writes the figures.
bench=(--nnodes 2 --master-addr "$addr_a" --master-port 29632 --world 2 --hidden 32 --layers 2
       --batch 8 --steps 3 --warmup 1 --timeout 60)
timeout 120 ip netns exec "$ns_a" "$bin/nanoddp-bench-ddp" --node-rank 0 "${bench[@]}" \
  --json "$work/ddp.jsonl" >"$work/bench_a.log" 2>&1 &
pid_a=$!
timeout 120 ip netns exec "$ns_b" "$bin/nanoddp-bench-ddp" --node-rank 1 "${bench[@]}" \
  >"$work/bench_b.log" 2>&1 &
pid_b=$!
wait "$pid_a"; rc_a=$?
wait "$pid_b"; rc_b=$?
echo "---- bench-ddp node 0 (exit $rc_a)"; cat "$work/bench_a.log"
echo "---- bench-ddp node 1 (exit $rc_b)"; cat "$work/bench_b.log"
[ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ] || { echo "FAILED: a bench-ddp node exited non-zero"; exit 1; }
# The DDP point's line (the sweep's shared 1-process baseline comes first, "baseline":true).
line=$(grep -F '"ddp":true' "$work/ddp.jsonl" | head -1)
for want in '"world_size":4' '"nnodes":2' '"nproc_per_node":2' '"bench":"ddp"'; do
  grep -qF "$want" <<<"$line" || { echo "FAILED: bench-ddp's line lacks $want: $line"; exit 1; }
done
grep -qE '"scaling_efficiency":[0-9.eE+-]+' <<<"$line" ||
  { echo "FAILED: no scaling efficiency against node 0's 1-rank run: $line"; exit 1; }
echo "nanoddp-bench-ddp swept across the two nodes: world 4 = 2 nodes x 2"
