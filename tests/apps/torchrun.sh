#!/usr/bin/env bash
# nanoddp-train under the real torchrun (Debian's python3-torch, torch 1.13), one node, 2 ranks:
#   1. static rendezvous (--master_addr/--master_port: the agent serves a TCPStore there and
#      tells the workers TORCHELASTIC_USE_AGENT_STORE=True; nanoddp connects to it as a client),
#   2. --standalone, 3. the c10d rendezvous (--rdzv_backend c10d --rdzv_endpoint --rdzv_id):
#   each ends with the same parameters, bit for bit, as the same run under nanoddp-run;
#   4. --max_restarts 1: rank 1 is killed after the checkpoint of step 400; the agent restarts
#   the workers (TORCHELASTIC_RESTART_COUNT=1), which resume from the newest checkpoint and end
#   bit for bit where an uninterrupted run ends;
#   5. rank 0 cannot write a checkpoint and rank 1, told through the store, exits first: the
#   error file rank 0 leaves (TORCHELASTIC_ERROR_FILE) makes torchrun's summary name rank 0 as
#   the root cause, with its message.
# torch 1.13's torchrun on Python 3.11 starts no worker without --redirects/--tee (its
# Std.from_str returns None there): every command passes --redirects 2 --tee 2.
# The static run fails without TorchStore: rank 0 cannot bind MASTER_PORT, the agent's store.
# Skipped (exit 77) where python3-torch is not installed.
#
#   tests/apps/torchrun.sh BIN_DIR
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/torch_python.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export NANODDP_TIMEOUT_S=60
status=0
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
torchrun() { timeout 120 "$python" -m torch.distributed.run --redirects 2 --tee 2 --log_dir "$work/logs-$1" "${@:2}"; }
train=(--in 16 --out 4 --hidden 32 --layers 2 --batch 8 --steps 60 --log-every 30 --lr 0.01)

# A run's output to the log; fails the test when the command fails or its saved parameters
# differ from the reference's.
same_as_reference() {  # NAME COMMAND...
  local name=$1
  shift
  if ! "$@" >"$work/$name.log" 2>&1; then
    echo "FAILED: $name exited non-zero:"; cat "$work/$name.log"; status=1; return
  fi
  if cmp -s "$work/reference.safetensors" "$work/$name.safetensors"; then
    echo "ok: $name ends with nanoddp-run's parameters, bit for bit"
  else
    echo "FAILED: $name's parameters differ from nanoddp-run's"; cat "$work/$name.log"; status=1
  fi
}

timeout 60 "$bin/nanoddp-run" --nproc-per-node 2 "$bin/nanoddp-train" "${train[@]}" \
  --save "$work/reference.safetensors" >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; exit 1; }

same_as_reference static torchrun static --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 \
  --master_port "$(free_port)" --no_python "$bin/nanoddp-train" "${train[@]}" \
  --save "$work/static.safetensors"
grep -q "2 rank(s) x batch 8" "$work/static.log" || { echo "FAILED: no world of 2"; status=1; }
same_as_reference standalone torchrun standalone --standalone --nproc_per_node 2 --no_python \
  "$bin/nanoddp-train" "${train[@]}" --save "$work/standalone.safetensors"
same_as_reference c10d torchrun c10d --nnodes 1 --nproc_per_node 2 --rdzv_backend c10d \
  --rdzv_endpoint "127.0.0.1:$(free_port)" --rdzv_id job-c10d --no_python \
  "$bin/nanoddp-train" "${train[@]}" --save "$work/c10d.safetensors"

# 4. Restarts. The uninterrupted run, then the same with checkpoints, rank 1 killed once the
# checkpoint of step 400 is on disk.
long=(--in 16 --out 4 --hidden 32 --layers 2 --batch 8 --steps 4000 --log-every 1000
  --optimizer adamw --lr 0.01)
timeout 60 "$bin/nanoddp-run" --nproc-per-node 2 "$bin/nanoddp-train" "${long[@]}" \
  --save "$work/reference.safetensors" >"$work/reference-long.log" 2>&1 ||
  { cat "$work/reference-long.log"; exit 1; }
torchrun restart --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 \
  --master_port "$(free_port)" --max_restarts 1 --no_python "$bin/nanoddp-train" "${long[@]}" \
  --checkpoint-dir "$work/ckpt" --checkpoint-every 200 --resume \
  --save "$work/restart.safetensors" >"$work/restart.log" 2>&1 &
job=$!
# The worker with RANK=1 among the job's descendants (timeout -> python -> workers), found
# before it reaches step 400, killed once that checkpoint is on disk.
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
victim=
for _ in $(seq 3000); do
  for p in $(descendants "$job"); do
    if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = nanoddp-train ] &&
       tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "RANK=1"; then victim=$p; fi
  done
  [ -n "$victim" ] && break
  sleep 0.01
done
for _ in $(seq 3000); do
  [ -e "$work/ckpt/step-000000400.safetensors" ] && break
  sleep 0.01
done
if [ -z "$victim" ]; then
  echo "FAILED: no rank-1 worker to kill after step 400"; status=1
else
  kill -9 "$victim" || { echo "FAILED: rank 1 had finished before step 400 + a moment"; status=1; }
fi
wait "$job"; rc=$?
if [ "$rc" -ne 0 ]; then
  echo "FAILED: torchrun --max_restarts 1 exited $rc"; cat "$work/restart.log"; status=1
elif ! grep -qE "resume: loaded \S+step-0*[1-9][0-9]*\.safetensors" "$work/restart.log"; then
  echo "FAILED: the restarted workers did not resume from a checkpoint"; cat "$work/restart.log"
  status=1
elif ! cmp -s "$work/reference.safetensors" "$work/restart.safetensors"; then
  echo "FAILED: the restarted run's parameters differ from the uninterrupted run's"; status=1
else
  echo "ok: restarted by torchrun's agent, resumed from $(grep -oE 'step-[0-9]+' "$work/restart.log" | head -1), bit for bit"
fi

# 5. The root cause. Rank 0's wrapper waits a second after the trainer, so rank 1 always ends
# first; TMPDIR takes the checkpoint rank 0 rescues.
fail_dir="$work/fail-ckpt"
TMPDIR="$work" torchrun ckfail --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 \
  --master_port "$(free_port)" --no_python /bin/sh -c \
  '"$0" "$@"; rc=$?; [ "$RANK" = 0 ] && sleep 1; exit $rc' "$bin/nanoddp-train" \
  --in 16 --out 4 --hidden 32 --layers 2 --batch 8 --steps 10000000 --log-every 100000 \
  --checkpoint-dir "$fail_dir" --checkpoint-every 100 >"$work/ckfail.log" 2>&1 &
job=$!
for _ in $(seq 3000); do
  ls "$fail_dir"/step-*.safetensors >/dev/null 2>&1 && break
  sleep 0.01
done
rm -rf "$fail_dir" && echo "not a folder" >"$fail_dir"
wait "$job"; rc=$?
root=$(sed -n '/Root Cause/,/^=====/p' "$work/ckfail.log")
if [ "$rc" -eq 0 ]; then
  echo "FAILED: torchrun exited 0 after rank 0's checkpoint failed"; cat "$work/ckfail.log"; status=1
elif ! grep -q "rank *: 0 (local_rank: 0)" <<<"$root" ||
     ! grep -q "cannot create the checkpoint directory" <<<"$root"; then
  echo "FAILED: torchrun's root cause is not rank 0 with its message:"; cat "$work/ckfail.log"
  status=1
else
  echo "ok: torchrun names rank 0 as the root cause, with its message"
fi
exit $status
