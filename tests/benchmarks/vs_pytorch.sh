#!/usr/bin/env bash
# benchmarks/vs-pytorch.sh on tiny settings against the real PyTorch: every row is there, in
# order, and its figures agree with each other. The figures themselves are not asserted (shared
# machine). Skipped (exit 77) where the interpreter has no PyTorch (Debian: python3-torch).
#
#   tests/benchmarks/vs_pytorch.sh BIN_DIR
set -euo pipefail
bin_dir=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/support/torch_python.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

NANODDP_BIN_DIR=$bin_dir timeout 240 "$root/benchmarks/vs-pytorch.sh" --hidden 32 --linears 3 \
  --batch 4 --steps 10 --warmup 2 --ranks 1,2 --bf16 --json "$work/rows.jsonl" >"$work/table.txt"
cat "$work/table.txt"
grep -q "3 x Linear(32, 32), batch 4 per rank" "$work/table.txt"

"$python" - "$work/rows.jsonl" "$work/table.txt" "$root/benchmarks/vs-pytorch.sh" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
table = open(sys.argv[2]).read()
want = [(1, "pytorch"), (1, "nanoddp"), (2, "pytorch (tcp)"), (2, "nanoddp (shm)"),
        (2, "nanoddp (tcp)"), (2, "nanoddp (tcp bf16)")]
got = [(r["ranks"], r["engine"]) for r in rows]
assert got == want, f"rows {got}, expected {want}"
for r in rows:
    assert 0 < r["p10_ms"] <= r["step_ms"] <= r["p90_ms"], r
    assert abs(r["samples_per_s"] - 1000 * r["ranks"] * 4 / r["step_ms"]) <= 0.1 + 1e-3 * r["samples_per_s"], r
    base = next(x for x in rows if x["ranks"] == r["ranks"] and x["engine"].startswith("pytorch"))
    assert abs(r["vs_pytorch"] - base["step_ms"] / r["step_ms"]) <= 1e-3 * r["vs_pytorch"] + 1e-3, r
    assert f"{r['engine']:<18} {r['step_ms']:>8.3f}" in table, f"row {r} not in the table"
    # The provenance the C++ benchmarks write (nanoddp-provenance), and what was measured.
    p = r["provenance"]
    assert p["command"].startswith(sys.argv[3]) and "--steps 10" in p["command"], p["command"]
    assert p["json"] == sys.argv[1] and p["utc"].endswith("Z") and p["dirty"] in ("yes", "no", "unknown"), p
    assert len(p["commit"]) == 40 or p["commit"] == "unknown", p["commit"]
    assert r["machine"]["cores"] >= 1 and r["machine"]["hostname"], r["machine"]
    assert r["build"]["compiler"] and "native" in r["build"], r["build"]
    assert (r["steps"], r["warmup"], r["threads"]) == (10, 2, 1), r
    assert len(r["load_average_1m"]) == 2, r
print(f"vs_pytorch.sh: {len(rows)} rows consistent")
PY
