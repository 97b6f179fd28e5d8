#!/usr/bin/env bash
# Two machines on one: two network namespaces joined by a veth pair, each running
# `nanoddp-run --nnodes 2 --node-rank R --nproc-per-node 2` over its own address, so the job's
# store, rendezvous and Gloo traffic really cross a (virtual) network link between "nodes".
#
# Usage: two_nodes.sh BIN_DIR
# Needs root (ip netns); exits 77 (ctest: Skipped) where namespaces cannot be made.
set -uo pipefail
bin=$1
suffix=$$
ns_a=nddp-a-$suffix ns_b=nddp-b-$suffix
veth_a=nddpa$suffix veth_b=nddpb$suffix
addr_a=10.231.7.1 addr_b=10.231.7.2
work=$(mktemp -d)

cleanup() {
  ip netns pids "$ns_a" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$ns_b" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "SKIPPED: needs root and iproute2 to create network namespaces"
  exit 77
fi
if ! ip netns add "$ns_a" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here"
  exit 77
fi
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

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
