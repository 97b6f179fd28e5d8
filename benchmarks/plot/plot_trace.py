#!/usr/bin/python3
"""A timeline PNG of one training step from a nanoddp Chrome trace (nanoddp-train --trace FILE).

  benchmarks/plot/plot_trace.py TRACE.json [--out PNG] [--step K | --from-ms A --to-ms B]
                                [--compare TRACE2.json [--labels A,B]] [--cores N]

The trace (engine/trace.cpp) has one process per rank and four tracks: compute (forward,
each backward node, "wait for all-reduce" (ZeRO-2: "wait for reduce-scatter"), optimizer
step), communication (each bucket's all-reduce), markers ("grad <parameter>" when a gradient is final, drawn as small ticks; "bucket N
ready") and data. The chart has one row per rank x track, spans as bars, so the all-reduce of
bucket 0 can be seen running while the rest of backward still computes (overlap on), or starting
only after it (nanoddp-train --no-overlap).

Under nanoddp-train --zero 2 a bucket's collective is a "reduce-scatter bucket N" span instead
(comm/zero.h), and under --zero 1 and 2 the optimizer step ends with one "all-gather parameters"
span: the reduce-scatters are drawn and counted as the bucket collectives they are (a colour per
bucket, the ready arrows, the header's figures), the all-gather in its own colour and, since it
runs after the update with nothing left to hide it, as exposed communication. nanoddp-train's
per-step "health all-reduce" (loss and non-finite counts) is drawn grey on the communication row
and named in the legend when the window holds one; it is never counted as a bucket collective.
With --zero-overlap-gather the all-gather is one "all-gather bucket N" span per bucket ("gN"),
running beside the next forward, and the forward's "wait for all-gather" spans (compute row) are
what of it is exposed.

On the chart: each backward span is named after the module whose gradients it finished (the
gradient ticks that follow it: "backward layers.4"), each module's ticks are labelled once
("∇layers.4"), an arrow links each "bucket N ready" marker to the start of that bucket's
all-reduce, a dotted line marks each rank's last gradient, and the all-reduce time after it (the
exposed communication, as the Reducer counts it; with ZeRO, the all-gather too) is hatched. The
header states the step and its own length (the drawn window adds a little room on both sides),
and how many threads (per rank: compute and the communication worker) shared how many cores
(--cores, default this machine's).
--compare draws a second trace's step (e.g. --no-overlap) below the first on the same time axis,
both from 0, with each step's end and the difference marked; the header gives each run's step and
threads apart (the runs did not share the cores), and without --step the second trace shows the
same step number as the first when it has it. Without --labels each trace is named by what its
step shows: "DDP", "ZeRO-1" or "ZeRO-2", then "overlapped" or "not overlapped" where the bucket
collectives tell (with one bucket they cannot; it is what the step shows, not the flag: under
load an overlap-on step may show none), and the file name when the two read the same.

A step runs from the first span after the previous "optimizer step" to the end of its own
"optimizer step" (on each rank; the window covers all ranks, and the neighbouring steps' spans in
it are faded). --step K picks the K-th recorded step (1 = the first); the default is the step of
median length after the first (a typical one, not the warm-up or an outlier). --from-ms and
--to-ms pick a window instead, in ms from the start of the trace.

It prints "wrote PATH: ..." and, per rank, how many of the step's all-reduces (or
reduce-scatters) started before its backward pass ended (with --no-overlap: none), and how much
of their time a backward node was running at the same time (on a machine with fewer cores than
threads, the compute thread may be descheduled while the all-reduce runs, so an early start does
not guarantee hidden time); with ZeRO, then the all-gather's time, all of it exposed. Bad input
(missing file, not a trace, no such step) exits 2.
"""

import argparse
import json
import os
import sys
import textwrap

PROG = "plot_trace.py"
TRACKS = ["compute", "communication", "markers", "data"]

COLOR = {
    "forward": "#4c72b0",
    "backward": ("#dd8452", "#f2b482"),  # alternating, so neighbouring nodes stay apart
    "wait": "#c44e52",
    "optimizer": "#55a868",
    "data": "#9a9a9a",
    "bucket": ("#8172b3", "#b07aa1", "#64b5cd", "#937860", "#da8bc3", "#8c8c8c"),
    "gather": "#ccb974",
    "launch": "#e9dfb4",  # ZeRO's step launching the gathers (--zero-overlap-gather)
    "health": "#cccccc",  # nanoddp-train's per-step health all-reduce (in the legend when drawn)
    "other": "#cccccc",
}


class InputError(Exception):
    pass


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Timeline PNG of one step of a nanoddp-train --trace file.")
    parser.add_argument("trace", metavar="TRACE.json", help="written by nanoddp-train --trace")
    parser.add_argument("--out", metavar="PNG",
                        help="output file (default: the trace's name with .png)")
    parser.add_argument("--step", type=int, metavar="K",
                        help="the K-th recorded step, from 1 (default: the step of median length)")
    parser.add_argument("--from-ms", type=float, metavar="A",
                        help="window start, ms after the trace's first event")
    parser.add_argument("--to-ms", type=float, metavar="B",
                        help="window end, ms after the trace's first event")
    parser.add_argument("--title", help="chart title (default: the trace's file name and step)")
    parser.add_argument("--compare", metavar="TRACE2.json",
                        help="a second trace (e.g. the same run with --no-overlap): its step is "
                             "drawn below the first on the same time axis, both starting at 0, "
                             "with the step-time difference marked")
    parser.add_argument("--labels", metavar="A,B",
                        help="names of the two traces with --compare (default: read from each "
                        "trace's spans: DDP, ZeRO-1 or ZeRO-2, and overlapped or not where the "
                        "step shows it)")
    parser.add_argument("--cores", type=int, metavar="N",
                        help="cores of the machine that ran the trace, stated on the chart with "
                             "the threads that shared them (default: this machine's count)")
    parser.add_argument("--footnote", metavar="TEXT",
                        help="provenance printed small at the bottom (commit, date, command): a "
                        "trace does not hold it")
    args = parser.parse_args(argv)
    if args.step is not None and (args.from_ms is not None or args.to_ms is not None):
        parser.error("--step and --from-ms/--to-ms choose the window two ways; pass one")
    if (args.from_ms is None) != (args.to_ms is None):
        parser.error("--from-ms and --to-ms go together")
    if args.from_ms is not None and not args.from_ms < args.to_ms:
        parser.error(f"--from-ms {args.from_ms} must be less than --to-ms {args.to_ms}")
    if args.step is not None and args.step < 1:
        parser.error(f"--step {args.step}: steps count from 1")
    if args.compare is not None and args.from_ms is not None:
        parser.error("--compare aligns the two traces' steps; pass --step, not --from-ms/--to-ms")
    if args.labels is not None and len(args.labels.split(",")) != 2:
        parser.error(f"--labels {args.labels!r}: two names separated by a comma")
    if args.cores is not None and args.cores < 1:
        parser.error(f"--cores {args.cores}: at least 1")
    return args


def load(path):
    """Returns (ranks, spans, instants): ranks [(pid, name)], events as dicts with track names."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read it ({e})") from e
    if not text.strip():
        raise InputError(f"{path}: the file is empty; was it written by nanoddp-train --trace?")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not a JSON trace ({e.msg} at line {e.lineno}, column "
                         f"{e.colno}); expected a file written by nanoddp-train --trace") from e
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputError(f"{path}: not a Chrome trace (no \"traceEvents\" list)")
    process_name, sort_index, track_name = {}, {}, {}
    spans, instants = [], []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or "ph" not in e or "pid" not in e:
            raise InputError(f"{path}: traceEvents[{i}] is not a trace event (needs ph and pid)")
        ph, pid = e["ph"], e["pid"]
        if ph == "M":
            args = e.get("args", {})
            if e.get("name") == "process_name":
                process_name[pid] = args.get("name", f"pid {pid}")
            elif e.get("name") == "process_sort_index":
                sort_index[pid] = args.get("sort_index", pid)
            elif e.get("name") == "thread_name":
                track_name[(pid, e.get("tid"))] = args.get("name", str(e.get("tid")))
        elif ph in ("X", "i", "I"):
            try:
                event = {"name": str(e["name"]), "pid": pid, "tid": e.get("tid"),
                         "ts": float(e["ts"]) / 1000.0, "args": e.get("args", {})}
                if ph == "X":
                    event["dur"] = float(e["dur"]) / 1000.0
            except (KeyError, TypeError, ValueError) as err:
                raise InputError(f"{path}: traceEvents[{i}] ({ph}) lacks a valid {err}") from err
            (spans if ph == "X" else instants).append(event)
    if not spans:
        raise InputError(f"{path}: the trace has no spans (\"ph\": \"X\" events)")
    pids = sorted({e["pid"] for e in spans + instants} | set(process_name),
                  key=lambda p: (sort_index.get(p, p), p))
    for e in spans + instants:
        e["track"] = track_name.get((e["pid"], e["tid"]), str(e["tid"]))
    ranks = [(pid, process_name.get(pid, f"pid {pid}")) for pid in pids]
    return ranks, spans, instants


def step_windows(ranks, spans):
    """Per recorded step, {pid: (start_ms, end_ms)} on each rank: see the module comment."""
    per_rank = {}
    for pid, _ in ranks:
        mine = sorted((e for e in spans if e["pid"] == pid), key=lambda e: e["ts"])
        steps = [e for e in mine if e["name"] == "optimizer step"]
        if not steps:
            continue
        windows, previous_end = [], None
        for opt in steps:
            end = opt["ts"] + opt["dur"]
            starts = [e["ts"] for e in mine if previous_end is None or e["ts"] >= previous_end]
            windows.append((min(starts), end))
            previous_end = end
        per_rank[pid] = windows
    if not per_rank:
        return []
    count = min(len(w) for w in per_rank.values())
    return [{pid: w[k] for pid, w in per_rank.items()} for k in range(count)]


def typical_step(windows):
    """The step of median length, leaving out the first (warm-up: first touches, connections)
    unless it is the only one: on a shared machine a chosen number may land on an outlier."""
    lengths = [(max(b for _, b in w.values()) - min(a for a, _ in w.values()), k + 1)
               for k, w in enumerate(windows)]
    candidates = sorted(lengths[1:] or lengths)
    return candidates[(len(candidates) - 1) // 2][1]


def style_of(event):
    name = event["name"]
    if name == "forward":
        return COLOR["forward"], "forward"
    if name.startswith("backward"):
        seq = event["args"].get("node", "0")
        shade = COLOR["backward"][int(seq) % 2 if str(seq).isdigit() else 0]
        if "module" in event:
            return shade, f"backward {event['module']}"
        return shade, name[len("backward "):].replace("Backward", "")
    if name in ("wait for all-reduce", "wait for reduce-scatter", "wait for all-gather"):
        return COLOR["wait"], "wait"
    if name == "optimizer step":
        return COLOR["optimizer"], "optimizer"
    if name == "data":
        return COLOR["data"], "data"
    collective = bucket_collective(name)
    if collective is not None:
        # The legend names the collective: "reduce-scatter b0" would not fit a short bar.
        bucket = collective[1]
        index = int(bucket) if bucket.isdigit() else 0
        return COLOR["bucket"][index % len(COLOR["bucket"])], f"b{bucket}"
    if name == GATHER:
        return COLOR["gather"], "all-gather"
    if name.startswith(GATHER_BUCKET):
        return COLOR["gather"], f"g{name[len(GATHER_BUCKET):]}"
    if name == LAUNCH_GATHERS:
        return COLOR["launch"], "launch"
    if name == HEALTH:
        return COLOR["health"], name
    return COLOR["other"], name


def _union(intervals):
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _overlap(a, b, merged):
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in merged)


# The Reducer names each bucket's span after the collective that ran (comm/reducer_timeline.cpp):
# DDP and ZeRO stage 1 all-reduce a bucket, ZeRO stage 2 reduce-scatters it.
BUCKET_KINDS = ("all-reduce", "reduce-scatter")
# ZeRO's parameter all-gather (comm/zero.cpp), inside the "optimizer step" span, after the update.
GATHER = "all-gather parameters"
# With --zero-overlap-gather: each bucket's gather, running beside the next forward, which waits
# for it ("wait for all-gather") before the first module that reads it.
GATHER_BUCKET = "all-gather bucket "
# ...launched by the step, which returns before they end.
LAUNCH_GATHERS = "launch all-gathers"
# nanoddp-train's per-step all-reduce of loss and non-finite counts (apps/train/trainer_health.cpp):
# a collective of the trainer, not of DDP, drawn so that it is not mistaken for a gap.
HEALTH = "health all-reduce"


def bucket_collective(name):
    """'reduce-scatter bucket 3' -> ('reduce-scatter', '3'); None for any other name."""
    for kind in BUCKET_KINDS:
        if name.startswith(f"{kind} bucket "):
            return kind, name[len(f"{kind} bucket "):]
    return None


def is_bucket_collective(e):
    """A bucket's all-reduce or reduce-scatter: both are launched as backward fills the buckets
    and may overlap it. The communication track also holds nanoddp-train's per-step "health
    all-reduce", which is neither overlapped with backward nor counted by the Reducer."""
    return e["track"] == "communication" and bucket_collective(e["name"]) is not None


def is_parameter_gather(e):
    """ZeRO's all-gather of the updated parameters: it needs the update, which needs every
    bucket's averages, so nothing of the step is left to hide it (the trainer counts all of it as
    exposed communication)."""
    return e["track"] == "communication" and (e["name"] == GATHER or
                                              e["name"].startswith(GATHER_BUCKET))


def bucket_kinds(spans):
    """The bucket collectives among the spans, in BUCKET_KINDS order: the legend names those
    drawn (a --compare of DDP with ZeRO-2 has both)."""
    present = {bucket_collective(e["name"])[0] for e in spans if is_bucket_collective(e)}
    return [k for k in BUCKET_KINDS if k in present] or ["all-reduce"]


def kinds_text(comm):
    """'3 all-reduce(s)', '3 reduce-scatter(s)', or both kinds in the order they ran."""
    kinds = []
    for e in sorted(comm, key=lambda e: e["ts"]):
        kind = bucket_collective(e["name"])[0]
        if kind not in kinds:
            kinds.append(kind)
    counts = [sum(1 for e in comm if bucket_collective(e["name"])[0] == k) for k in kinds]
    return " and ".join(f"{n} {k}(s)" for n, k in zip(counts, kinds))


def overlap_summary(ranks, spans, lo, hi, own):
    """Per rank, over the bucket collectives that start in the rank's own step (own[pid]; without
    one, in [lo, hi]): (rank name, their total ms, the spans, how many started before the step's
    last backward node ended, ms of them during which a backward node was running, ms of ZeRO's
    parameter all-gather, ms of it after backward ended: measured, not assumed, so that a trace
    in which it did overlap backward would say so; with --zero-overlap-gather instead the ms the
    forward waited for it, and True; and how many gathers those ms are)."""
    out = []
    for pid, name in ranks:
        start, end = own.get(pid, (lo, hi))
        inside = [e for e in spans if e["pid"] == pid and start <= e["ts"] < end]
        backward = _union((e["ts"], e["ts"] + e["dur"]) for e in inside
                          if e["name"].startswith("backward"))
        backward_end = backward[-1][1] if backward else float("-inf")
        comm = [e for e in inside if is_bucket_collective(e)]
        total = sum(e["dur"] for e in comm)
        early = sum(1 for e in comm if e["ts"] < backward_end)
        hidden = sum(_overlap(e["ts"], e["ts"] + e["dur"], backward) for e in comm)
        gathers = [e for e in inside if is_parameter_gather(e)]
        # The run's mode, from the whole trace: under load the gathers this step launched at its
        # end can start after its window, and the step then looked not overlapped (a CI
        # rehearsal under TSan).
        overlapped = any(e["pid"] == pid and e["name"].startswith(GATHER_BUCKET) for e in spans)
        if overlapped:
            gathers = gathers_beside_forward(spans, pid, inside)
        gather = sum(e["dur"] for e in gathers)
        if overlapped:
            # Beside the forward: what of it is exposed is the forward's wait for it.
            gather_after = sum(e["dur"] for e in inside if e["name"] == "wait for all-gather")
        else:
            gather_after = sum(e["dur"] if e["ts"] >= backward_end else
                               max(0.0, e["ts"] + e["dur"] - backward_end) for e in gathers)
        out.append((name, total, comm, early, hidden, gather, gather_after, overlapped,
                    len(gathers)))
    return out


def gathers_beside_forward(spans, pid, inside):
    """With --zero-overlap-gather: the gathers this step's forward used, that is those the latest
    "launch all-gathers" before the forward started (in the previous step) launched, not the ones
    this step launches at its end for the next forward (an outside reader found the header
    counting those instead)."""
    forwards = [e for e in inside if e["name"] == "forward"]
    if not forwards:
        return []
    forward = min(forwards, key=lambda e: e["ts"])
    launches = [e["ts"] for e in spans
                if e["pid"] == pid and e["name"] == LAUNCH_GATHERS and e["ts"] <= forward["ts"]]
    since = max(launches) if launches else float("-inf")
    forward_end = forward["ts"] + forward["dur"]
    return [e for e in spans if e["pid"] == pid and e["name"].startswith(GATHER_BUCKET)
            and since <= e["ts"] < forward_end]


def module_of(grad_name):
    """'grad layers.4.weight' -> 'layers.4'."""
    name = grad_name[len("grad "):] if grad_name.startswith("grad ") else grad_name
    return name.rsplit(".", 1)[0] if "." in name else name


def label_backward_spans(spans, instants):
    """Names each backward span after the module whose gradients it finished: autograd marks a
    parameter's gradient final ("grad layers.4.weight") right after the node that wrote it, so
    the gradient ticks between a node's end and the next node's start belong to it."""
    for pid in {e["pid"] for e in spans}:
        nodes = sorted((e for e in spans if e["pid"] == pid and e["name"].startswith("backward")),
                       key=lambda e: e["ts"])
        grads = sorted((e for e in instants if e["pid"] == pid and e["name"].startswith("grad ")),
                       key=lambda e: e["ts"])
        for i, node in enumerate(nodes):
            end = node["ts"] + node["dur"]
            until = nodes[i + 1]["ts"] if i + 1 < len(nodes) else end + 1.0
            modules = []
            for g in grads:
                if end - 1e-3 <= g["ts"] <= until and module_of(g["name"]) not in modules:
                    modules.append(module_of(g["name"]))
            if modules:
                node["module"] = ", ".join(modules)


def exposed_from(pid, spans, instants, start, end):
    """When backward's work ended on a rank in [start, end): its last gradient (as the Reducer
    counts exposed communication), else its last backward node's end."""
    grads = [e["ts"] for e in instants
             if e["pid"] == pid and e["name"].startswith("grad ") and start <= e["ts"] < end]
    if grads:
        return max(grads)
    ends = [e["ts"] + e["dur"] for e in spans
            if e["pid"] == pid and e["name"].startswith("backward") and start <= e["ts"] < end]
    return max(ends) if ends else None


ROW_HEIGHT = {"compute": 1.0, "communication": 1.0, "markers": 0.7, "data": 0.5}


def draw(args, ranks, spans, instants, lo, hi, own, title, marks=()):
    """own: {pid: (start, end)} of the chosen step on each rank; other spans are drawn faded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t0 = lo
    width_ms = hi - lo
    rows = []  # (pid, track, label, centre y, height)
    y = 0.0
    for pid, name in ranks:
        for track in TRACKS:
            has = any(e["pid"] == pid and e["track"] == track and e["ts"] < hi
                      and e["ts"] + e.get("dur", 0) >= lo for e in spans + instants)
            if has or track in ("compute", "communication"):
                h = ROW_HEIGHT[track]
                rows.append((pid, track, f"{name} · {track}", y + h / 2, h))
                y += h
    fig, ax = plt.subplots(figsize=(12, 1.9 + 0.42 * y))
    row_of = {(pid, track): (centre, h) for pid, track, _, centre, h in rows}

    def faded(e):
        start, end = own.get(e["pid"], (lo, hi))
        return e["ts"] + e.get("dur", 0) <= start or e["ts"] >= end

    for e in spans:
        row = row_of.get((e["pid"], e["track"]))
        start, end = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
        if row is None or end <= start:
            continue
        centre, h = row
        color, short = style_of(e)
        alpha = 0.3 if faded(e) else 1.0
        ax.broken_barh([(start - t0, end - start)], (centre - 0.35 * h, 0.7 * h),
                       facecolors=color, edgecolor="white", linewidth=0.4, alpha=alpha)
        # A wait for an all-gather lies inside "forward": its label would print over forward's.
        nested = e["name"] == "wait for all-gather"
        if (end - start) > 0.035 * width_ms and not nested:
            ax.text((start + end) / 2 - t0, centre, short, ha="center", va="center", fontsize=7,
                    clip_on=True, alpha=alpha)
    # The exposed part: each rank's all-reduce (or reduce-scatter) time after its backward's last
    # gradient, and ZeRO's all-gather, which starts after it.
    for pid, _ in ranks:
        start, end = own.get(pid, (lo, hi))
        backward_end = exposed_from(pid, spans, instants, start, end)
        row = row_of.get((pid, "communication"))
        if backward_end is None or row is None:
            continue
        centre, h = row
        for e in spans:
            # (An overlapped gather runs beside the next forward: what of it is exposed is the
            # forward's "wait for all-gather", drawn on the compute row.)
            exposable = is_bucket_collective(e) or e["name"] == GATHER
            if e["pid"] != pid or not exposable or not start <= e["ts"] < end:
                continue
            a, b = max(e["ts"], backward_end), e["ts"] + e["dur"]
            if b > a:
                ax.broken_barh([(a - t0, b - a)], (centre - 0.35 * h, 0.7 * h),
                               facecolors="none", edgecolor=COLOR["wait"], hatch="////",
                               linewidth=0.0)
        ax.plot([backward_end - t0] * 2, [centre - 0.5 * h, centre + 0.5 * h], color="black",
                linewidth=0.6, linestyle=":")
    # Each bucket's ready marker linked to the start of its all-reduce (or reduce-scatter).
    for e in instants:
        if not (e["name"].startswith("bucket ") and e["name"].endswith(" ready")):
            continue
        bucket = e["name"].split()[1]
        ready_row = row_of.get((e["pid"], e["track"]))
        comm_row = row_of.get((e["pid"], "communication"))
        runs = [r for r in spans if r["pid"] == e["pid"] and is_bucket_collective(r)
                and bucket_collective(r["name"])[1] == bucket and r["ts"] >= e["ts"] - 1e-3]
        if ready_row is None or comm_row is None or not runs or not lo <= e["ts"] <= hi:
            continue
        run = min(runs, key=lambda r: r["ts"])
        ax.annotate("", xy=(run["ts"] - t0, comm_row[0] + 0.35 * comm_row[1]),
                    xytext=(e["ts"] - t0, ready_row[0] - 0.2 * ready_row[1]),
                    arrowprops=dict(arrowstyle="->", color="black", linewidth=0.6,
                                    alpha=0.3 if faded(e) else 0.8))
    # Gradient ticks: one label per module, at its first tick.
    labelled = set()
    for e in sorted(instants, key=lambda e: e["ts"]):
        row = row_of.get((e["pid"], e["track"]))
        if row is None or not e["name"].startswith("grad ") or not lo <= e["ts"] <= hi:
            continue
        key = (e["pid"], module_of(e["name"]), own.get(e["pid"], (lo, hi)))
        if key in labelled or faded(e):
            continue
        labelled.add(key)
        ax.text(e["ts"] - t0, row[0] + 0.45 * row[1], "∇" + module_of(e["name"]), ha="center",
                va="top", fontsize=5.5, color="dimgrey")
    last_label = {}
    for e in sorted(instants, key=lambda e: e["ts"]):
        row = row_of.get((e["pid"], e["track"]))
        if row is None or not lo <= e["ts"] <= hi:
            continue
        centre, h = row
        alpha = 0.3 if faded(e) else 1.0
        x = e["ts"] - t0
        if e["name"] == "grad" or e["name"].startswith("grad "):
            # One per parameter ("grad layers.4.weight"): a small unlabelled tick, so that the
            # bucket markers' labels stay readable.
            ax.plot([x], [centre + 0.1 * h], marker="|", color="grey", markersize=7, alpha=alpha)
            continue
        ax.plot([x], [centre + 0.1 * h], marker="v", color="black", markersize=6, alpha=alpha)
        # Markers close together (buckets ready at once) get their labels side by side.
        key = (e["pid"], e["track"])
        prev_x, prev_n = last_label.get(key, (None, 0))
        n = prev_n + 1 if prev_x is not None and x - prev_x < 0.025 * width_ms else 0
        last_label[key] = (x, n)
        label = e["name"].replace("bucket ", "b").replace(" ready", "")
        ax.text(x + n * 0.012 * width_ms, centre - 0.12 * h, label, ha="center", va="bottom",
                fontsize=7, alpha=alpha)
    ax.set_yticks([centre for *_, centre, _ in rows])
    ax.set_yticklabels([label for _, _, label, _, _ in rows], fontsize=8)
    ax.set_ylim(y, 0)
    # A line between the ranks.
    for i in range(1, len(rows)):
        if rows[i][0] != rows[i - 1][0]:
            ax.axhline(rows[i][3] - rows[i][4] / 2, color="black", linewidth=0.8)
    ax.set_xlim(0, width_ms)
    ax.set_xlabel(f"ms (from {lo - args.trace_start:.1f} ms into the trace; faded: the "
                  "neighbouring steps)")
    ax.grid(True, axis="x", alpha=0.3)
    drawn = [e for e in spans if e["ts"] < hi and e["ts"] + e["dur"] >= lo]
    collectives = " / ".join(bucket_kinds(drawn))
    data_patch = Patch(color=COLOR["data"], label="data")
    legend = [Patch(color=COLOR["forward"], label="forward"),
              Patch(color=COLOR["backward"][0], label="backward node"),
              Patch(color=COLOR["wait"], label=f"wait for {collectives}" + (
                  " / all-gather" if any(e["name"] == "wait for all-gather" for e in drawn)
                  else "")),
              Patch(color=COLOR["optimizer"], label="optimizer step")]
    # One entry per bucket colour drawn (an outside reader could not tell a third bucket's).
    indices = sorted({int(c[1]) for c in (bucket_collective(e["name"]) for e in drawn
                                          if is_bucket_collective(e)) if c[1].isdigit()}) or [0, 1]
    shown = indices[:len(COLOR["bucket"])]
    for k, index in enumerate(shown):
        more = ", …" if k == len(shown) - 1 and len(indices) > len(shown) else ""
        legend.append(Patch(color=COLOR["bucket"][index % len(COLOR["bucket"])],
                            label=(f"{collectives} bucket b{index}" if k == 0 else f"b{index}")
                            + more))
    legend += [data_patch,
              Line2D([], [], marker="|", color="grey", linestyle="none", label="gradient final"),
              Line2D([], [], marker="v", color="black", linestyle="none", label="bucket ready"),
              Patch(facecolor="none", edgecolor=COLOR["wait"], hatch="////",
                    label="exposed (after the last gradient)")]
    if any(is_parameter_gather(e) for e in drawn):
        overlapped = any(e["name"].startswith(GATHER_BUCKET) for e in drawn)
        at = legend.index(data_patch)
        legend.insert(at, Patch(color=COLOR["gather"],
                                label="all-gather gN (ZeRO, beside the forward)" if overlapped
                                else "all-gather parameters (ZeRO)"))
        if any(e["name"] == LAUNCH_GATHERS for e in drawn):
            legend.insert(at + 1, Patch(color=COLOR["launch"],
                                        label="launch all-gathers (ZeRO step)"))
    if any(e["track"] == "communication" and e["name"] == HEALTH for e in drawn):
        # Before "data", the other grey: the two are told apart by their rows.
        legend.insert(legend.index(data_patch), Patch(color=COLOR["health"], label=HEALTH))
    for x, _ in marks:  # each step's end (named in the header)
        ax.axvline(x - t0, color="black", linewidth=0.8, linestyle="--")
    # Two rows whatever the entries: a third would run into the title.
    # Two rows whatever the entries: a third would run into the title. Many entries (ZeRO's
    # gathers and launch, a bucket colour each) get a smaller font, so the rows fit the width.
    ncol = (len(legend) + 1) // 2
    crowded = len(legend) > 12
    ax.legend(handles=legend, fontsize=6 if crowded else 7, ncol=ncol, loc="lower left",
              bbox_to_anchor=(0, 1.0), columnspacing=0.6 if crowded else 1.0,
              handlelength=1.0 if crowded else 1.4, frameon=False)
    ax.set_title(title, fontsize=9, pad=30, loc="left")
    if args.footnote:
        fig.text(0.01, 0.005, args.footnote, fontsize=7, color="#666666", ha="left",
                 va="bottom")
        fig.tight_layout(rect=(0, 0.05, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    # For papers, the same chart as SVG beside the PNG (text kept as text).
    svg = os.path.splitext(args.out)[0] + ".svg"
    plt.rcParams["svg.fonttype"] = "none"
    fig.savefig(svg)
    plt.close(fig)


def pick_step(args, path, spans, ranks, prefer=None):
    """(own, lo, hi, what, step) of the chosen step of one trace; raises InputError. Without
    --step, `prefer` (the first trace's step number, with --compare) wins when this trace has it,
    so that the two runs show the same step of their runs."""
    windows = step_windows(ranks, spans)
    if not windows:
        raise InputError(f"{path}: no \"optimizer step\" spans, so no steps to choose from; "
                         "pass --from-ms and --to-ms")
    if args.step is not None:
        step = args.step
    elif prefer is not None and prefer <= len(windows):
        step = prefer
    else:
        step = typical_step(windows)
    if step > len(windows):
        raise InputError(f"--step {step}: {path} records {len(windows)} step(s); pass "
                         f"1..{len(windows)} (nanoddp-train --trace-steps sets how many)")
    own = windows[step - 1]
    lo, hi = min(a for a, _ in own.values()), max(b for _, b in own.values())
    # The step's own length, not the drawn window's (which adds room on both sides).
    return own, lo, hi, f"step {step} of {len(windows)} recorded, {hi - lo:.2f} ms", step


def summary_lines(ranks, spans, lo, hi, own):
    lines = []
    for name, total, comm, early, hidden, gather, gather_after, overlapped, gathers in \
            overlap_summary(ranks, spans, lo, hi, own):
        parts = []
        if comm:
            share = 100 * hidden / total if total > 0 else 0
            parts.append(f"{kinds_text(comm)}, {early} started before backward ended; "
                         f"{total:.2f} ms, of which {hidden:.2f} ms ({share:.0f}%) while a "
                         "backward node ran")
        if gather > 0 and overlapped:
            parts.append(f"{gathers} all-gather(s), {gather:.2f} ms in all, beside the forward, "
                         f"which waited {gather_after:.2f} ms for them")
        elif gather > 0:
            exposed = ("all of it exposed" if gather_after == gather else
                       f"{gather_after:.2f} ms of it after backward ended")
            parts.append(f"then {GATHER} {gather:.2f} ms, {exposed}")
        if parts:
            lines.append(f"{name}: " + "; ".join(parts))
    return lines


def derived_label(ranks, spans, lo, hi, own):
    """What a trace's step shows it ran, for --compare without --labels (a trace holds no command
    line): "ZeRO-2" (reduce-scatters), "ZeRO-1" (all-reduces, then the parameter all-gather) or
    "DDP"; then "overlapped" when a bucket collective started before backward ended, "not
    overlapped" when each rank had several and none did (with one bucket, neither can be told).
    What the drawn step shows, not the flags: under load an overlap-on step may show none."""
    summary = overlap_summary(ranks, spans, lo, hi, own)
    kinds = {bucket_collective(e["name"])[0] for row in summary for e in row[2]}
    gathers = any(row[5] > 0 for row in summary)
    label = "ZeRO-2" if "reduce-scatter" in kinds else "ZeRO-1" if gathers else "DDP"
    if any(row[3] > 0 for row in summary):
        label += ", overlapped"
    elif summary and all(len(row[2]) > 1 for row in summary):
        label += ", not overlapped"
    return label


def thread_count(spans):
    """Per rank, each track with spans is a thread (compute, the communication worker)."""
    return len({(e["pid"], e["track"]) for e in spans
                if e["track"] in ("compute", "communication")})


def threads_text(spans, ranks):
    return (f"{thread_count(spans)} threads ({len(ranks)} rank(s) x compute + communication)")


def main(argv):
    args = parse_args(argv)
    try:
        ranks, spans, instants = load(args.trace)
        args.trace_start = min(e["ts"] for e in spans)
        marks = []
        if args.from_ms is not None:
            lo, hi = args.trace_start + args.from_ms, args.trace_start + args.to_ms
            own = {}
            what = f"{args.from_ms:g}–{args.to_ms:g} ms"
        else:
            own, lo, hi, what, step = pick_step(args, args.trace, spans, ranks)
        threads = threads_text(spans, ranks)
        label_backward_spans(spans, instants)
        lines = summary_lines(ranks, spans, lo, hi, own)
        if args.compare is not None:
            ranks2, spans2, instants2 = load(args.compare)
            own2, lo2, hi2, what2, _ = pick_step(args, args.compare, spans2, ranks2, prefer=step)
            if args.labels is not None:
                names = args.labels.split(",")
            else:
                names = [derived_label(ranks, spans, lo, hi, own),
                         derived_label(ranks2, spans2, lo2, hi2, own2)]
                if names[0] == names[1]:  # the spans do not tell them apart: the file names do
                    names = [f"{names[0]} ({os.path.basename(args.trace)})",
                             f"{names[1]} ({os.path.basename(args.compare)})"]
            # Each run's own threads: the two ran one after the other, not at the same time.
            threads = (f"{names[0]}: {threads}; "
                       f"{names[1]}: {threads_text(spans2, ranks2)}")
            label_backward_spans(spans2, instants2)
            lines = [f"{names[0]}: {line}" for line in lines] + \
                [f"{names[1]}: {line}" for line in summary_lines(ranks2, spans2, lo2, hi2, own2)]
            # The second trace's step shifted to start where the first's does, its ranks renamed.
            shift = lo - lo2
            offset = 1 + max(pid for pid, _ in ranks)
            for e in spans2 + instants2:
                e["ts"] += shift
                e["pid"] += offset
            own.update({pid + offset: (a + shift, b + shift) for pid, (a, b) in own2.items()})
            ranks = [(pid, f"{names[0]} · {name}") for pid, name in ranks] + \
                [(pid + offset, f"{names[1]} · {name}") for pid, name in ranks2]
            spans, instants = spans + spans2, instants + instants2
            first_end, second_end = hi, hi2 + shift
            marks = [(first_end, f"{names[0]}: {first_end - lo:.2f} ms "),
                     (second_end, f"{names[1]}: {second_end - lo:.2f} ms "
                                  f"(difference {second_end - first_end:+.2f} ms) ")]
            second = names[1] if os.path.basename(args.compare) in names[1] else \
                f"{names[1]} ({os.path.basename(args.compare)})"
            what = f"{names[0]}: {what}; {second}: {what2}"
            hi = max(hi, second_end)
        if args.from_ms is None:
            # A little room on both sides, so the first and last bars are not cut by the frame.
            pad = 0.01 * (hi - lo)
            lo, hi = lo - pad, hi + pad
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.out is None:
        args.out = os.path.splitext(args.trace)[0] + ".png"
    cores = args.cores or os.cpu_count()
    machine = (f"{threads} on {cores} core(s)"
               f"{'' if args.cores else ' (this machine count)'}")
    title = (f"{args.title}\n" if args.title else f"{os.path.basename(args.trace)}: ") + \
        f"{what}\n{machine}"
    if lines:
        # A ZeRO rank's line (its all-gather too) is longer than the chart is wide.
        title += "\n" + "\n".join(textwrap.fill(line, 150, subsequent_indent="    ")
                                  for line in lines)
    if marks:
        title += "\nstep (dashed lines): " + ", ".join(text.strip() for _, text in marks)
    try:
        out_dir = os.path.dirname(os.path.abspath(args.out))
        os.makedirs(out_dir, exist_ok=True)
        draw(args, ranks, spans, instants, lo, hi, own, title, marks)
    except ImportError as e:
        print(f"{PROG}: error: {e}. Install Debian's python3-matplotlib "
              "(scripts/install-deps.sh) and run this with /usr/bin/python3.", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: error: --out {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: timeline of {what} ({len(ranks)} rank(s))")
    print(f"  {machine}")
    print(f"wrote {os.path.splitext(args.out)[0] + '.svg'}: the same chart as SVG")
    for line in lines:
        print("  " + line)
    for _, text in marks:
        print("  step " + text.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
