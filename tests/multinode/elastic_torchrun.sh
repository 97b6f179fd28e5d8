#!/usr/bin/env bash
# torchrun's elastic agent (c10d rendezvous) starting nanoddp-train on two namespaced nodes
# (network namespaces joined by a veth pair, as two_nodes.sh), 2 ranks each, --global-batch 32
# (the same schedule at world 4 and world 2), checkpoints to a folder both nodes see:
#   1. --nnodes 1:2: every process of node 1 (agent and workers) is killed after a checkpoint;
#      node 0's agent re-forms the group alone (world 2), its workers resume from the newest
#      checkpoint, and the job ends with the parameters of an uninterrupted run of the same
#      schedule within float rounding;
#   2. --nnodes 2:2 --max_restarts 1: one worker of node 1 is killed; both agents restart their
#      workers once (attempt_1 on both nodes), which resume and end as the uninterrupted run.
#   3. --nnodes 2:2 --max_restarts 0: every process of node 1 is killed; node 0's workers exit at
#      once, their error naming node 1's address; node 0's agent then waits in its exit barrier
#      for node 1's agent (torch/distributed/elastic/agent/server/api.py:877 -> _exit_barrier ->
#      utils/store.py:34, a store.get of node 1's key) until exit_barrier_timeout, 300 s in torch
#      1.13 and no torchrun flag (it ended 317.5 s after the kill; a SIGTERM is acted on only
#      once the barrier ends). So torchrun is started with that timeout set to
#      $ELASTIC_EXIT_BARRIER_S (default 10; 300 runs the plain torchrun) and must exit non-zero
#      within it + 30 s, its log naming node 1's address (docs/reliability.md, "When a node dies").
# Needs root and Debian's python3-torch (Skipped, exit 77, without either).
#
#   elastic_torchrun.sh BIN_DIR
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/torch_python.sh"
source "$here/../support/two_node_netns.sh"
source "$here/elastic_common.sh"
two_node_netns_up t 10.231.10
for ns in "$ns_a" "$ns_b"; do
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s nddp-node0\n%s nddp-node1\n' "$addr_a" "$addr_b" \
    >"/etc/netns/$ns/hosts"
done
trap '[ -n "${ELASTIC_KEEP:-}" ] && cp -r "$work" "$ELASTIC_KEEP"; two_node_netns_down; rm -rf "/etc/netns/$ns_a" "/etc/netns/$ns_b"' EXIT
status=0

# torchrun on node NODE (a host name of its own: the c10d rendezvous tells the workers rank 0's
# host name as MASTER_ADDR) in the background; its pid in $started.
# $torchrun: how python starts torchrun (default: -m torch.distributed.run); $torchrun_limit: its
# time limit in seconds (default 150).
torchrun_on() {  # NODE NAME TORCHRUN-FLAGS... -- TRAIN-FLAGS...
  local node=$1 name=$2 ns=$ns_a
  shift 2
  [ "$node" -eq 1 ] && ns=$ns_b
  timeout -k 5 "${torchrun_limit:-150}" ip netns exec "$ns" unshare --uts \
    sh -c 'hostname "$0"; exec "$@"' "nddp-node$node" "$python" "${torchrun[@]}" \
    --redirects 2 --tee 2 --log_dir "$work/logs-$name-$node" \
    --nproc_per_node 2 --rdzv_backend c10d --rdzv_id "$name" --monitor_interval 1 \
    --no_python "$@" >"$work/$name-$node.log" 2>&1 &
  started=$!
}
torchrun=(-m torch.distributed.run)

# The attempts torchrun made on node NODE: its --log_dir holds one attempt_K folder per attempt.
attempts() {  # NAME NODE
  find "$work/logs-$1-$2" -mindepth 2 -maxdepth 2 -name 'attempt_*' -type d | wc -l
}

elastic_reference "$bin"

# 1. --nnodes 1:2, node 1 lost.
rm -rf "$work/ckpt"
for node in 0 1; do
  torchrun_on $node lost --nnodes 1:2 --max_restarts 3 --rdzv_endpoint "$addr_a:29651" \
    --rdzv_conf last_call_timeout=1 "$bin/nanoddp-train" "${elastic_train[@]}" \
    --checkpoint-dir "$work/ckpt" --checkpoint-every "$elastic_every" --resume \
    --save "$work/lost.safetensors"
  pids[$node]=$started
done
wait_for_checkpoint "$work/ckpt" "$work"/lost-?.log && kill_node "$ns_b"
t_killed=$(date +%s.%N)
resumed=$(time_until "$t_killed" "$work/lost-0.log" "resume: loaded .*step-0+[1-9]")
wait "${pids[0]}"; rc=$?
t_done=$(date +%s.%N)
wait "${pids[1]}"
if [ "$rc" -ne 0 ]; then
  echo "FAILED: node 0's torchrun exited $rc after node 1 was lost"; tail -40 "$work/lost-0.log"
  status=1
elif ! grep -q "2 rank(s) x batch 16" "$work/lost-0.log"; then
  echo "FAILED: node 0 did not go on alone at world 2"; tail -40 "$work/lost-0.log"; status=1
elif ! expect_same_parameters lost; then
  status=1
else
  echo "ok: torchrun --nnodes 1:2 lost node 1 and finished alone, $(resumed_from "$work/lost-0.log")," \
    "its workers resumed $resumed s after the kill, the job ended after" \
    "$(elapsed "$t_killed" "$t_done") s"
fi

# 2. --nnodes 2:2 --max_restarts 1: a worker of node 1 crashes; both nodes restart once.
rm -rf "$work/ckpt"
for node in 0 1; do
  torchrun_on $node crash --nnodes 2:2 --max_restarts 1 --rdzv_endpoint "$addr_a:29652" \
    "$bin/nanoddp-train" "${elastic_train[@]}" --checkpoint-dir "$work/ckpt" \
    --checkpoint-every "$elastic_every" --resume --save "$work/crash.safetensors"
  pids[$node]=$started
done
wait_for_checkpoint "$work/ckpt" "$work"/crash-?.log && kill_one_worker "$ns_b"
rc=0
for node in 0 1; do wait "${pids[$node]}" || rc=$?; done
if [ "$rc" -ne 0 ]; then
  echo "FAILED: torchrun exited $rc after a worker crash"; tail -30 "$work"/crash-*.log; status=1
elif [ "$(attempts crash 0) $(attempts crash 1)" != "2 2" ]; then
  echo "FAILED: not both nodes restarted exactly once (attempts: $(attempts crash 0)," \
    "$(attempts crash 1))"; status=1
elif ! expect_same_parameters crash; then
  status=1
else
  echo "ok: torchrun --nnodes 2:2 restarted both nodes once after a worker crash on node 1"
fi

# 3. --nnodes 2:2 --max_restarts 0: node 1 lost; node 0's torchrun must end, naming node 1.
# torch 1.13's agent, after its workers failed, waits in its exit barrier for node 1's agent up
# to exit_barrier_timeout (300 s, LocalElasticAgent's default, no torchrun flag): set here by
# starting torchrun's main() after changing that default.
barrier=${ELASTIC_EXIT_BARRIER_S:-10}
if [ "$barrier" != 300 ]; then
  torchrun=(-c "import torch.distributed.elastic.agent.server.local_elastic_agent as a
a.LocalElasticAgent.__init__.__defaults__ = ('spawn', float($barrier), None)
from torch.distributed.run import main
main()")
fi
torchrun_limit=$((barrier + 150))
rm -rf "$work/ckpt"
for node in 0 1; do
  torchrun_on $node gone --nnodes 2:2 --max_restarts 0 --rdzv_endpoint "$addr_a:29653" \
    "$bin/nanoddp-train" "${elastic_train[@]}" --checkpoint-dir "$work/ckpt" \
    --checkpoint-every "$elastic_every"
  pids[$node]=$started
done
# The number of nanoddp-train processes in the namespace.
workers_in() {  # NAMESPACE
  ip netns pids "$1" | xargs -r -I{} cat /proc/{}/comm 2>/dev/null | grep -cx nanoddp-train
}
wait_for_checkpoint "$work/ckpt" "$work"/gone-?.log
before=$(workers_in "$ns_a")
kill_node "$ns_b"
t_killed=$(date +%s.%N)
# The workers of node 0 fail on the lost peer and exit (or are stopped by the agent).
workers_left=-
for i in $(seq 100); do
  if [ "$(workers_in "$ns_a")" -eq 0 ]; then
    workers_left=$(elapsed "$t_killed" "$(date +%s.%N)"); break
  fi
  sleep 0.1
done
wait "${pids[0]}"; rc=$?
t_done=$(date +%s.%N)
wait "${pids[1]}"
took=$(elapsed "$t_killed" "$t_done")
if [ "$before" -ne 2 ]; then
  echo "FAILED: $before workers seen on node 0 before the kill, not 2"; status=1
elif [ "$workers_left" = - ]; then
  echo "FAILED: node 0's workers still ran 10 s after node 1 was lost"; status=1
elif [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAILED: node 0's torchrun exited $rc (0: no failure reported; 124/137: its time limit)" \
    "after node 1 was lost"; tail -30 "$work/gone-0.log"; status=1
elif awk -v t="$took" -v b="$barrier" 'BEGIN { exit !(t > b + 30) }'; then
  echo "FAILED: node 0's torchrun took $took s to exit, over exit_barrier_timeout $barrier s" \
    "+ 30 s"; status=1
elif ! grep -q "nanoddp-train: error: .*lost the connection to rank [23].*\[$addr_b\]" \
  "$work/gone-0.log"; then
  echo "FAILED: node 0's torchrun log does not name the lost node 1 ($addr_b)"
  tail -30 "$work/gone-0.log"; status=1
else
  echo "ok: torchrun --nnodes 2:2 --max_restarts 0 lost node 1: node 0's workers were gone" \
    "$workers_left s after the kill, their error naming $addr_b; its torchrun exited $rc" \
    "after $took s (exit barrier ${barrier} s:" \
    "$(grep -oE "Error waiting on exit barrier. Elapsed: [0-9.]{1,5}" "$work/gone-0.log"))"
fi
exit $status
