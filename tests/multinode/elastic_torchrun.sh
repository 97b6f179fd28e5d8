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
# Not tested: --nnodes 2:2 with no restarts left and node 1 killed. torch 1.13's agent on node 0
# logged its worker's failure (whose error names node 1's address) and then did not exit, even
# on SIGTERM (docs/reliability.md, "When a node dies").
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
torchrun_on() {  # NODE NAME TORCHRUN-FLAGS... -- TRAIN-FLAGS...
  local node=$1 name=$2 ns=$ns_a
  shift 2
  [ "$node" -eq 1 ] && ns=$ns_b
  timeout 150 ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec "$@"' "nddp-node$node" \
    "$python" -m torch.distributed.run --redirects 2 --tee 2 --log_dir "$work/logs-$name-$node" \
    --nproc_per_node 2 --rdzv_backend c10d --rdzv_id "$name" --monitor_interval 1 \
    --no_python "$@" >"$work/$name-$node.log" 2>&1 &
  started=$!
}

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
wait_for_checkpoint "$work/ckpt" && kill_node "$ns_b"
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
wait_for_checkpoint "$work/ckpt" && kill_one_worker "$ns_b"
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
exit $status
