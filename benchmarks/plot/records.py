"""Reading benchmark JSON lines: which benchmark wrote each line, and checks that it has the
fields the charts read, so a wrong file fails with its name and line number, not a KeyError.

Kinds (the field that tells them apart):
  ddp        {"bench": "ddp", ...}            nanoddp-bench-ddp --json
  allreduce  {"benchmark": "allreduce", ...}  nanoddp-bench-allreduce --json
  gemm       {"benchmark": "gemm", ...}       nanoddp-bench-gemm --json
"""

import json
import os


class InputError(Exception):
    """Bad input: the message names the file (and line); the scripts exit 2 with it."""


# Fields each chart reads, per kind. Others are carried along (titles, labels) when present.
REQUIRED = {
    "ddp": {
        "config": dict,
        "step_ms_median": (int, float),
        "samples_per_s": (int, float),
        "compute_ms": (int, float),
        "exposed_comm_ms": (int, float),
        "hidden_comm_ms": (int, float),
    },
    "allreduce": {
        "backend": str,
        "mode": str,
        "ranks": int,
        "bytes": int,
        "time_us": (int, float),
        "busbw_gbps": (int, float),
    },
    "gemm": {
        "backend": str,
        "shape": str,
        "m": int,
        "n": int,
        "k": int,
        "gflops": (int, float),
    },
}

DDP_CONFIG_REQUIRED = {
    "world_size": int,
    "hidden": int,
    "layers": int,
    "bucket_cap_mb": (int, float),
    "overlap": bool,
}

DESCRIPTION = {
    "ddp": "nanoddp-bench-ddp",
    "allreduce": "nanoddp-bench-allreduce",
    "gemm": "nanoddp-bench-gemm",
}


def kind_of(obj):
    if obj.get("bench") == "ddp":
        return "ddp"
    if obj.get("benchmark") in ("allreduce", "gemm"):
        return obj["benchmark"]
    return None


def _type_name(types):
    if isinstance(types, tuple):
        return "a number"
    return {int: "an integer", str: "a string", dict: "an object", bool: "true/false"}[types]


def _check_fields(obj, required, where, what):
    for field, types in required.items():
        if field not in obj:
            raise InputError(f"{where}: this {what} line has no '{field}' field")
        value = obj[field]
        # JSON true/false are Python bools, which are also ints: not a valid number here.
        if isinstance(value, bool) and types is not bool:
            raise InputError(f"{where}: '{field}' is {value!r}, expected {_type_name(types)}")
        if not isinstance(value, types):
            raise InputError(f"{where}: '{field}' is {value!r}, expected {_type_name(types)}")


def read_file(path):
    """Returns [(kind, record, "path:line")] for one JSONL file; raises InputError."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected a JSON-lines file")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read it ({e})") from e
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}: not a JSON line ({e.msg} at column {e.colno})") from e
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, found {type(obj).__name__}")
        kind = kind_of(obj)
        if kind is None:
            fields = ", ".join(list(obj)[:6])
            raise InputError(
                f"{where}: not a line of nanoddp-bench-ddp, nanoddp-bench-allreduce or "
                f"nanoddp-bench-gemm (no \"bench\": \"ddp\" or \"benchmark\": \"allreduce\"/"
                f"\"gemm\"; its fields: {fields or 'none'})")
        _check_fields(obj, REQUIRED[kind], where, DESCRIPTION[kind])
        if kind == "ddp":
            _check_fields(obj["config"], DDP_CONFIG_REQUIRED, where + " (config)",
                          DESCRIPTION[kind])
        out.append((kind, obj, where))
    if not out:
        raise InputError(f"{path}: the file is empty (no JSON lines); was the benchmark run "
                         f"with --json {path}?")
    return out


def read_files(paths):
    """Returns {kind: [(record, where)]} over all files, in file and line order."""
    by_kind = {}
    for path in paths:
        for kind, obj, where in read_file(path):
            by_kind.setdefault(kind, []).append((obj, where))
    return by_kind
