# Sourced by the elastic multi-node tests (elastic_torchrun.sh, elastic_run.sh) after
# two_node_netns.sh: the training schedule, its uninterrupted reference, and the ways a node is
# made to fail.

# --global-batch 32: 16 per rank at world 2, 8 at world 4, the same samples per step.
elastic_steps=1000
elastic_train=(--in 16 --out 4 --hidden 32 --layers 2 --global-batch 32 --steps "$elastic_steps"
  --log-every 500 --optimizer sgd --lr 0.05)
elastic_every=25
export NANODDP_TIMEOUT_S=30

# The uninterrupted run of the schedule, on one node at world 2: $work/reference.safetensors.
elastic_reference() {  # BIN_DIR
  timeout 120 "$1/nanoddp-run" --nproc-per-node 2 "$1/nanoddp-train" "${elastic_train[@]}" \
    --save "$work/reference.safetensors" >"$work/reference.log" 2>&1 ||
    { echo "FAILED: the reference run"; cat "$work/reference.log"; exit 1; }
}

# Waits (up to 90 s of wall time: torchrun's start, two Python imports of torch, takes tens of
# seconds on a loaded 2-core machine, and CI once saw 60 s pass) for a checkpoint of step 75 or
# later in DIR, while the job still runs, so the kill comes mid-run with a checkpoint to resume
# from. Any later one will do: only the newest three are kept, and under load the job can write
# step 150 before this poll runs again (CI once missed step 75 so, and waited for it in vain).
# Without one the test cannot go on: it prints the nodes' logs and fails at once (the EXIT trap
# ends the nodes), instead of waiting for a job nobody will kill until ctest's timeout.
wait_for_checkpoint() {  # DIR LOG...
  local dir=$1 file log step newest deadline=$((SECONDS + 90)) why="none within 90 s"
  shift
  while [ "$SECONDS" -lt "$deadline" ]; do
    newest=0
    for file in "$dir"/step-*.safetensors; do
      [ -e "$file" ] || continue
      step=$(basename "$file" .safetensors); step=$((10#${step#step-}))
      [ "$step" -gt "$newest" ] && newest=$step
    done
    if [ "$newest" -ge "$elastic_steps" ]; then
      why="the job ended before the test saw one"; break
    fi
    [ "$newest" -ge $((3 * elastic_every)) ] && return 0
    sleep 0.01
  done
  echo "FAILED: no checkpoint of step $((3 * elastic_every)) or later: $why; in its folder:" \
    "$(ls "$dir" 2>&1 | tr '\n' ' ')"
  for log in "$@"; do
    echo "---- the last 40 lines of $log"
    tail -n 40 "$log"
  done
  exit 1
}

# Every process of the node: its launcher (agent) and its workers, at once.
kill_node() {  # NAMESPACE
  ip netns pids "$1" | xargs -r kill -9
}

# One worker of the node (LOCAL_RANK=1): a crash.
kill_one_worker() {  # NAMESPACE
  local p
  for p in $(ip netns pids "$1"); do
    if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = nanoddp-train ] &&
      tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "LOCAL_RANK=1"; then
      kill -9 "$p"; return 0
    fi
  done
  echo "FAILED: no worker with LOCAL_RANK=1 to kill"; status=1; return 1
}

# Fails the test unless $work/NAME.safetensors equals the reference within float rounding (the
# same samples per step, summed in another order at another world size).
expect_same_parameters() {  # NAME
  if ! python3 "$here/../support/compare_parameters.py" "$work/reference.safetensors" \
    "$work/$1.safetensors" 1e-4; then
    echo "FAILED: $1's parameters differ from the uninterrupted run's"; return 1
  fi
}

resumed_from() {  # LOG
  grep -oE "resume: loaded \S+step-[0-9]+" "$1" | tail -1 | grep -oE "step-[0-9]+" |
    sed 's/^/resumed from /'
}

elapsed() {  # START END (date +%s.%N)
  awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'
}

# Seconds from START until LOG has a line matching REGEX (polled every 10 ms; "-" after 60 s).
time_until() {  # START LOG REGEX
  local i
  for i in $(seq 6000); do
    grep -qE "$3" "$2" 2>/dev/null && { elapsed "$1" "$(date +%s.%N)"; return; }
    sleep 0.01
  done
  echo "-"
}
