#!/usr/bin/python3
"""A timeline PNG (and an SVG beside it) of one training step from a nanoddp Chrome trace
(nanoddp-train --trace FILE).

  benchmarks/plot/plot_trace.py TRACE.json [--out PNG] [--step K | --from-ms A --to-ms B]
                                [--compare TRACE2.json [--labels A,B]] [--cores N]

The trace (engine/trace.cpp) has one process per rank and four tracks: compute (forward,
each backward node, "wait for all-reduce" (ZeRO-2: "wait for reduce-scatter"), optimizer
step), communication (each bucket's all-reduce), markers ("grad <parameter>" when a gradient is
final, drawn as small ticks; "bucket N ready") and data ("data"; with --prefetch also the worker's
"prefetch data", drawn on a row of its own). The chart has one row per rank x track, spans as
bars, so the all-reduce of bucket 0 can be seen running while the rest of backward still computes
(overlap on), or starting only after it (nanoddp-train --no-overlap). A rank without
communication (one rank) gets no communication row, and the legend lists only what is drawn.

Under nanoddp-train --zero 2 a bucket's collective is a "reduce-scatter bucket N" span instead
(comm/zero.h), and under --zero 1 and 2 the optimizer step ends with one "all-gather parameters"
span: the reduce-scatters are drawn and counted as the bucket collectives they are (a colour per
bucket, the ready arrows, the header's figures), the all-gather in its own colour and, since it
runs after the update with nothing left to hide it, as exposed communication. nanoddp-train's
per-step "health all-reduce" (loss and non-finite counts) is drawn grey on the communication row
and named in the legend when the window holds one; it is never counted as a bucket collective.
With --zero-overlap-gather the all-gather is one "all-gather bucket N" span per bucket ("gN"),
running beside the next forward, and the forward's "wait for all-gather" spans are what of it is
exposed: drawn as a thinner red bar on top of the forward they lie in.

On the chart: each backward span is named after the module whose gradients it finished (the
gradient ticks that follow it: "backward layers.4") where the bar is wide enough for the name,
each module's ticks are labelled once ("∇layers.4"; a label that would overlap another is moved
below it or left out), an arrow links each "bucket N ready" marker to the start of that bucket's
all-reduce, a dotted line marks each rank's last gradient, and the all-reduce time after it (the
exposed communication, as the Reducer counts it; with ZeRO, the all-gather too) is hatched. The
header states the step and its length as nanoddp-train's step_ms counts it: from the step's data
to the end of its optimizer step, the data time left out (and stated apart); with several ranks,
the first rank's (rank 0's, whose step_ms nanoddp-train prints). Then how many threads (per rank:
compute, the communication worker, the --prefetch worker) shared how many cores (--cores, default
this machine's).
--compare draws a second trace's step (e.g. --no-overlap) below the first on the same time axis,
the two steps lined up where their data ended (0 on the axis: each step's time from there, data
excluded, is its step_ms), with each step's end and the difference marked; the header gives each
run's step and threads apart (the runs did not share the cores), and without --step the second
trace shows the same step number as the first when it has it. Without --labels each trace is
named by what its step shows: "DDP", "ZeRO-1" or "ZeRO-2", then "overlapped" or "not overlapped"
where the bucket collectives tell (with one bucket they cannot; it is what the step shows, not the
flag: under load an overlap-on step may show none), and the file name when the two read the same.

A step runs from its data (the first data or compute span after the previous "optimizer step") to
the end of its own "optimizer step", on each rank; the window covers all ranks, and the
neighbouring steps' spans in it are faded. An --optimizer-in-backward trace has no "optimizer
step" (its updates are "optimizer update" spans inside backward): there a step is its forward
pass(es), up to the last compute or communication span before the next step's data; a
micro-batch whose backward holds updates is the last of its step (--grad-accum, read from the
trace's run_config). --step K picks the K-th recorded step (1 = the first; a resumed run's
trace also names the run's own number, from run_config's first_step); the default is the step of
median length after the first (a typical one, not the warm-up or an outlier). --from-ms and
--to-ms pick a window instead, in ms from the start of the trace; a --to-ms past the trace's end
ends the window there, with a note.

It prints "wrote PATH.png: ..." and "wrote PATH.svg: ..." (the two files it writes; --out must
name a .png: a new file in an existing folder, or a regular file to replace; in the SVG each bar
and gradient label has an id, svg_id's, that names what it shows), then, per rank, how
many of the step's all-reduces (or reduce-scatters) started before its backward pass ended (with
--no-overlap: none), and how much of their time a backward node was running at the same time (on
a machine with fewer cores than threads, the compute thread may be descheduled while the
all-reduce runs, so an early start does not guarantee hidden time); with ZeRO, then the
all-gather's time, all of it exposed. With --compare each run is summarised apart, labelled: its
ranks, step, threads and those lines.

A partial trace (T.rankR.partial.json: nanoddp-train writes one per rank when a run stops inside
its traced steps, a collective timed out, a NaN, a lost peer or a SIGINT/SIGTERM/SIGHUP; its
run_config says partial, rank, world_size and stopped_in_step) holds one rank's events: the steps
before the one it stopped in whole, that one cut short (no optimizer step). The header and the
summary say so ("partial trace: rank R of W alone, written when the run stopped in step S"), and
by default it draws the step the run stopped in, from its start to the rank's last event, with
how the rank stopped there (its last event; the buckets ready whose collective never ended, since
a span is recorded when it ends); --step K draws a whole earlier step. --compare of two ranks'
partial traces of one stopped run draws both at their own times (one host, one clock: no shift),
each row labelled by its rank and how it stopped, the step each stopped in as the window and each
last event dashed; files of different runs (run_config's world_size, restart or first_step
differ, the same rank twice, or times that do not overlap) are refused, as is a partial trace
compared with a whole one.

A leading UTF-8 byte order mark is skipped, as nanoddp-sim skips it (RFC 8259 allows it).
Bad input exits 2 with one line naming the file (and the event, as traceEvents[i], where one is
at fault), never drawing it: a missing file, anything but a regular file (a FIFO, /dev/zero, a
folder), a file over 256 MiB (record fewer steps: --trace-steps), not JSON, a span whose ts or dur
is not a finite number >= 0 (or lasts more than a day), the same span twice, no such step, or
times that cannot be a training run's: a step of no length, an optimizer step with no forward
before it, two forwards or optimizer steps of one rank at once, a forward with no backward before
the next, more forwards in a step than --grad-accum or more steps than run_config says the trace
holds (two ranks' events under one pid, as when traces are merged by relabelling; a step skipped
by --skip-nonfinite has no optimizer step and is refused too: pass --from-ms and --to-ms), or
ranks whose steps do not overlap in time (their collectives join them, so their clocks differ: a
trace merged from several hosts). Such traces are refused, not redrawn: the script cannot tell
which events are whose, nor how far apart the clocks are. Whatever else goes wrong is one line
naming the file too (exit 1), never a traceback.

This file is the command line and the drawing; trace_file.py reads and checks a trace and finds
its steps, trace_summary.py puts a step's figures into the header's words.
"""

import argparse
import bisect
import math
import os
import re
import stat
import sys
import textwrap

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPT_DIR)

from records import InputError  # noqa: E402
from trace_file import (  # noqa: E402
    BUCKET_KINDS, CURRENT_FILE, GATHER, GATHER_BUCKET, HEALTH, LAUNCH_GATHERS, WAITS, Window,
    bucket_collective, is_bucket_collective, is_parameter_gather, load, reference_pid, visible,
    window_of)
from trace_summary import (  # noqa: E402
    derived_label, partial_text, pick_step, stop_label, stop_text, summary_lines, threads_text)

PROG = "plot_trace.py"
TRACKS = ["compute", "communication", "markers", "data", "prefetch"]

COLOR = {
    "forward": "#4c72b0",
    "backward": ("#dd8452", "#f2b482"),  # alternating, so neighbouring nodes stay apart
    "wait": "#c44e52",
    "optimizer": "#55a868",
    "update": "#8cc99b",  # --optimizer-in-backward's updates, inside backward
    "data": "#9a9a9a",
    "prefetch": "#c0c0c0",
    "bucket": ("#8172b3", "#b07aa1", "#64b5cd", "#937860", "#da8bc3", "#8c8c8c"),
    "gather": "#ccb974",
    "launch": "#e9dfb4",  # ZeRO's step launching the gathers (--zero-overlap-gather)
    "health": "#cccccc",  # nanoddp-train's per-step health all-reduce (in the legend when drawn)
    "other": "#cccccc",
}


def finite_ms(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ms") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of ms")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Timeline PNG (and SVG) of one step of a nanoddp-train --trace "
        "file.")
    parser.add_argument("trace", metavar="TRACE.json", help="written by nanoddp-train --trace")
    parser.add_argument("--out", metavar="PNG",
                        help="output .png (default: the trace's name with .png); the same chart "
                        "is written as SVG beside it, with .svg")
    parser.add_argument("--step", type=int, metavar="K",
                        help="the K-th recorded step, from 1 (default: the step of median length)")
    parser.add_argument("--from-ms", type=finite_ms, metavar="A",
                        help="window start, ms after the trace's first event")
    parser.add_argument("--to-ms", type=finite_ms, metavar="B",
                        help="window end, ms after the trace's first event")
    parser.add_argument("--title", help="chart title (default: the trace's file name and step)")
    parser.add_argument("--compare", metavar="TRACE2.json",
                        help="a second trace (e.g. the same run with --no-overlap): its step is "
                             "drawn below the first on the same time axis, the two lined up "
                             "where their data ended, with the step-time difference marked")
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
    # argparse keeps the last of a repeated option without a word.
    for option in ("--out", "--step", "--from-ms", "--to-ms", "--title", "--compare", "--labels",
                   "--cores", "--footnote"):
        if sum(1 for a in argv if a == option or a.startswith(option + "=")) > 1:
            parser.error(f"{option} is given twice: give it once")
    args = parser.parse_args(argv)
    if args.step is not None and (args.from_ms is not None or args.to_ms is not None):
        parser.error("--step and --from-ms/--to-ms choose the window two ways; pass one")
    if (args.from_ms is None) != (args.to_ms is None):
        parser.error("--from-ms and --to-ms go together")
    if args.from_ms is not None and args.from_ms < 0:
        parser.error(f"--from-ms {args.from_ms:g}: the window starts at or after the trace's "
                     "first event (0)")
    if args.from_ms is not None and not args.from_ms < args.to_ms:
        parser.error(f"--from-ms {args.from_ms:g} must be less than --to-ms {args.to_ms:g}")
    if args.step is not None and args.step < 1:
        parser.error(f"--step {args.step}: steps count from 1")
    if args.compare is not None and args.from_ms is not None:
        parser.error("--compare aligns the two traces' steps; pass --step, not --from-ms/--to-ms")
    if args.labels is not None and args.compare is None:
        parser.error("--labels names the two runs of --compare; without --compare it would be "
                     "ignored")
    if args.labels is not None and (len(args.labels.split(",")) != 2 or
                                    not all(n.strip() for n in args.labels.split(","))):
        parser.error(f"--labels {args.labels!r}: two names separated by a comma")
    if args.compare is not None and os.path.exists(args.compare) and \
            os.path.exists(args.trace) and os.path.samefile(args.trace, args.compare):
        parser.error(f"--compare {args.compare}: the same file as {args.trace}; compare two runs' "
                     "traces")
    if args.cores is not None and args.cores < 1:
        parser.error(f"--cores {args.cores}: at least 1")
    return args


# ---------------------------------------------------------------------------------------------
# What the bars are


def small_int(text):
    """'3' -> 3; None for anything but a few ASCII digits ('²'.isdigit() is True, yet int('²')
    fails)."""
    return int(text) if re.fullmatch(r"[0-9]{1,9}", str(text)) else None


def style_of(event):
    name = event["name"]
    if name == "forward":
        return COLOR["forward"], "forward"
    if name.startswith("backward"):
        seq = small_int(event["args"].get("node", "0"))
        shade = COLOR["backward"][seq % 2 if seq is not None else 0]
        if "module" in event:
            return shade, f"backward {event['module']}"
        return shade, name[len("backward "):].replace("Backward", "")
    if name in WAITS:
        return COLOR["wait"], "wait"
    if name == "optimizer step":
        return COLOR["optimizer"], "optimizer"
    if name == "optimizer update":
        return COLOR["update"], "update"
    if name == "data":
        return COLOR["data"], "data"
    if name == "prefetch data":
        return COLOR["prefetch"], "prefetch"
    collective = bucket_collective(name)
    if collective is not None:
        # The legend names the collective: "reduce-scatter b0" would not fit a short bar.
        index = small_int(collective[1])
        return COLOR["bucket"][(index or 0) % len(COLOR["bucket"])], f"b{collective[1]}"
    if name == GATHER:
        return COLOR["gather"], "all-gather"
    if name.startswith(GATHER_BUCKET):
        return COLOR["gather"], f"g{name[len(GATHER_BUCKET):]}"
    if name == LAUNCH_GATHERS:
        return COLOR["launch"], "launch"
    if name == HEALTH:
        return COLOR["health"], name
    return COLOR["other"], name


def bucket_kinds(spans):
    """The bucket collectives among the spans, in BUCKET_KINDS order: the legend names those
    drawn (a --compare of DDP with ZeRO-2 has both)."""
    present = {bucket_collective(e["name"])[0] for e in spans if is_bucket_collective(e)}
    return [k for k in BUCKET_KINDS if k in present]


def module_of(grad_name):
    """'grad layers.4.weight' -> 'layers.4'."""
    name = grad_name[len("grad "):] if grad_name.startswith("grad ") else grad_name
    return name.rsplit(".", 1)[0] if "." in name else name


def label_backward_spans(trace, spans):
    """Names each backward span among `spans` after the module whose gradients it finished:
    autograd marks a parameter's gradient final ("grad layers.4.weight") right after the node
    that wrote it, so the gradient ticks between a node's end and the next node's start belong
    to it."""
    for pid in {e["pid"] for e in spans}:
        events = trace.by_pid[pid]
        nodes = [e for e in events.spans if e["name"].startswith("backward")]
        node_ts = [e["ts"] for e in nodes]
        for node in spans:
            if node["pid"] != pid or not node["name"].startswith("backward"):
                continue
            end = node["ts"] + node["dur"]
            k = bisect.bisect_right(node_ts, node["ts"])
            while k < len(nodes) and nodes[k] is node:
                k += 1
            until = nodes[k]["ts"] if k < len(nodes) else end + 1.0
            first = bisect.bisect_left(events.grad_ts, end - 1e-3)
            last = bisect.bisect_right(events.grad_ts, until)
            modules = []
            for g in events.grads[first:last]:
                if module_of(g["name"]) not in modules:
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


# ---------------------------------------------------------------------------------------------
# Drawing

ROW_HEIGHT = {"compute": 1.0, "communication": 1.0, "markers": 0.7, "data": 0.5, "prefetch": 0.5}
# Points per character of the chart's fonts (DejaVu Sans averages ~0.6 em) and the figure's width
# in points: enough to tell whether a label fits its bar, and how long a header line or a legend
# row may be before it runs past the figure's right edge (a --compare header did).
CHAR_EM = 0.57
FIGURE_INCHES = 12
FIGURE_PT = FIGURE_INCHES * 72


def svg_id(*parts):
    """The id of a drawn element in the SVG ("bar.p0.compute.forward.n3"): its parts joined by
    dots, anything but letters, digits, '.', '_' and '-' made '_' (an XML name), so that a test
    or a tool can find what was drawn, and where, in the SVG's text."""
    return ".".join(re.sub(r"[^A-Za-z0-9._-]", "_", str(part)) for part in parts)


def text_ms(text, fontsize, width_ms, axes_pt):
    """How many ms of the axis a label of `fontsize` takes."""
    return (len(text) * fontsize * CHAR_EM + 4) * width_ms / axes_pt


def legend_rows(labels, axes_pt, fontsize):
    """The fewest rows (from 2) in which the legend's columns fit the axes' width."""
    for rows in range(2, 6):
        columns = [labels[i:i + rows] for i in range(0, len(labels), rows)]
        width = sum((max(len(t) for t in column) * CHAR_EM + 1.4 + 1.0) * fontsize
                    for column in columns)
        if width <= axes_pt:
            return rows
    return 6


def wrap(text, chars):
    """Each header line wrapped to `chars` characters."""
    return "\n".join(textwrap.fill(line, chars, subsequent_indent="    ")
                     for line in text.split("\n"))


def draw(args, ranks, spans, instants, lo, hi, own, title, marks=(), origin=None,
         comm_ranks=()):
    """own: {pid: Window} of the chosen step on each rank; other spans are drawn faded. origin:
    the time drawn as 0 (default lo). comm_ranks: the pids given a communication row."""
    # Imported here, not at the top: a bad trace is refused (exit 2) without waiting for
    # matplotlib, or having it. figure.py picks the headless backend and keeps SVG text as text.
    from figure import DPI, footnote, new_figure
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    # A "$" in a title, a file or a module name is text, not the start of a formula.
    plt.rcParams["text.parse_math"] = False
    t0 = lo if origin is None else origin
    width_ms = hi - lo
    rows = []  # (pid, track, label, centre y, height)
    y = 0.0
    occupied = {(e["pid"], e["track"]) for e in spans + instants}
    for pid, name in ranks:
        for track in TRACKS:
            if (pid, track) in occupied or track == "compute" or \
                    (track == "communication" and pid in comm_ranks):
                h = ROW_HEIGHT[track]
                label = f"{name} · {track}"
                if len(label) > 60:  # a long process name would leave no room for the chart
                    label = label[:28] + "…" + label[-31:]
                rows.append((pid, track, label, y + h / 2, h))
                y += h
    # The axes' width: the figure's, less the row labels on the left and a margin.
    axes_pt = FIGURE_PT - max(len(label) for _, _, label, _, _ in rows) * 8 * CHAR_EM - 30
    axes_pt = max(axes_pt, FIGURE_PT / 2)
    fig, axes = new_figure(width=FIGURE_INCHES, height=1.9 + 0.42 * y)
    ax = axes[0][0]
    row_of = {(pid, track): (centre, h) for pid, track, _, centre, h in rows}

    def faded(e):
        start, end = window_of(own, e["pid"], lo, hi)
        return e["ts"] + e.get("dur", 0) <= start or e["ts"] >= end

    drawn = []
    for e in spans:
        row = row_of.get((e["pid"], e["track"]))
        start, end = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
        if row is None or end <= start:
            continue
        drawn.append(e)
        centre, h = row
        color, short = style_of(e)
        alpha = 0.3 if faded(e) else 1.0
        # A wait for an all-gather lies inside "forward": drawn thinner and on top of it, so that
        # the wait the header counts is seen.
        nested = e["name"] == "wait for all-gather"
        height = 0.45 * h if nested else 0.7 * h
        module = ["of", e["module"]] if "module" in e else []
        ax.broken_barh([(start - t0, end - start)], (centre - height / 2, height),
                       facecolors=color, edgecolor="white", linewidth=0.4, alpha=alpha,
                       zorder=3 if nested else 2,
                       gid=svg_id("bar", f"p{e['pid']}", e["track"], e["name"], *module,
                                  f"n{len(drawn)}"))
        if not nested and end - start > text_ms(short, 7, width_ms, axes_pt):
            ax.text((start + end) / 2 - t0, centre, short, ha="center", va="center", fontsize=7,
                    clip_on=True, alpha=alpha, zorder=4)
    # The exposed part: each rank's all-reduce (or reduce-scatter) time after its backward's last
    # gradient, and ZeRO's all-gather, which starts after it.
    hatched = False
    for pid, _ in ranks:
        start, end = window_of(own, pid, lo, hi)
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
                hatched = True
                ax.broken_barh([(a - t0, b - a)], (centre - 0.35 * h, 0.7 * h),
                               facecolors="none", edgecolor=COLOR["wait"], hatch="////",
                               linewidth=0.0, zorder=3)
        ax.plot([backward_end - t0] * 2, [centre - 0.5 * h, centre + 0.5 * h], color="black",
                linewidth=0.6, linestyle=":")
    # Each bucket's ready marker linked to the start of its all-reduce (or reduce-scatter).
    runs_of = {}
    for r in spans:
        if is_bucket_collective(r):
            runs_of.setdefault((r["pid"], bucket_collective(r["name"])[1]), []).append(r)
    for runs in runs_of.values():
        runs.sort(key=lambda r: r["ts"])
    for e in instants:
        if not (e["name"].startswith("bucket ") and e["name"].endswith(" ready")):
            continue
        bucket = e["name"][len("bucket "):-len(" ready")]
        ready_row = row_of.get((e["pid"], e["track"]))
        comm_row = row_of.get((e["pid"], "communication"))
        runs = [r for r in runs_of.get((e["pid"], bucket), []) if r["ts"] >= e["ts"] - 1e-3]
        if ready_row is None or comm_row is None or not runs:
            continue
        run = runs[0]
        ax.annotate("", xy=(run["ts"] - t0, comm_row[0] + 0.35 * comm_row[1]),
                    xytext=(e["ts"] - t0, ready_row[0] - 0.2 * ready_row[1]),
                    arrowprops=dict(arrowstyle="->", color="black", linewidth=0.6,
                                    alpha=0.3 if faded(e) else 0.8))
    # Gradient ticks: one label per module, at its first tick; a label that would overlap the
    # previous one on its level goes a level lower, or is left out (the backward bar names it).
    labelled = set()
    level_end = {}
    for e in sorted(instants, key=lambda e: e["ts"]):
        row = row_of.get((e["pid"], e["track"]))
        if row is None or not e["name"].startswith("grad "):
            continue
        key = (e["pid"], module_of(e["name"]), window_of(own, e["pid"], lo, hi))
        if key in labelled or faded(e):
            continue
        labelled.add(key)
        label = "∇" + module_of(e["name"])
        half = text_ms(label, 5.5, width_ms, axes_pt) / 2
        x = e["ts"] - t0
        for level in (0, 1):
            if level_end.get((e["pid"], e["track"], level), -math.inf) <= x - half:
                level_end[(e["pid"], e["track"], level)] = x + half
                ax.text(x, row[0] + (0.45 + 0.3 * level) * row[1], label, ha="center",
                        va="top", fontsize=5.5, color="dimgrey",
                        gid=svg_id("grad-label", f"p{e['pid']}", module_of(e["name"]),
                                   f"n{len(labelled)}"))
                break
    last_label = {}
    grads_drawn = ready_drawn = False
    for e in sorted(instants, key=lambda e: e["ts"]):
        row = row_of.get((e["pid"], e["track"]))
        if row is None:
            continue
        centre, h = row
        alpha = 0.3 if faded(e) else 1.0
        x = e["ts"] - t0
        if e["name"] == "grad" or e["name"].startswith("grad "):
            # One per parameter ("grad layers.4.weight"): a small unlabelled tick, so that the
            # bucket markers' labels stay readable.
            ax.plot([x], [centre + 0.1 * h], marker="|", color="grey", markersize=7, alpha=alpha)
            grads_drawn = True
            continue
        ax.plot([x], [centre + 0.1 * h], marker="v", color="black", markersize=6, alpha=alpha)
        ready_drawn = ready_drawn or e["name"].endswith(" ready")
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
    ax.set_xlim(lo - t0, hi - t0)
    if origin is None:
        ax.set_xlabel(f"ms (from {lo - args.trace_start:.1f} ms into the trace; faded: the "
                      "neighbouring steps)")
    else:
        ax.set_xlabel("ms from where each step's data ended (faded: the neighbouring steps)")
    ax.grid(True, axis="x", alpha=0.3)
    legend = legend_entries(drawn, hatched, grads_drawn, ready_drawn, Patch, Line2D)
    for x, _ in marks:  # each step's end (named in the header)
        ax.axvline(x - t0, color="black", linewidth=0.8, linestyle="--")
    # As few rows as fit the width (two, unless long labels or many entries need more: ZeRO's
    # gathers and launch, a bucket colour each); the title is raised above them.
    rows_needed = 0
    if legend:
        fontsize = 7 if len(legend) <= 12 else 6
        rows_needed = legend_rows([h.get_label() for h in legend], axes_pt, fontsize)
        ncol = (len(legend) + rows_needed - 1) // rows_needed
        ax.legend(handles=legend, fontsize=fontsize, ncol=ncol, loc="lower left",
                  bbox_to_anchor=(0, 1.0), columnspacing=1.0, handlelength=1.4, frameon=False)
    # The title may run on over the right margin (20 pt).
    ax.set_title(wrap(title, int((axes_pt + 20) / (9 * CHAR_EM))), fontsize=9,
                 pad=8 + 11 * rows_needed, loc="left")
    if args.footnote:
        footnote(fig, args.footnote)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
    else:
        fig.tight_layout()
    # "tight": should an estimate above fall short, the figure grows rather than cut the text.
    fig.savefig(args.out, dpi=DPI, format="png", bbox_inches="tight", pad_inches=0.1)
    fig.savefig(args.svg, format="svg", bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)


def legend_entries(drawn, hatched, grads_drawn, ready_drawn, Patch, Line2D):
    """One entry per kind of bar or marker drawn, none for what the chart does not show (a
    one-rank trace listed all-reduces it never had)."""
    names = {e["name"] for e in drawn}
    legend = []
    if "forward" in names:
        legend.append(Patch(color=COLOR["forward"], label="forward"))
    if any(n.startswith("backward") for n in names):
        legend.append(Patch(color=COLOR["backward"][0], label="backward node"))
    waits = [w[len("wait for "):] for w in WAITS if w in names]
    if waits:
        legend.append(Patch(color=COLOR["wait"], label="wait for " + " / ".join(waits)))
    if "optimizer step" in names:
        legend.append(Patch(color=COLOR["optimizer"], label="optimizer step"))
    if "optimizer update" in names:
        legend.append(Patch(color=COLOR["update"], label="optimizer update (in backward)"))
    # One entry per bucket colour drawn (an outside reader could not tell a third bucket's).
    collectives = " / ".join(bucket_kinds(drawn))
    buckets = {bucket_collective(e["name"])[1] for e in drawn if is_bucket_collective(e)}
    indices = sorted(i for i in map(small_int, buckets) if i is not None)
    shown = indices[:len(COLOR["bucket"])]
    for k, index in enumerate(shown):
        more = ", …" if k == len(shown) - 1 and len(indices) > len(shown) else ""
        legend.append(Patch(color=COLOR["bucket"][index % len(COLOR["bucket"])],
                            label=(f"{collectives} bucket b{index}" if k == 0 else f"b{index}")
                            + more))
    if any(is_parameter_gather(e) for e in drawn):
        overlapped = any(e["name"].startswith(GATHER_BUCKET) for e in drawn)
        legend.append(Patch(color=COLOR["gather"],
                            label="all-gather gN (ZeRO, beside the forward)" if overlapped
                            else "all-gather parameters (ZeRO)"))
    if LAUNCH_GATHERS in names:
        legend.append(Patch(color=COLOR["launch"], label="launch all-gathers (ZeRO step)"))
    if any(e["track"] == "communication" and e["name"] == HEALTH for e in drawn):
        legend.append(Patch(color=COLOR["health"], label=HEALTH))
    if "data" in names:
        legend.append(Patch(color=COLOR["data"], label="data"))
    if "prefetch data" in names:
        legend.append(Patch(color=COLOR["prefetch"], label="prefetch data (--prefetch worker)"))
    if grads_drawn:
        legend.append(Line2D([], [], marker="|", color="grey", linestyle="none",
                             label="gradient final"))
    if ready_drawn:
        legend.append(Line2D([], [], marker="v", color="black", linestyle="none",
                             label="bucket ready"))
    if hatched:
        legend.append(Patch(facecolor="none", edgecolor=COLOR["wait"], hatch="////",
                            label="exposed (after the last gradient)"))
    return legend


# ---------------------------------------------------------------------------------------------
# Partial traces: a rank's own events, written when its run stopped inside the traced steps


def partial_lines(trace, own):
    """The header's and the summary's first lines for a partial trace: what it is and, when the
    step it stopped in is drawn, how the rank stopped there."""
    if trace.partial is None:
        return []
    lines = [partial_text(trace)]
    if own == trace.stopped:
        lines.append(stop_text(trace))
    return lines


def partial_pair_text(trace, trace2):
    """--compare of two ranks' partial traces: what the two files are, in one line."""
    p, p2 = trace.partial, trace2.partial
    steps = f"step {p['stopped_in_step']}" if p["stopped_in_step"] == p2["stopped_in_step"] \
        else f"steps {p['stopped_in_step']} and {p2['stopped_in_step']}"
    return (f"partial traces: rank {p['rank']} and rank {p2['rank']} of {p['world_size']}, each "
            f"alone, written when the run stopped in {steps}; one clock (one host), not shifted")


def check_same_run(trace, trace2):
    """--compare of partial traces: two ranks of one stopped run, on one clock."""
    if trace.partial is None or trace2.partial is None:
        partial, other = (trace, trace2) if trace.partial is not None else (trace2, trace)
        raise InputError(
            f"--compare: {partial.path} is a partial trace (one rank of a stopped run) and "
            f"{other.path} is not; compare two ranks' partial traces of one stopped run "
            "(T.rank0.partial.json and T.rank1.partial.json), or two whole traces")
    p, p2 = trace.partial, trace2.partial
    for key in ("world_size", "restart", "first_step"):
        if p[key] != p2[key]:
            raise InputError(
                f"--compare: {trace.path} and {trace2.path} are partial traces of different runs "
                f"(their run_config has {key} {p[key]} and {p2[key]}); compare two ranks of one "
                "stopped run")
    if p["rank"] == p2["rank"]:
        raise InputError(
            f"--compare: {trace.path} and {trace2.path} are both rank {p['rank']}'s partial "
            "traces (of two runs?); compare two ranks of one stopped run")
    if trace.end < trace2.start or trace2.end < trace.start:
        raise InputError(
            f"--compare: {trace.path} and {trace2.path} do not overlap in time, yet the ranks of "
            "one run ran their steps together (their collectives join them): partial traces of "
            "two runs, or of two hosts (whose clocks differ)? Compare two ranks of one stopped "
            "run on one host")


# ---------------------------------------------------------------------------------------------
# Output and main


def check_out(out, inputs):
    """--out: a .png (the SVG goes beside it), each a regular file to replace or a new file in an
    existing folder, neither of them an input. Returns the SVG's path."""
    if not out.lower().endswith(".png") or os.path.basename(out) in (".png", ".PNG"):
        raise InputError(f"--out {out}: name a .png file (the chart is a PNG, and the same chart "
                         "is written as SVG beside it)")
    svg = out[:-4] + ".svg"
    for path in (out, svg):
        if os.path.lexists(path):
            try:
                info = os.stat(path)
            except OSError as e:
                raise InputError(f"--out {out}: {path}: {e.strerror}") from None
            if stat.S_ISDIR(info.st_mode):
                raise InputError(f"--out {out}: {path} is a folder; name a file in it")
            if not stat.S_ISREG(info.st_mode):
                raise InputError(f"--out {out}: {path} exists and is not a regular file; name a "
                                 "new file or a file to replace")
            for trace in inputs:
                if os.path.exists(trace) and os.path.samefile(path, trace):
                    raise InputError(f"--out {out}: {path} is the trace {trace} itself")
        else:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise InputError(f"--out {out}: no folder {folder}; create it first")
            if not os.access(folder, os.W_OK):
                raise InputError(f"--out {out}: cannot write in {folder}")
    return svg


def main(argv):
    args = parse_args(argv)
    inputs = [t for t in (args.trace, args.compare) if t]
    try:
        # A wrong --out is said at once, not after reading a long trace.
        if args.out is not None:
            args.svg = check_out(args.out, inputs)
        trace = load(args.trace, windowed=args.from_ms is not None)
        if trace.windows is None:
            print(f"plot_trace.py: note: {trace.steps_note}", file=sys.stderr)
        args.trace_start = trace.start
        marks, origin, runs = [], None, None
        title_name = os.path.basename(args.trace)
        if args.from_ms is not None:
            length = trace.end - trace.start
            if args.from_ms >= length:
                raise InputError(f"--from-ms {args.from_ms:g}: {args.trace} lasts {length:.2f} ms "
                                 "from its first event; start the window before that")
            lo = trace.start + args.from_ms
            own = {}
            if args.to_ms > length:
                # Past the last event there is nothing to draw: the window ends with the trace,
                # and the header says where, instead of naming a window the chart does not show.
                print(f"{PROG}: note: --to-ms {args.to_ms:g} is past the end of {args.trace} "
                      f"({length:.2f} ms after its first event): the window ends there",
                      file=sys.stderr)
                hi = trace.end
                what = f"{args.from_ms:g}–{length:.2f} ms (the trace's end)"
            else:
                hi = trace.start + args.to_ms
                what = f"{args.from_ms:g}–{args.to_ms:g} ms"
        else:
            own, lo, hi, what, step = pick_step(args, trace)
        comm_ranks = {pid for pid, _ in trace.ranks
                      if any(e["track"] == "communication" for e in trace.by_pid[pid].spans)}
        threads = threads_text(trace)
        spans, instants = visible(trace, lo, hi)
        label_backward_spans(trace, spans)
        lines = partial_lines(trace, own) + summary_lines(trace, lo, hi, own)
        ranks = trace.ranks
        mark_heading = "step (dashed lines)"
        if trace.partial is not None and own == trace.stopped and args.compare is None:
            end = own[trace.partial["rank"]].end
            marks = [(end, f"{trace.name_of[trace.partial['rank']]}'s, {end - lo:.2f} ms into "
                           "the step ")]
            mark_heading = "last event (dashed line)"
        if args.compare is not None:
            trace2 = load(args.compare)
        if args.compare is not None and (trace.partial is not None or
                                         trace2.partial is not None):
            # Two ranks of one stopped run (T.rank0.partial.json, T.rank1.partial.json): on one
            # host they share a clock, so each is drawn at its own times, without a shift: where
            # each rank was when the run stopped, the one waiting for the other.
            check_same_run(trace, trace2)
            # Each side: (trace, its file, own, lo, hi, what, label); drawn in rank order,
            # whichever file was named first (--compare T.rank0... T.rank1... names rank 1's
            # file as TRACE.json).
            sides = []
            for k, (t, path) in enumerate(((trace, args.trace), (trace2, args.compare))):
                t_own, t_lo, t_hi, t_what, _ = pick_step(args, t)
                label = args.labels.split(",")[k] if args.labels is not None else \
                    stop_label(t) if t_own == t.stopped else t.name_of[t.partial["rank"]]
                sides.append((t, path, t_own, t_lo, t_hi, t_what, label))
            sides.sort(key=lambda side: side[0].partial["rank"])
            names = [side[6] for side in sides]
            title_name = " and ".join(os.path.basename(side[1]) for side in sides)
            spans, instants, own, lines, runs, marks = [], [], {}, [], [], []
            comm_ranks, ranks = set(), []
            for t, path, t_own, t_lo, t_hi, t_what, label in sides:
                t_spans, t_instants = visible(t, t_lo, t_hi)
                label_backward_spans(t, t_spans)
                spans += t_spans
                instants += t_instants
                own.update(t_own)
                t_lines = partial_lines(t, t_own)[1:] + summary_lines(t, t_lo, t_hi, t_own)
                lines += t_lines
                runs.append((label, f"{label} ({os.path.basename(path)})", t_what, 1,
                             threads_text(t), t_lines))
                comm_ranks |= {pid for pid, _ in t.ranks
                               if any(e["track"] == "communication" for e in t.by_pid[pid].spans)}
                ranks.append((t.partial["rank"], label))
            # One line says what the two files are; then each rank's own.
            lines.insert(0, partial_pair_text(sides[0][0], sides[1][0]))
            threads = "; ".join(f"{run[0]}: {run[4]}" for run in runs)
            lo = min(side[3] for side in sides)
            hi = max(side[4] for side in sides)
            args.trace_start = min(trace.start, trace2.start)
            if all(side[2] == side[0].stopped for side in sides):
                # Each rank's last event: how long one went on, or waited, after the other's.
                (first, *_), (second, *_) = sides
                end = first.stopped[first.partial["rank"]].end
                end2 = second.stopped[second.partial["rank"]].end
                later = round(end2 - end, 2) + 0.0
                marks = [(end, f"{first.name_of[first.partial['rank']]}'s "),
                         (end2, f"{second.name_of[second.partial['rank']]}'s, {abs(later):.2f} "
                                f"ms {'after' if later >= 0 else 'before'} it ")]
                mark_heading = "last events (dashed lines)"
            what = "; ".join(f"{run[0]}: {run[2]}" for run in runs)
        elif args.compare is not None:
            own2, lo2, hi2, what2, _ = pick_step(args, trace2, prefer=step)
            if args.labels is not None:
                names = args.labels.split(",")
            else:
                names = [derived_label(trace, lo, hi, own), derived_label(trace2, lo2, hi2, own2)]
                if names[0] == names[1]:  # the spans do not tell them apart: the file names do
                    names = [f"{names[0]} ({os.path.basename(args.trace)})",
                             f"{names[1]} ({os.path.basename(args.compare)})"]
            # Each run's own threads: the two ran one after the other, not at the same time.
            threads = f"{names[0]}: {threads}; {names[1]}: {threads_text(trace2)}"
            spans2, instants2 = visible(trace2, lo2, hi2)
            label_backward_spans(trace2, spans2)
            lines1 = [f"{names[0]}: {line}" for line in lines]
            lines2 = [f"{names[1]}: {line}" for line in summary_lines(trace2, lo2, hi2, own2)]
            lines = lines1 + lines2
            # The second trace's step shifted so that both steps' data end at one time (each
            # rank 0's): from there each step's length is its step_ms, data excluded, so the
            # marked difference holds no data time. Its ranks renamed.
            ref, ref2 = own[reference_pid(own)], own2[reference_pid(own2)]
            origin = ref.start + ref.data_ms
            shift = origin - (ref2.start + ref2.data_ms)
            offset = 1 + max(pid for pid, _ in ranks)
            spans += [dict(e, ts=e["ts"] + shift, pid=e["pid"] + offset) for e in spans2]
            instants += [dict(e, ts=e["ts"] + shift, pid=e["pid"] + offset) for e in instants2]
            own = dict(own)
            own.update({pid + offset: Window(w.start + shift, w.end + shift, w.data_ms)
                        for pid, w in own2.items()})
            comm_ranks |= {pid + offset for pid, _ in trace2.ranks
                           if any(e["track"] == "communication"
                                  for e in trace2.by_pid[pid].spans)}
            ranks = [(pid, f"{names[0]} · {name}") for pid, name in ranks] + \
                [(pid + offset, f"{names[1]} · {name}") for pid, name in trace2.ranks]
            first_end, second_end = ref.end, ref2.end + shift
            # (Rounded first: a difference of -0.001 ms is "+0.00", not "-0.00".)
            difference = round(ref2.step_ms - ref.step_ms, 2) + 0.0
            marks = [(first_end, f"{names[0]}: {ref.step_ms:.2f} ms "),
                     (second_end, f"{names[1]}: {ref2.step_ms:.2f} ms "
                                  f"(difference {difference:+.2f} ms) ")]
            second = names[1] if os.path.basename(args.compare) in names[1] else \
                f"{names[1]} ({os.path.basename(args.compare)})"
            # stdout summarises each run apart, its ranks too (the two runs' were added up):
            # (label, heading, step, ranks, threads, lines).
            runs = [(names[0], names[0], what, len(trace.ranks), threads_text(trace), lines1),
                    (names[1], second, what2, len(trace2.ranks), threads_text(trace2), lines2)]
            what = f"{names[0]}: {what}; {second}: {what2}"
            lo, hi = min(lo, lo2 + shift), max(hi, hi2 + shift)
        if args.from_ms is None:
            # A little room on both sides, so the first and last bars are not cut by the frame.
            pad = 0.01 * (hi - lo)
            lo, hi = lo - pad, hi + pad
        if args.out is None:
            args.out = os.path.splitext(args.trace)[0] + ".png"
            args.svg = check_out(args.out, inputs)
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    cores = args.cores or os.cpu_count()
    on_cores = f" on {cores} core(s){'' if args.cores else ' (this machine count)'}"
    machine = f"{threads}{on_cores}"
    title = (f"{args.title}\n" if args.title else f"{title_name}: ") + \
        f"{what}\n{machine}"
    if lines:
        title += "\n" + "\n".join(lines)
    if marks:
        title += f"\n{mark_heading}: " + ", ".join(text.strip() for _, text in marks)
    try:
        draw(args, ranks, spans, instants, lo, hi, own, title, marks, origin, comm_ranks)
    except ImportError as e:
        print(f"{PROG}: error: {e}. Install Debian's python3-matplotlib "
              "(scripts/install-deps.sh) and run this with /usr/bin/python3.", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: error: --out {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    if runs is None:
        print(f"wrote {args.out}: timeline of {what} ({len(ranks)} rank(s))")
        print(f"  {machine}")
        print(f"wrote {args.svg}: the same chart as SVG")
        for line in lines:
            print("  " + line)
    else:
        if trace.partial is not None:
            print(f"wrote {args.out}: timeline of {runs[0][0]} and {runs[1][0]} on one time "
                  "axis")
            print("  " + lines[0])
        else:
            print(f"wrote {args.out}: timeline of {runs[0][0]} ({runs[0][3]} rank(s)) and "
                  f"{runs[1][0]} ({runs[1][3]} rank(s)) on one time axis")
        for name, heading, run_what, _, run_threads, run_lines in runs:
            print(f"  {heading}: {run_what}")
            print(f"  {name}: {run_threads}{on_cores}")
            for line in run_lines:
                print("  " + line)
        print(f"wrote {args.svg}: the same chart as SVG")
    if mark_heading != "step (dashed lines)":
        print(f"  {mark_heading}: " + ", ".join(text.strip() for _, text in marks))
    else:
        for _, text in marks:
            print("  step " + text.strip())
    return 0


def run(argv):
    """main, with a last resort: whatever escapes it is one line naming the file, not a
    traceback (the known bad inputs are refused above, each with its own message)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        print(f"{PROG}: error: {CURRENT_FILE[0] or 'the trace'}: out of memory reading or "
              "drawing it; record fewer steps (nanoddp-train --trace-steps)", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"{PROG}: error: {CURRENT_FILE[0] or 'the trace'}: nested too deeply to read",
              file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (the last resort)
        print(f"{PROG}: error: {CURRENT_FILE[0] or 'the trace'}: could not draw it "
              f"({type(e).__name__}: {e}); please report this with the trace", file=sys.stderr)
        return 1


if __name__ == "__main__":
    try:
        status = run(sys.argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:  # the output piped into `head`: what was wanted has been read
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
