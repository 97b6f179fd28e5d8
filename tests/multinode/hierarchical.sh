#!/usr/bin/env bash
# The hierarchical all-reduce on two machines on one: two network namespaces joined by a veth
# pair (two_node_netns.sh), 2 ranks each, world 4. The namespaces share the host name and boot
# id, so this also shows that the host identity tells them apart (each is its own host).
#   1. the collective suite (nanoddp-test-comm-worker) passes on backend gloo+shm+hier;
#   2. --vs-flat: the same values through the hierarchical path and the flat TCP ring, in one
#      job: both within float rounding of the exact sum, every rank with the same bits;
#   3. NANODDP_HIER=0 forces the flat ring: backend gloo, and rank 0 says why;
#   4. a rank killed mid-all-reduce, in either sub-group (a host-mate; a host's leader): every
#      other rank fails at once (not after the timeout) with a message naming it;
#      a whole node killed mid-training (rank 0 and the store with it): the other node's ranks
#      exit at once, naming rank 0;
#      an uneven layout (2 + 1 ranks: a host whose leader is alone) passes the suite too;
#   5. nanoddp-train end to end: the hierarchical path's final parameters equal the flat ring's
#      within float rounding (float32, then with the bf16 hook), and the `ddp:` line names the
#      backend; --zero 2 ends on the bits of --zero 0 (float32 and bf16).
#
# Usage: hierarchical.sh BIN_DIR
# Needs root (ip netns); exits 77 (ctest: Skipped) where namespaces cannot be made.
set -uo pipefail
bin=$1
source "$(dirname "$0")/../support/two_node_netns.sh"
two_node_netns_up h 10.231.14
export NANODDP_TIMEOUT_S=20
status=0
fail() { echo "FAILED: $*"; status=1; }

# Runs `nanoddp-run --nnodes 2 --nproc-per-node 2 ARGS...` on both nodes; NAME's logs in $work.
# Returns non-zero unless both exit 0.
both_nodes() {  # NAME PORT ARGS...
  local name=$1 port=$2 rc=0
  shift 2
  local job=(--nnodes 2 --nproc-per-node 2 --master-addr "$addr_a" --master-port "$port"
             --grace-period 2 "$@")
  timeout 120 ip netns exec "$ns_a" "$bin/nanoddp-run" --node-rank 0 "${job[@]}" \
    >"$work/$name-0.log" 2>&1 &
  local pid_a=$!
  timeout 120 ip netns exec "$ns_b" "$bin/nanoddp-run" --node-rank 1 "${job[@]}" \
    >"$work/$name-1.log" 2>&1 &
  local pid_b=$!
  wait "$pid_a" || rc=$?
  wait "$pid_b" || rc=$?
  if [ $rc -ne 0 ]; then
    for node in 0 1; do echo "---- $name, node $node"; tail -20 "$work/$name-$node.log"; done
  fi
  return $rc
}

# 1. The collective suite.
if both_nodes suite 29641 "$bin/nanoddp-test-comm-worker"; then
  n=$(cat "$work"/suite-*.log | grep -c "ok, .* backend gloo+shm+hier$")
  [ "$n" -eq 4 ] && echo "ok: the collective suite on gloo+shm+hier (4 ranks)" ||
    fail "only $n of 4 ranks passed the suite on gloo+shm+hier"
else
  fail "the collective suite on two nodes"
fi

# 2. Hierarchical vs flat, in one job.
if both_nodes vs-flat 29642 "$bin/nanoddp-test-comm-worker" --vs-flat; then
  grep -q "vs-flat: group backend gloo+shm+hier, flat backend gloo" "$work/vs-flat-0.log" ||
    fail "vs-flat did not compare gloo+shm+hier with gloo"
  # What bench-allreduce records as the transport (its words were once out of order).
  grep -Eq "vs-flat: group transport hierarchical \(2 hosts: ranks 0-1 \| 2-3; shared memory within a host \([0-9]+ KiB chunks\), nanoddp's TCP ring across the leaders \(ranks 0, 2; " \
    "$work/vs-flat-0.log" || fail "vs-flat: the hierarchical transport is not described as it runs"
  grep "\] vs-flat float32 sum n=300007" "$work/vs-flat-0.log"
  echo "ok: hierarchical = flat ring within float rounding, same bits on every rank"
else
  fail "hierarchical vs flat"
fi

# 3. The switch.
if NANODDP_HIER=0 both_nodes flat 29643 "$bin/nanoddp-test-comm-worker"; then
  n=$(cat "$work"/flat-*.log | grep -c "ok, .* backend gloo$")
  [ "$n" -eq 4 ] || fail "NANODDP_HIER=0: $n of 4 ranks on backend gloo"
  grep -q "not the hierarchical one: NANODDP_HIER=0 on rank 0" "$work/flat-0.log" ||
    fail "NANODDP_HIER=0: rank 0 did not say why the ring is flat"
  [ $status -eq 0 ] && echo "ok: NANODDP_HIER=0 keeps the flat ring"
else
  fail "NANODDP_HIER=0"
fi

# 4. A rank killed in the middle of a 64 MiB all-reduce, in either sub-group: the four ranks
# are started by hand (nanoddp-run would stop the others itself); each survivor must fail with
# exit 2 and a message naming the right rank, well before the timeout (10 s here: rank 0 then
# waits that long, at most, for the killed rank to check out of the store).
killed() {  # VICTIM PATTERN-ON-RANK-0 .. PATTERN-ON-RANK-3 (the victim's is ignored)
  local victim=$1 pids=() r ns
  shift
  for r in 0 1 2 3; do
    ns=$ns_a; [ $r -ge 2 ] && ns=$ns_b
    NANODDP_TIMEOUT_S=10 RANK=$r LOCAL_RANK=$((r % 2)) WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 \
      MASTER_ADDR=$addr_a MASTER_PORT=$((29650 + victim)) timeout 60 ip netns exec "$ns" \
      "$bin/nanoddp-test-comm-worker" --fault kill-mid --fault-rank "$victim" --fault-after 3 \
      >"$work/killed$victim-$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1 2 3; do
    { wait "${pids[$r]}"; } 2>/dev/null  # (no "Killed" line from the shell for the victim)
    local rc=$? pattern=$1 log=$work/killed$victim-$r.log after
    shift
    [ "$r" -eq "$victim" ] && continue
    after=$(sed -n 's/.*: failed \([0-9.]*\) s after the op was issued/\1/p' "$log")
    if [ $rc -ne 2 ] || ! grep -q "$pattern" "$log" || [ -z "$after" ] ||
       ! awk -v t="$after" 'BEGIN { exit !(t < 5) }'; then
      fail "rank $victim killed: rank $r exited $rc (expected 2), failed after '${after}' s" \
        "(expected < 5), or lacks '$pattern':"
      cat "$log"
    fi
  done
  echo "ok: rank $victim killed mid-allreduce; every other rank failed at once, naming it:"
  grep -h "error:" "$work"/killed$victim-*.log
}
# A host-mate (rank 1): its leader sees it gone in shared memory; the other host's leader loses
# rank 0, and its host-mate receives that leader's message.
killed 1 "shared memory on host 0 .*the rank to look at: 1" "" \
  "step across hosts .* failed on rank 2: .* rank 0, the leader of host 0" \
  "rank 2, the leader of host 1 .* failed in the step across hosts"
# A leader (rank 2): rank 0 loses it across hosts; rank 3 sees it gone in shared memory.
killed 2 "step across hosts .* failed on rank 0: .* rank 2, the leader of host 1" \
  "rank 0, the leader of host 0 .* failed in the step across hosts" "" \
  "shared memory on host 1 .*the rank to look at: 2"

# 4a. A whole node lost mid-training: both ranks of node 0, rank 0 and the store it serves
# included, killed at once. Node 1's ranks see the leaders' ring break (rank 2) and hear of it in
# shared memory (rank 3); both must then exit at once, not linger in their error path (each
# store call after the loss used to retry its connection for the whole timeout).
job=(--nnodes 2 --nproc-per-node 2 --master-addr "$addr_a" --master-port 29648 --grace-period 2
     "$bin/nanoddp-train" --in 16 --out 4 --hidden 64 --layers 3 --batch 8 --steps 1000000
     --log-every 100 --optimizer sgd --lr 0.001)
timeout 60 ip netns exec "$ns_a" "$bin/nanoddp-run" --node-rank 0 "${job[@]}" \
  >"$work/node-lost-0.log" 2>&1 &
pid_a=$!
timeout 60 ip netns exec "$ns_b" "$bin/nanoddp-run" --node-rank 1 "${job[@]}" \
  >"$work/node-lost-1.log" 2>&1 &
pid_b=$!
for _ in $(seq 300); do grep -Eq "step +200/" "$work/node-lost-0.log" 2>/dev/null && break; sleep 0.1; done
ip netns pids "$ns_a" | xargs -r kill -9
killed_at=$(date +%s.%N)
wait "$pid_b"
rc=$?
{ wait "$pid_a"; } 2>/dev/null  # (no "Killed" line from the shell)
after=$(echo "$(date +%s.%N) - $killed_at" | bc)
echo "node 0 killed: node 1's launcher exited $rc after $after s (NANODDP_TIMEOUT_S=$NANODDP_TIMEOUT_S)"
grep -h "error:" "$work/node-lost-1.log"
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! awk -v t="$after" 'BEGIN { exit !(t < 5) }' ||
   ! grep -q "rank 2.*error:.*lost the connection to rank 0" "$work/node-lost-1.log" ||
   ! grep -q "rank 3.*error:.*rank 2, the leader of host 1 .* failed in the step across hosts" \
     "$work/node-lost-1.log"; then
  fail "node 0 killed mid-training: node 1 should fail within 5 s, naming rank 0"
  tail -20 "$work/node-lost-1.log"
else
  echo "ok: node 0 (rank 0 and the store) killed mid-training; node 1 failed at once, naming it"
fi

# 4b. An uneven layout, 2 + 1 ranks: the lone rank of node 1 is its host's leader with no
# shared-memory steps. The suite, started by hand (nanoddp-run gives every node the same count),
# around both rings among the leaders (its all-reduce of over 8 MiB runs several pieces: the lone
# leader once ran them as one op, which failed every rank, and aborted it on Gloo's ring).
for own_ring in 1 0; do
  pids=()
  for r in 0 1 2; do
    ns=$ns_a; [ $r -ge 2 ] && ns=$ns_b
    RANK=$r WORLD_SIZE=3 MASTER_ADDR=$addr_a MASTER_PORT=$((29655 + own_ring)) \
      NANODDP_TCP_RING=$own_ring timeout 60 ip netns exec "$ns" \
      "$bin/nanoddp-test-comm-worker" >"$work/uneven-$own_ring-$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1 2; do
    wait "${pids[$r]}" && grep -q "ok, .* backend gloo+shm+hier$" "$work/uneven-$own_ring-$r.log" ||
      { fail "2 + 1 ranks (NANODDP_TCP_RING=$own_ring): rank $r"; cat "$work/uneven-$own_ring-$r.log"; }
  done
done
[ $status -eq 0 ] && echo "ok: 2 + 1 ranks, the collective suite on gloo+shm+hier, around both rings"

# 5. Training end to end: hierarchical vs flat (float32), and with the bf16 hook.
# Small buckets, so that several all-reduces overlap backward; SGD, whose updates follow the
# gradients smoothly (Adam's normalisation would blow rounding differences up).
train=("$bin/nanoddp-train" --in 16 --out 4 --hidden 64 --layers 3 --batch 8 --steps 40
       --log-every 20 --optimizer sgd --lr 0.02 --bucket-cap-mb 0.01 --first-bucket-mb 0.005)
# The parameters training starts from (an SGD step of lr 1e-30 moves none of them): the bf16
# comparison below is measured against how far training moved them.
"$bin/nanoddp-train" --in 16 --out 4 --hidden 64 --layers 3 --batch 8 --steps 1 --quiet \
  --optimizer sgd --lr 1e-30 --save "$work/init.safetensors" >"$work/init.log" 2>&1 ||
  fail "the initial parameters"
both_nodes train-hier 29644 "${train[@]}" --save "$work/hier.safetensors" || fail "training (hier)"
NANODDP_HIER=0 both_nodes train-flat 29645 "${train[@]}" --save "$work/flat.safetensors" ||
  fail "training (flat)"
both_nodes train-hier-bf16 29646 "${train[@]}" --comm-hook bf16 \
  --save "$work/hier-bf16.safetensors" || fail "training (hier, bf16 hook)"
NANODDP_HIER=0 both_nodes train-flat-bf16 29647 "${train[@]}" --comm-hook bf16 \
  --save "$work/flat-bf16.safetensors" || fail "training (flat, bf16 hook)"
# ZeRO stage 2: a hierarchical group's reduce-scatter is its all-reduce, cut, so the same bits
# as stage 0 (its flat ring once summed in another order), float32 and bf16.
both_nodes train-hier-zero2 29657 "${train[@]}" --zero 2 \
  --save "$work/hier-zero2.safetensors" || fail "training (hier, --zero 2)"
both_nodes train-hier-zero2-bf16 29658 "${train[@]}" --zero 2 --comm-hook bf16 \
  --save "$work/hier-zero2-bf16.safetensors" || fail "training (hier, --zero 2, bf16 hook)"
# NANODDP_TCP_RING=0: the leaders' step goes around Gloo's ring; with two leaders one addition,
# which commutes: the same bits as nanoddp's ring.
NANODDP_TCP_RING=0 both_nodes train-hier-gloo 29649 "${train[@]}" \
  --save "$work/hier-gloo.safetensors" || fail "training (hier, Gloo's ring across)"
grep -q "the leaders' all-reduce goes around Gloo's TCP ring, not nanoddp's: NANODDP_TCP_RING=0" \
  "$work/train-hier-gloo-0.log" || fail "NANODDP_TCP_RING=0 under hier: rank 0 does not say so"
grep -q "ddp: backend gloo+shm+hier .* hook allreduce" "$work/train-hier-0.log" ||
  fail "the hierarchical run's ddp: line does not say gloo+shm+hier"
grep -q "ddp: backend gloo+shm+hier .* hook bf16" "$work/train-hier-bf16-0.log" ||
  fail "the hierarchical bf16 run's ddp: line does not say gloo+shm+hier"
grep -q "ddp: backend gloo (nanoddp's TCP ring) |" "$work/train-flat-0.log" ||
  fail "the NANODDP_HIER=0 run's ddp: line does not say gloo (nanoddp's TCP ring)"
# Parameters: |hier - flat| / |flat| over all of them (the norm tests/apps/test_train_ddp.cpp
# uses for DDP against one process); with INIT, / |flat - init|: against how far training moved
# them (the parameters themselves are mostly where they started).
compare() {  # A B LIMIT [INIT]
  python3 - "$@" <<'EOF'
import json, math, struct, sys
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    values = []
    for name in sorted(k for k in header if k != "__metadata__"):
        a, b = header[name]["data_offsets"]
        assert header[name]["dtype"] == "F32", header[name]["dtype"]
        values += struct.unpack(f"<{(b - a) // 4}f", body[a:b])
    return values
x, y, limit = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert len(x) == len(y)
if len(sys.argv) > 4:
    init = load(sys.argv[4])
    assert len(init) == len(y)
    scale = sum((q - r) ** 2 for q, r in zip(y, init))
    what = "of the movement from the initial parameters"
    # Another draw than the run's start would be as far away as the parameters are large, and
    # make any difference look small.
    moved = math.sqrt(scale / sum(q * q for q in y))
    if not moved < 0.5:
        sys.exit(f"{sys.argv[4]} is not where training started: moved {moved:.3g} of the norm")
else:
    scale = sum(q * q for q in y)
    what = "relative"
# NaN compares false: a run that went NaN fails, as does one that never moved.
ok_scale = scale > 0 and math.isfinite(scale)
diff = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)) / scale) if ok_scale else math.nan
same = sum(p == q for p, q in zip(x, y))
print(f"{sys.argv[1].split('/')[-1]} vs {sys.argv[2].split('/')[-1]}: difference "
      f"{diff:.3g} {what} (limit {limit:g}); {same} of {len(x)} parameters bit-identical")
sys.exit(0 if diff <= limit else 1)
EOF
}
if [ -s "$work/hier.safetensors" ] && [ -s "$work/flat.safetensors" ]; then
  compare "$work/hier.safetensors" "$work/flat.safetensors" 1e-5 ||
    fail "float32 training: hierarchical and flat parameters differ beyond rounding"
fi
if [ -s "$work/hier-gloo.safetensors" ] && [ -s "$work/hier.safetensors" ]; then
  compare "$work/hier-gloo.safetensors" "$work/hier.safetensors" 0 ||
    fail "hierarchical training: Gloo's ring across the leaders and nanoddp's end apart"
fi
for hook in "" -bf16; do
  if [ -s "$work/hier-zero2$hook.safetensors" ] && [ -s "$work/hier$hook.safetensors" ]; then
    compare "$work/hier-zero2$hook.safetensors" "$work/hier$hook.safetensors" 0 ||
      fail "hierarchical training: --zero 2 and --zero 0 end apart (hook '${hook#-}')"
  fi
done
if [ -s "$work/hier-bf16.safetensors" ] && [ -s "$work/flat-bf16.safetensors" ]; then
  # bf16 keeps 8 bits of each gradient; the two paths round their sums at different points.
  # Against the movement (8.4e-4 of it measured, 2026-12-05): the relative norm's 1e-3 was 7 %
  # of all that training changed.
  compare "$work/hier-bf16.safetensors" "$work/flat-bf16.safetensors" 1e-2 \
    "$work/init.safetensors" ||
    fail "bf16 hook: hierarchical and flat parameters differ beyond bf16 rounding"
fi

[ $status -eq 0 ] && echo "hierarchical all-reduce: all checks passed"
exit $status
