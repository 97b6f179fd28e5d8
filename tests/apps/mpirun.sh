#!/usr/bin/env bash
# nanoddp-train under Open MPI's real mpirun on one machine, with no MASTER_ADDR/MASTER_PORT:
#   1. `mpirun -np 2` ends with the same parameters, bit for bit, as nanoddp-run;
#   2. two such jobs at once each find their own store (ports derived from their job ids);
#   3. two jobs forced onto one port (MASTER_PORT) do not join each other's store: the second
#      fails with a clear error (the port is taken, or the store refuses the other job's
#      secret), and the first finishes.
# As root, mpirun needs --allow-run-as-root; --oversubscribe lets 2 ranks run on fewer cores.
# Skipped (exit 77) where mpirun (Debian's openmpi-bin) is not installed.
#
#   tests/apps/mpirun.sh BIN_DIR
set -uo pipefail
bin=$1
if ! command -v mpirun >/dev/null; then
  echo "SKIPPED: mpirun is not installed (apt-get install openmpi-bin)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export NANODDP_TIMEOUT_S=30
unset MASTER_ADDR MASTER_PORT NANODDP_STORE_TOKEN
mpirun=(timeout 120 mpirun --oversubscribe -np 2)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
train=("$bin/nanoddp-train" --in 16 --out 4 --hidden 32 --layers 2 --batch 8 --log-every 1000
  --lr 0.01)
status=0
failed() { echo "FAILED: $1"; shift; for f in "$@"; do echo "---- $f"; tail -20 "$f"; done; status=1; }

timeout 60 "$bin/nanoddp-run" --nproc-per-node 2 "${train[@]}" --steps 60 \
  --save "$work/reference.safetensors" >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; exit 1; }

# 1.
if ! "${mpirun[@]}" "${train[@]}" --steps 60 --save "$work/mpi.safetensors" >"$work/mpi.log" 2>&1
then
  failed "mpirun -np 2 exited non-zero" "$work/mpi.log"
elif ! cmp -s "$work/reference.safetensors" "$work/mpi.safetensors"; then
  failed "mpirun's parameters differ from nanoddp-run's" "$work/mpi.log"
else
  echo "ok: mpirun -np 2 ends with nanoddp-run's parameters, bit for bit"
fi

# 2. Two jobs at once, each on the store of its own job-derived port.
NANODDP_DEBUG=INFO "${mpirun[@]}" "${train[@]}" --steps 300 >"$work/a.log" 2>&1 &
a=$!
NANODDP_DEBUG=INFO "${mpirun[@]}" "${train[@]}" --steps 300 >"$work/b.log" 2>&1 &
b=$!
wait $a; rc_a=$?
wait $b; rc_b=$?
port_a=$(grep -m1 -oE 'store at 127\.0\.0\.1:[0-9]+' "$work/a.log")
port_b=$(grep -m1 -oE 'store at 127\.0\.0\.1:[0-9]+' "$work/b.log")
if [ $rc_a -ne 0 ] || [ $rc_b -ne 0 ]; then
  failed "two mpirun jobs at once: exits $rc_a and $rc_b" "$work/a.log" "$work/b.log"
elif [ -z "$port_a" ] || [ "$port_a" = "$port_b" ]; then
  failed "the two jobs' stores are not on different ports ($port_a, $port_b)"
else
  echo "ok: two mpirun jobs at once, stores on ${port_a#store at } and ${port_b#store at }"
fi

# 3. Both on one port: the second must not train with the first's ranks.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
MASTER_PORT=$port "${mpirun[@]}" "${train[@]}" --steps 40000 >"$work/first.log" 2>&1 &
first=$!
for _ in $(seq 500); do grep -qE "^step +1/" "$work/first.log" 2>/dev/null && break; sleep 0.02; done
MASTER_PORT=$port "${mpirun[@]}" "${train[@]}" --steps 100 >"$work/second.log" 2>&1
rc=$?
wait $first; rc_first=$?
if [ $rc -eq 0 ]; then
  failed "a second job on the first's port trained (it joined the other job's store?)" \
    "$work/second.log"
elif ! grep -qE "address already in use|cannot use the store" "$work/second.log"; then
  failed "the second job on a taken port failed without saying why" "$work/second.log"
elif [ $rc_first -ne 0 ]; then
  failed "the first job did not finish (exit $rc_first)" "$work/first.log"
else
  echo "ok: a second job on the same port fails clearly: $(grep -m1 -oE '(cannot start the store|cannot use the store)[^(]*' "$work/second.log")"
fi
exit $status
