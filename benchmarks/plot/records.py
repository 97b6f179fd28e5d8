"""Reading benchmark JSON lines: which benchmark wrote each line, and checks that it has the
fields the charts read, so a wrong file fails with its name and line number, not a KeyError.

Kinds (the field that tells them apart):
  ddp        {"bench": "ddp", ...}            nanoddp-bench-ddp --json
  allreduce  {"benchmark": "allreduce", ...}  nanoddp-bench-allreduce --json (also
             "reduce_scatter", "allgather": its --collective, drawn on the same chart)
  gemm       {"benchmark": "gemm", ...}       nanoddp-bench-gemm --json
"""

import json
import math
import os
import stat
import sys


class InputError(Exception):
    """Bad input: the message names the file (and line, or a trace's event); plot.py and
    plot_trace.py exit 2 with it."""


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

# Fields drawn on a log axis or divided by: a value <= 0 (a failed measurement written as -1) or
# not finite (NaN, inf) is refused with its file and line, never dropped from the chart.
POSITIVE = {
    "ddp": {"step_ms_median", "samples_per_s"},
    "allreduce": {"bytes", "time_us", "busbw_gbps"},
    "gemm": {"m", "n", "k", "gflops"},
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


# nanoddp-bench-allreduce's --collective values, as its lines' "benchmark" field.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")


def kind_of(obj):
    if obj.get("bench") == "ddp":
        return "ddp"
    if obj.get("benchmark") in COLLECTIVES:
        return "allreduce"
    if obj.get("benchmark") == "gemm":
        return "gemm"
    return None


def _type_name(types):
    if isinstance(types, tuple):
        return "a number"
    return {int: "an integer", str: "a string", dict: "an object", bool: "true/false"}[types]


def _check_fields(obj, required, where, what, positive=()):
    for field, types in required.items():
        if field not in obj:
            raise InputError(f"{where}: this {what} line has no '{field}' field")
        value = obj[field]
        # JSON true/false are Python bools, which are also ints: not a valid number here.
        if isinstance(value, bool) and types is not bool:
            raise InputError(f"{where}: '{field}' is {value!r}, expected {_type_name(types)}")
        if not isinstance(value, types):
            raise InputError(f"{where}: '{field}' is {value!r}, expected {_type_name(types)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{where}: '{field}' is {value!r}, expected a finite number")
        if field in positive and value <= 0:
            raise InputError(f"{where}: '{field}' is {value!r}, expected a number > 0 (a "
                             "failed or unmeasured value cannot be charted)")


def _note(text):
    print(f"plot.py: note: {text}", file=sys.stderr)


# A benchmark's results file is a few MB at most; a trace up to plot_trace.py's own limit.
MAX_RESULTS_BYTES = 256 * 1024 * 1024


def read_regular_file(path, max_bytes, expected, too_big_hint):
    """The file's text. Anything but a regular file of at most `max_bytes` is refused before it
    is read: /dev/zero never ends, a FIFO blocks until a writer comes (an outside tester's).
    `expected` names what to pass instead; `too_big_hint` ends the size refusal."""
    try:
        info = os.stat(path)  # follows symlinks: a link to the file is fine
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        mode = info.st_mode
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a character device" if stat.S_ISCHR(mode) else
                "a block device" if stat.S_ISBLK(mode) else
                "a socket" if stat.S_ISSOCK(mode) else "not a file")
        raise InputError(f"{path}: not a regular file ({kind}); pass {expected}")
    too_big = (f"{path}: {{}} bytes, more than the {max_bytes} ({max_bytes >> 20} MiB) this "
               f"script reads ({too_big_hint}")
    if info.st_size > max_bytes:
        raise InputError(too_big.format(info.st_size))
    try:
        # O_NONBLOCK: should the path have become a FIFO since stat, opening it does not block.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path}: not a regular file (it changed while opened)")
        chunks, size = [], 0
        while size <= max_bytes:  # a file still growing stops at the cap too
            chunk = os.read(fd, min(1 << 24, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InputError(too_big.format(f"over {size - 1}"))
    data = b"".join(chunks)
    del chunks
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start}); expected {expected}") from None


def read_file(path):
    """Returns [(kind, record, "path:line")] for one JSONL file; raises InputError."""
    lines = read_regular_file(path, MAX_RESULTS_BYTES, "a benchmark's --json file",
                              "it holds the whole file in memory)").split("\n")
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            if isinstance(e, RecursionError):
                raise InputError(f"{where}: not a JSON line (nested too deeply)") from e
            raise InputError(f"{where}: not a JSON line ({e.msg} at column {e.colno})") from e
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, found {type(obj).__name__}")
        kind = kind_of(obj)
        if kind is None:
            fields = ", ".join(list(obj)[:6])
            raise InputError(
                f"{where}: not a line of nanoddp-bench-ddp, nanoddp-bench-allreduce or "
                f"nanoddp-bench-gemm (no \"bench\": \"ddp\" or \"benchmark\": "
                f"\"allreduce\"/\"reduce_scatter\"/\"allgather\"/\"gemm\"; its fields: "
                f"{fields or 'none'})")
        if kind == "ddp" and obj.get("error"):
            # A point that failed (nanoddp-bench-ddp records it): nothing to draw, said so.
            _note(f"{where}: a failed point, not drawn: {obj['error']}")
            continue
        _check_fields(obj, REQUIRED[kind], where, DESCRIPTION[kind], POSITIVE[kind])
        if kind == "ddp":
            _check_fields(obj["config"], DDP_CONFIG_REQUIRED, where + " (config)",
                          DESCRIPTION[kind])
        out.append((kind, obj, where))
    if not out and not any(line.strip() for line in lines):
        raise InputError(f"{path}: the file is empty (no JSON lines); was the benchmark run "
                         f"with --json {path}?")
    return out


def build_of(record):
    """(commit, dirty, host): what one series' records must share to be compared."""
    p = record.get("provenance") if isinstance(record.get("provenance"), dict) else {}
    m = record.get("machine") if isinstance(record.get("machine"), dict) else {}
    return (str(p.get("commit", "?"))[:10], str(p.get("dirty", "?")), str(m.get("hostname", "?")))


def build_text(build):
    commit, dirty, host = build
    return f"commit {commit}{' (dirty)' if dirty == 'yes' else ''} on {host}"


def read_files(paths, allow_mixed_builds=False):
    """Returns {kind: [(record, where)]} over all files, in file and line order.

    The same file named twice is refused (its records would count double); a line identical to
    one already read (a file copied under another name) is kept once, said so. Records of one
    benchmark from different builds or hosts (commit, dirty, host name) are refused: their
    repeats would merge into one error bar. With `allow_mixed_builds` they are kept, and the
    charts label each series with its build."""
    by_kind = {}
    seen_files = []
    seen_lines = {}
    for path in paths:
        for earlier in seen_files:
            try:
                same = os.path.samefile(earlier, path)
            except OSError:
                same = os.path.abspath(earlier) == os.path.abspath(path)
            if same:
                raise InputError(f"{path}: given twice (also as {earlier}); its records would "
                                 "count double")
        seen_files.append(path)
        for kind, obj, where in read_file(path):
            text = json.dumps(obj, sort_keys=True)
            if text in seen_lines:
                _note(f"{where}: the same record as {seen_lines[text]}; kept once")
                continue
            seen_lines[text] = where
            by_kind.setdefault(kind, []).append((obj, where))
    for kind, records in by_kind.items():
        builds = {}
        for obj, where in records:
            builds.setdefault(build_of(obj), where)
        if len(builds) > 1:
            listing = "; ".join(f"{build_text(b)} ({w})" for b, w in builds.items())
            if not allow_mixed_builds:
                raise InputError(
                    f"the {DESCRIPTION[kind]} records come from {len(builds)} builds or hosts: "
                    f"{listing}. Chart one build on one host at a time, or give "
                    "--allow-mixed-builds to draw them as separate, labelled series")
            _note(f"{DESCRIPTION[kind]}: {len(builds)} builds or hosts, drawn as separate "
                  f"series: {listing}")
            for obj, _ in records:
                obj["_build"] = build_text(build_of(obj))
    return by_kind
