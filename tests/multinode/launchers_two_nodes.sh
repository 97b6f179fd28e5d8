#!/usr/bin/env bash
# Two machines on one (network namespaces joined by a veth pair, as two_nodes.sh), 2 ranks per
# node, world 4, the recipes of docs/scaling.md ("Launchers on several nodes"):
#   1. nanoddp-run on each node: the reference parameters;
#   2. torchrun's static rendezvous on each node (--nnodes 2 --node_rank R --master_addr A):
#      the agent on node 0 serves the store; the ranks of both nodes connect to it;
#   3. torchrun's c10d rendezvous (--rdzv_backend c10d --rdzv_endpoint A:P --rdzv_id ID): each
#      node gets a host name of its own (unshare --uts, /etc/netns/<ns>/hosts), since torchrun
#      tells the workers MASTER_ADDR = rank 0's host name;
#   4. what `srun --ntasks-per-node 2 nanoddp-train` gives each task (SLURM_PROCID, SLURM_NTASKS,
#      SLURM_LOCALID, SLURM_NTASKS_PER_NODE, SLURM_STEP_ID, with MASTER_ADDR/MASTER_PORT
#      exported), set by hand: no Slurm here.
# Every one must end with nanoddp-run's parameters, bit for bit.
# Needs root and Debian's python3-torch (Skipped, exit 77, without either).
#
#   launchers_two_nodes.sh BIN_DIR
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/torch_python.sh"
source "$here/../support/two_node_netns.sh"
two_node_netns_up l 10.231.8
export NANODDP_TIMEOUT_S=60
train=("$bin/nanoddp-train" --in 16 --out 4 --hidden 32 --layers 2 --batch 8 --steps 60
  --log-every 30 --lr 0.01)
status=0
torchrun=("$python" -m torch.distributed.run --redirects 2 --tee 2)

# Runs COMMAND in both namespaces (NODE in it replaced by 0 / 1, HOST by the node's host name),
# waits for both; NAME's logs in $work. Fails the test unless both exit 0 and NAME.safetensors
# equals the reference.
both_nodes() {  # NAME COMMAND...
  local name=$1 pids=() rc=0 node ns
  shift
  for node in 0 1; do
    ns=$ns_a; [ $node -eq 1 ] && ns=$ns_b
    local argv=("${@//NODE/$node}")
    argv=("${argv[@]//SAVE/$work/$name.safetensors}")
    timeout 150 ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec "$@"' \
      "nddp-node$node" "${argv[@]}" >"$work/$name-$node.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  if [ $rc -ne 0 ]; then
    echo "FAILED: $name (exit $rc)"
    for node in 0 1; do echo "---- node $node"; tail -25 "$work/$name-$node.log"; done
    status=1
  elif [ "$name" != reference ] && ! cmp -s "$work/reference.safetensors" "$work/$name.safetensors"; then
    echo "FAILED: $name's parameters differ from nanoddp-run's"; status=1
  else
    echo "ok: $name"
  fi
}

# Each namespace's /etc/hosts (ip netns exec mounts /etc/netns/<ns>/hosts over it): both
# nodes' names, as a cluster's DNS would have them.
for ns in "$ns_a" "$ns_b"; do
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s nddp-node0\n%s nddp-node1\n' "$addr_a" "$addr_b" \
    >"/etc/netns/$ns/hosts"
done
trap 'two_node_netns_down; rm -rf "/etc/netns/$ns_a" "/etc/netns/$ns_b"' EXIT

both_nodes reference "$bin/nanoddp-run" --nnodes 2 --node-rank NODE --nproc-per-node 2 \
  --master-addr "$addr_a" --master-port 29641 "${train[@]}" --save SAVE
[ -s "$work/reference.safetensors" ] || { echo "FAILED: no reference parameters"; exit 1; }

both_nodes torchrun-static "${torchrun[@]}" --log_dir "$work/logs-static-NODE" --nnodes 2 \
  --node_rank NODE --nproc_per_node 2 --master_addr "$addr_a" --master_port 29642 --no_python \
  "${train[@]}" --save SAVE
grep -q "4 rank(s) x batch 8" "$work/torchrun-static-0.log" "$work/torchrun-static-1.log" ||
  { echo "FAILED: torchrun's static rendezvous did not make a world of 4"; status=1; }

both_nodes torchrun-c10d "${torchrun[@]}" --log_dir "$work/logs-c10d-NODE" --nnodes 2 \
  --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint "$addr_a:29643" --rdzv_id job-c10d \
  --no_python "${train[@]}" --save SAVE

# srun --ntasks-per-node 2: four tasks, two per node, with srun's variables.
slurm_task() {  # NODE LOCAL
  local rank=$(($1 * 2 + $2))
  env SLURM_JOB_ID=4244 SLURM_STEP_ID=0 SLURM_NNODES=2 SLURM_NODEID="$1" SLURM_PROCID=$rank \
    SLURM_NTASKS=4 SLURM_LOCALID="$2" SLURM_NTASKS_PER_NODE=2 MASTER_ADDR="$addr_a" \
    MASTER_PORT=29644 "${train[@]}" --save "$work/slurm.safetensors"
}
pids=()
for node in 0 1; do
  ns=$ns_a; [ $node -eq 1 ] && ns=$ns_b
  for local in 0 1; do
    (export -f slurm_task; export addr_a work; timeout 150 ip netns exec "$ns" \
      bash -c "$(declare -p train); slurm_task $node $local") >"$work/slurm-$node$local.log" 2>&1 &
    pids+=($!)
  done
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
if [ $rc -ne 0 ]; then
  echo "FAILED: srun-style tasks (exit $rc)"; tail -n 15 "$work"/slurm-*.log; status=1
elif ! cmp -s "$work/reference.safetensors" "$work/slurm.safetensors"; then
  echo "FAILED: srun-style tasks' parameters differ from nanoddp-run's"; status=1
else
  echo "ok: srun-style tasks"
fi
exit $status
