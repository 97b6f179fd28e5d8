#!/usr/bin/env bash
# A network cut between two "nodes" in the middle of training: two network namespaces joined
# by a veth pair (as in tests/multinode/two_nodes.sh), each running nanoddp-run with one rank;
# once both train, the link goes down. Both nodes must exit non-zero, with a timeout error,
# within the collective timeout plus slack: a cut is an error, never a hang.
#
# Usage: network_cut.sh BIN_DIR
# Needs root (ip netns); exits 77 (ctest: Skipped) where namespaces cannot be made.
set -uo pipefail
bin=$1
timeout_s=5
source "$(dirname "$0")/../support/two_node_netns.sh"
two_node_netns_up c 10.231.9

job=(--nnodes 2 --nproc-per-node 1 --master-addr "$addr_a" --master-port 29641 --grace-period 2
     "$bin/nanoddp-train" --in 8 --out 4 --hidden 16 --layers 2 --batch 8 --steps 10000000
     --log-every 200)
export NANODDP_TIMEOUT_S=$timeout_s
timeout 90 ip netns exec "$ns_a" "$bin/nanoddp-run" --node-rank 0 "${job[@]}" >"$work/a.log" 2>&1 &
pid_a=$!
timeout 90 ip netns exec "$ns_b" "$bin/nanoddp-run" --node-rank 1 "${job[@]}" >"$work/b.log" 2>&1 &
pid_b=$!

# Wait (bounded) until training runs: rank 0 prints progress lines.
for _ in $(seq 300); do
  grep -q "loss " "$work/a.log" && break
  sleep 0.1
done
if ! grep -q "loss " "$work/a.log"; then
  echo "FAILED: training never started"; cat "$work/a.log" "$work/b.log"; exit 1
fi
sleep 0.5
echo "cutting the link $veth_a <-> $veth_b"
cut_at=$(date +%s%3N)
ip -n "$ns_a" link set "$veth_a" down
ip -n "$ns_b" link set "$veth_b" down
wait "$pid_a"; rc_a=$?
end_a=$(date +%s%3N)
wait "$pid_b"; rc_b=$?
end_b=$(date +%s%3N)
took_a=$((end_a - cut_at))
took_b=$((end_b - cut_at))

echo "---- node 0 (exit $rc_a after ${took_a} ms)"; cat "$work/a.log"
echo "---- node 1 (exit $rc_b after ${took_b} ms)"; cat "$work/b.log"
status=0
for node in a b; do
  rc_var=rc_$node took_var=took_$node
  rc=${!rc_var} took=${!took_var}
  # 124: killed by timeout(1), i.e. a hang.
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAILED: node $node exited $rc (0 = trained through a cut link, 124 = hung)"; status=1
  fi
  # The timeout, the teardown's bounded store check-out (another timeout) and slack.
  if [ "$took" -gt $(( (2 * timeout_s + 10) * 1000 )) ]; then
    echo "FAILED: node $node took ${took} ms to exit after the cut"; status=1
  fi
  if ! grep -q "timed out" "$work/$node.log"; then
    echo "FAILED: node $node did not report a timeout"; status=1
  fi
done
[ "$status" -eq 0 ] && echo "a network cut ended both nodes with a timeout error"
exit "$status"
