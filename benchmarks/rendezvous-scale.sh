#!/usr/bin/env bash
# How nanoddp-run's elastic rendezvous scales with the number of nodes: N launchers on loopback
# (one store, served by the first), --nnodes N:N, one worker each that waits. For each N it
# prints one JSON line:
#   n                    launchers
#   form_s               from the last launcher's start until every launcher has said its
#                        "round 0: node K of N" line (the round formed and published)
#   server_cpu_per_s     CPU seconds per second of the launcher serving the store, while the
#                        round runs (its heartbeats and looks at the other nodes)
#   launchers_cpu_per_s  the same, summed over all N launchers
#   store_bytes_per_s    bytes per second over loopback (/proc/net/dev, received): the
#                        launchers' requests to the store and its replies, TCP/IP headers
#                        included (nothing else here talks over loopback)
#   total_s              from the first start until every launcher exited (the workers run
#                        until the measurement is over, then exit 0)
# and a table at the end. On one machine the launchers share its cores, so read the store's
# load (server_cpu_per_s) as the figure that matters on a real cluster, where each launcher has
# a machine of its own and the store's launcher serves them all.
#
#   benchmarks/rendezvous-scale.sh [N ...]       (default: 16 64 128 256)
# Executables from $NANODDP_BIN_DIR, else build/bin. NANODDP_RUN overrides nanoddp-run itself
# (to compare two builds); NANODDP_SCALE_WINDOW_S the seconds measured (default 8).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${NANODDP_BIN_DIR:-$root/build/bin}"
run="${NANODDP_RUN:-$bin/nanoddp-run}"
[ -x "$run" ] || { echo "error: $run not found; build first" >&2; exit 2; }
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(16 64 128 256)
for n in "${sizes[@]}"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || { echo "error: N must be a positive integer, not '$n'" >&2; exit 2; }
done
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
window="${NANODDP_SCALE_WINDOW_S:-8}"  # seconds of the running round measured
[[ "$window" =~ ^[0-9]+$ ]] && [ "$window" -ge 1 ] ||
  { echo "error: NANODDP_SCALE_WINDOW_S must be a positive integer, not '$window'" >&2; exit 2; }
hz=$(getconf CLK_TCK)

ticks_of() {  # PID: utime + stime of one process, in clock ticks (0 once it is gone)
  local line f
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || { echo 0; return; }
  # After the command name (which may hold spaces): utime and stime are fields 14 and 15.
  read -r -a f <<<"${line##*) }"
  echo $((f[11] + f[12]))
}

loopback_bytes() {  # bytes received over loopback so far (socket traffic is not in /proc/PID/io)
  awk '/^ *lo:/ { sub(/^ *lo:/, ""); print $1; found = 1 } END { if (!found) print 0 }' /proc/net/dev
}

cpu_ticks() {  # PID of `timeout`: its ticks and its child's (the launcher)
  local total child
  total=$(ticks_of "$1")
  for child in $(pgrep -P "$1"); do total=$((total + $(ticks_of "$child"))); done
  echo "$total"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

results=()
for n in "${sizes[@]}"; do
  port=$(free_port)
  pids=()
  rm -f "$work"/log.* "$work/stop"
  start=$(date +%s.%N)
  for i in $(seq 1 "$n"); do
    timeout 600 "$run" --nnodes "$n:$n" --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "scale$n" \
      --heartbeat-timeout 30 --rdzv-last-call 1 \
      /bin/sh -c "while [ ! -e '$work/stop' ]; do sleep 0.5; done" \
      >"$work/log.$i" 2>&1 &
    pids+=($!)
    # The first serves the store: the others wait for it to be up before they arrive.
    if [ "$i" = 1 ]; then
      for _ in $(seq 1 100); do grep -q "serving the rendezvous store" "$work/log.1" && break; sleep 0.05; done
    fi
  done
  last_start=$(date +%s.%N)
  formed=""
  for _ in $(seq 1 6000); do
    if [ "$(grep -l "round 0: node" "$work"/log.* 2>/dev/null | wc -l)" -eq "$n" ]; then
      formed=$(date +%s.%N)
      break
    fi
    sleep 0.05
  done
  if [ -z "$formed" ]; then
    echo "error: N=$n: the round did not form within 300 s; logs in $work" >&2
    trap - EXIT
    exit 1
  fi
  server0=$(cpu_ticks "${pids[0]}")
  bytes0=$(loopback_bytes)
  all0=0
  for p in "${pids[@]}"; do all0=$((all0 + $(cpu_ticks "$p"))); done
  t0=$(date +%s.%N)
  sleep "$window"
  server1=$(cpu_ticks "${pids[0]}")
  bytes1=$(loopback_bytes)
  all1=0
  for p in "${pids[@]}"; do all1=$((all1 + $(cpu_ticks "$p"))); done
  t1=$(date +%s.%N)
  touch "$work/stop"  # the workers exit 0: the round ends, and every launcher with it
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  done_at=$(date +%s.%N)
  if [ "$rc" != 0 ]; then
    echo "error: N=$n: a launcher exited $rc; logs in $work" >&2
    trap - EXIT
    exit 1
  fi
  line=$(python3 - "$n" "$start" "$last_start" "$formed" "$t0" "$t1" "$done_at" "$server0" \
    "$server1" "$all0" "$all1" "$hz" "$bytes0" "$bytes1" <<'EOF'
import json, sys
n, start, last, formed, t0, t1, done = (float(x) for x in sys.argv[1:8])
s0, s1, a0, a1, hz, b0, b1 = (float(x) for x in sys.argv[8:15])
dt = t1 - t0
print(json.dumps({"n": int(n), "form_s": round(formed - last, 3),
                  "server_cpu_per_s": round((s1 - s0) / hz / dt, 4),
                  "launchers_cpu_per_s": round((a1 - a0) / hz / dt, 4),
                  "store_bytes_per_s": round((b1 - b0) / dt),
                  "total_s": round(done - start, 2)}))
EOF
  )
  echo "$line"
  results+=("$line")
done
printf '%s\n' "${results[@]}" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print()
print("| launchers | round formed in | store launcher CPU | all launchers CPU | store traffic |")
print("|---|---|---|---|---|")
for r in rows:
    print("| %d | %.2f s | %.1f %% of a core | %.1f %% | %.1f KB/s |" % (r["n"], r["form_s"], 100 * r["server_cpu_per_s"], 100 * r["launchers_cpu_per_s"], r["store_bytes_per_s"] / 1e3))
'
