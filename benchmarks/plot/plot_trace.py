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
--to-ms pick a window instead, in ms from the start of the trace.

It prints "wrote PATH.png: ..." and "wrote PATH.svg: ..." (the two files it writes; --out must
name a .png: a new file in an existing folder, or a regular file to replace), then, per rank, how
many of the step's all-reduces (or reduce-scatters) started before its backward pass ended (with
--no-overlap: none), and how much of their time a backward node was running at the same time (on
a machine with fewer cores than threads, the compute thread may be descheduled while the
all-reduce runs, so an early start does not guarantee hidden time); with ZeRO, then the
all-gather's time, all of it exposed.

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
"""

import argparse
import bisect
import json
import math
import os
import re
import stat
import sys
import textwrap

PROG = "plot_trace.py"
TRACKS = ["compute", "communication", "markers", "data", "prefetch"]
# The file read so far, named by the last-resort error handler.
CURRENT_FILE = [None]

# Traces of 100 MB (about 50,000 steps of a small model) are real, and take about 10 s and 1 GB
# of memory here (Python's objects take ~9 times the file's size), so a file of more than 2.5
# times that is refused before it is read.
MAX_TRACE_BYTES = 256 * 1024 * 1024
# As nanoddp-sim: no span of a training step lasts a day (a duration in other units than µs?).
MAX_SPAN_US = 86400e6
# Beyond 2^53 a double no longer holds every microsecond (and no steady clock reads that much).
MAX_TS_US = float(2**53)
# More rows than this make an image matplotlib refuses to allocate, and no one can read.
MAX_RANKS = 64

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


class InputError(Exception):
    pass


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
    if args.labels is not None and len(args.labels.split(",")) != 2:
        parser.error(f"--labels {args.labels!r}: two names separated by a comma")
    if args.cores is not None and args.cores < 1:
        parser.error(f"--cores {args.cores}: at least 1")
    return args


# ---------------------------------------------------------------------------------------------
# Reading and checking a trace


def read_text(path):
    """The file's text; refuses anything but a regular file of at most MAX_TRACE_BYTES before
    reading it (/dev/zero never ends, a FIFO blocks until a writer comes)."""
    try:
        info = os.stat(path)  # follows symlinks: a link to a trace is fine
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
        raise InputError(f"{path}: not a regular file ({kind}); pass the file written by "
                         "nanoddp-train --trace")
    too_big = (f"{path}: {{}} bytes, more than the {MAX_TRACE_BYTES} ({MAX_TRACE_BYTES >> 20} "
               "MiB) this script reads (it holds the whole trace in memory); record fewer steps "
               "(nanoddp-train --trace-steps)")
    if info.st_size > MAX_TRACE_BYTES:
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
        while size <= MAX_TRACE_BYTES:  # a file still growing stops at the cap too
            chunk = os.read(fd, min(1 << 24, MAX_TRACE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    finally:
        os.close(fd)
    if size > MAX_TRACE_BYTES:
        raise InputError(too_big.format(f"over {size - 1}"))
    data = b"".join(chunks)
    del chunks
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start}); expected a file written by "
                         "nanoddp-train --trace") from None


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _time_field(path, i, e, key, name):
    """The event's "ts" or "dur" in ms, checked: a finite number of µs >= 0 (a "dur" of at most
    a day, a "ts" below 2^53)."""
    where = f"{path}: traceEvents[{i}] ('{name}')"
    if key not in e or not _is_number(e[key]):
        raise InputError(f"{where} has no numeric \"{key}\"; not a trace written by "
                         "nanoddp-train --trace")
    try:
        value = float(e[key])
    except OverflowError:
        value = math.inf if e[key] > 0 else -math.inf
    if not math.isfinite(value) or value < 0:
        what = "time" if key == "ts" else "duration"
        raise InputError(f"{where}: \"{key}\" is {value:g}; a {what} is a finite number of µs "
                         ">= 0 (a damaged trace)")
    if key == "dur" and value > MAX_SPAN_US:
        raise InputError(f"{where} lasts {value:g} µs, more than a day; no span of a training "
                         "step does (a damaged trace, or a duration in other units than µs?)")
    if key == "ts" and value >= MAX_TS_US:
        raise InputError(f"{where}: \"ts\" is {value:g} µs, more than 2^53 (285 years); not a "
                         "clock's reading (a damaged trace)")
    return value / 1000.0


class PidEvents:
    """One rank's events sorted by start, with the indexes the chart's questions need (which
    spans start in [a, b), the latest launch before a time...), so that each is answered by a
    binary search instead of a pass over the whole trace (a 50,000-step trace took hours)."""

    def __init__(self, spans, instants):
        self.spans = sorted(spans, key=lambda e: (e["ts"], -e["dur"]))
        self.ts = [e["ts"] for e in self.spans]
        self.max_dur = max((e["dur"] for e in self.spans), default=0.0)
        self.instants = sorted(instants, key=lambda e: e["ts"])
        self.instant_ts = [e["ts"] for e in self.instants]
        self.grads = [e for e in self.instants if e["name"].startswith("grad ")]
        self.grad_ts = [e["ts"] for e in self.grads]
        self.forwards = [e for e in self.spans if e["name"] == "forward"]
        self.optimizer_steps = [e for e in self.spans if e["name"] == "optimizer step"]
        self.backward_ts = [e["ts"] for e in self.spans if e["name"].startswith("backward")]
        self.update_ts = [e["ts"] for e in self.spans if e["name"] == "optimizer update"]
        self.launch_ts = [e["ts"] for e in self.spans if e["name"] == LAUNCH_GATHERS]
        self.bucket_gathers = [e for e in self.spans if e["name"].startswith(GATHER_BUCKET)
                               and e["track"] == "communication"]
        self.bucket_gather_ts = [e["ts"] for e in self.bucket_gathers]

    def spans_starting(self, a, b):
        """The spans that start in [a, b)."""
        return self.spans[bisect.bisect_left(self.ts, a):bisect.bisect_left(self.ts, b)]

    def spans_touching(self, a, b):
        """The spans that start before b and end at or after a."""
        first = bisect.bisect_left(self.ts, a - self.max_dur)
        last = bisect.bisect_left(self.ts, b)
        return [e for e in self.spans[first:last] if e["ts"] + e["dur"] >= a]

    def instants_in(self, a, b):
        return self.instants[bisect.bisect_left(self.instant_ts, a):
                             bisect.bisect_right(self.instant_ts, b)]


class Trace:
    pass


def load(path):
    """The trace at `path`, checked (see the module comment): a Trace with ranks [(pid, name)],
    spans and instants (dicts with ts/dur in ms and a track name), by_pid {pid: PidEvents},
    grad_accum, start and end (ms)."""
    CURRENT_FILE[0] = path
    text = read_text(path)
    if not text.strip():
        raise InputError(f"{path}: the file is empty; was it written by nanoddp-train --trace?")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not a JSON trace ({e.msg} at line {e.lineno}, column "
                         f"{e.colno}); expected a file written by nanoddp-train --trace") from None
    except RecursionError:
        raise InputError(f"{path}: not a trace: its JSON nests deeper than Python's parser goes; "
                         "expected a file written by nanoddp-train --trace") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise InputError(f"{path}: not a JSON trace ({e}); expected a file written by "
                         "nanoddp-train --trace") from None
    del text
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputError(f"{path}: not a Chrome trace (no \"traceEvents\" list)")
    process_name, sort_index, track_name = {}, {}, {}
    grad_accum, recorded = 1, None
    spans, instants = [], []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or not isinstance(e.get("ph"), str) or \
                not isinstance(e.get("pid"), int) or isinstance(e.get("pid"), bool):
            raise InputError(f"{path}: traceEvents[{i}] is not a trace event (needs a string "
                             "\"ph\" and an integer \"pid\")")
        ph, pid = e["ph"], e["pid"]
        if not 0 <= pid < 2**31:
            raise InputError(f"{path}: traceEvents[{i}] has \"pid\" {pid}, which is no rank")
        args = e.get("args", {})
        if not isinstance(args, dict):
            raise InputError(f"{path}: traceEvents[{i}]: \"args\" is not an object")
        tid = e.get("tid")
        if tid is not None and (not isinstance(tid, (int, str)) or isinstance(tid, bool)):
            raise InputError(f"{path}: traceEvents[{i}]: \"tid\" is not an integer")
        if ph == "M":
            kind = e.get("name")
            if kind == "process_name":
                name = str(args.get("name", f"pid {pid}"))
                if process_name.get(pid, name) != name:
                    raise InputError(
                        f"{path}: traceEvents[{i}] names pid {pid} '{name}', an earlier event "
                        f"'{process_name[pid]}': two processes' events under one pid (ranks "
                        "relabelled when traces were merged?); draw the ranks' own trace")
                process_name[pid] = name
            elif kind == "process_sort_index":
                index = args.get("sort_index", pid)
                sort_index[pid] = index if _is_number(index) and math.isfinite(index) else pid
            elif kind == "thread_name":
                name = str(args.get("name", str(tid)))
                if track_name.get((pid, tid), name) != name:
                    raise InputError(
                        f"{path}: traceEvents[{i}] names thread {tid} of pid {pid} '{name}', an "
                        f"earlier event '{track_name[(pid, tid)]}': two processes' events under "
                        "one pid (ranks relabelled when traces were merged?)")
                track_name[(pid, tid)] = name
            elif kind == "run_config":
                # nanoddp-train's: the micro-batches per step, and the run's numbers of the
                # steps traced (a resumed run's first is not 1).
                for key, least in (("grad_accum", 1), ("first_step", 1), ("last_step", 0)):
                    value = args.get(key, least)
                    if not isinstance(value, int) or isinstance(value, bool) or value < least:
                        raise InputError(f"{path}: traceEvents[{i}] ('run_config') has {key} "
                                         f"{value!r}; expected an integer >= {least}")
                grad_accum = args.get("grad_accum", 1)
                if "first_step" in args and "last_step" in args:
                    recorded = (args["first_step"], args["last_step"])
        elif ph in ("X", "i", "I"):
            name = e.get("name")
            if not isinstance(name, str):
                raise InputError(f"{path}: traceEvents[{i}] ({ph}) has no string \"name\"")
            ts = _time_field(path, i, e, "ts", name)
            dur = _time_field(path, i, e, "dur", name) if ph == "X" else 0.0
            event = {"name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args,
                     "i": i}
            (spans if ph == "X" else instants).append(event)
    del doc, events
    if not spans:
        raise InputError(f"{path}: the trace has no spans (\"ph\": \"X\" events)")
    for e in spans + instants:
        e["track"] = track_name.get((e["pid"], e["tid"]), str(e["tid"]))
        # The --prefetch worker's spans lie on the data track beside (and across) the compute
        # thread's "data": a row of their own, so neither hides the other.
        if e["name"] == "prefetch data":
            e["track"] = "prefetch"
    with_events = {e["pid"] for e in spans} | {e["pid"] for e in instants}
    pids = sorted(with_events, key=lambda p: (sort_index.get(p, p), p))
    if len(pids) > MAX_RANKS:
        raise InputError(f"{path}: {len(pids)} ranks; this chart draws at most {MAX_RANKS} "
                         "(one row each per track)")
    trace = Trace()
    trace.path = path
    trace.ranks = [(pid, process_name.get(pid, f"pid {pid}")) for pid in pids]
    trace.name_of = dict(trace.ranks)
    trace.spans, trace.instants = spans, instants
    trace.grad_accum = grad_accum
    trace.recorded = recorded  # (first, last) step of the run, when run_config says
    by = {pid: ([], []) for pid in pids}
    for e in spans:
        by[e["pid"]][0].append(e)
    for e in instants:
        by[e["pid"]][1].append(e)
    trace.by_pid = {pid: PidEvents(*lists) for pid, lists in by.items()}
    trace.start = min(e["ts"] for e in spans)
    trace.end = max(e["ts"] + e["dur"] for e in spans)
    if trace.end <= trace.start:
        raise InputError(f"{path}: all {len(spans)} spans start and end at {trace.start * 1000:g} "
                         "µs: a clock that did not run, not a run's times")
    check_duplicates(trace)
    trace.windows = step_windows(trace)
    return trace


def check_duplicates(trace):
    """The same span twice (a trace concatenated with itself): each step would count double."""
    for pid, events in trace.by_pid.items():
        seen = {}
        for e in events.spans:
            # Only spans of one start can repeat: keep the index to those.
            if seen and next(iter(seen))[0] != e["ts"]:
                seen.clear()
            key = (e["ts"], e["dur"], e["name"], e["tid"])
            if key in seen and seen[key]["args"] == e["args"]:
                raise InputError(
                    f"{trace.path}: traceEvents[{e['i']}] ('{e['name']}') repeats "
                    f"traceEvents[{seen[key]['i']}] (same pid, thread, time, duration and args): "
                    "the trace holds some events twice (two files joined?)")
            seen[key] = e


class Window:
    """One rank's step: start (its data), end (its optimizer step's end), data_ms (its "data"
    spans, which nanoddp-train's step_ms leaves out)."""

    def __init__(self, start, end, data_ms):
        self.start, self.end, self.data_ms = start, end, data_ms

    @property
    def step_ms(self):
        return self.end - self.start - self.data_ms


def _event(e):
    return f"traceEvents[{e['i']}] ('{e['name']}', {e['ts']:.3f} ms)"


def _check_one_at_a_time(path, rank, spans):
    """A rank runs one forward, and one optimizer step, at a time: two that overlap are two
    ranks' (or a damaged trace's)."""
    for a, b in zip(spans, spans[1:]):
        if b["ts"] < a["ts"] + a["dur"]:
            raise InputError(
                f"{path}: {_event(a)} and {_event(b)} of {rank} overlap in time, yet a rank runs "
                "one at a time: two ranks' events under one pid (relabelled when traces were "
                "merged?) or a damaged trace")


def _step_start(events, after, before):
    """Where a step starts: its first data or compute span at or after `after` (the previous
    step's end), not later than `before` (its first forward). Communication spans are left out: a
    ZeRO gather launched by the previous step may still start after that step ended."""
    for e in events.spans_starting(after, before + 1e-9):
        if e["track"] in ("compute", "data") and e["name"] != "prefetch data":
            return e["ts"]
    return before


def _data_ms(events, start, end):
    return sum(e["dur"] for e in events.spans_starting(start, end) if e["name"] == "data"
               and e["track"] == "data")


def rank_steps(trace, pid):
    """The steps of one rank, as Windows (see the module comment), checked."""
    path, rank, events = trace.path, trace.name_of[pid], trace.by_pid[pid]
    forwards = events.forwards
    _check_one_at_a_time(path, rank, forwards)
    _check_one_at_a_time(path, rank, events.optimizer_steps)
    # Every forward is followed by its backward before the next forward starts.
    for a, b in zip(forwards, forwards[1:]):
        k = bisect.bisect_left(events.backward_ts, a["ts"])
        if k == len(events.backward_ts) or events.backward_ts[k] >= b["ts"]:
            raise InputError(
                f"{path}: {_event(a)} and {_event(b)} of {rank} follow each other with no "
                "backward between: two ranks' events under one pid (relabelled when traces "
                "were merged?) or a damaged trace")
    forward_ts = [e["ts"] for e in forwards]
    windows = []
    if events.optimizer_steps:
        previous_end = -math.inf
        for k, opt in enumerate(events.optimizer_steps):
            where = f"{path}: step {k + 1} of {rank}, ending with {_event(opt)},"
            passes = bisect.bisect_right(forward_ts, opt["ts"]) - \
                bisect.bisect_left(forward_ts, previous_end)
            if passes == 0:
                raise InputError(f"{where} has no forward span since the previous optimizer step: "
                                 "its times cannot be a training step's (a damaged trace?)")
            if passes > trace.grad_accum:
                raise InputError(
                    f"{where} has {passes} forward passes, more than --grad-accum "
                    f"{trace.grad_accum} (the trace's run_config): two ranks' events under one "
                    "pid (relabelled when traces were merged?), or a step without an optimizer "
                    "step (skipped by --skip-nonfinite); pass --from-ms and --to-ms")
            first_forward = forwards[bisect.bisect_left(forward_ts, previous_end)]
            start = _step_start(events, previous_end, first_forward["ts"])
            end = opt["ts"] + opt["dur"]
            windows.append(Window(start, end, _data_ms(events, start, end)))
            previous_end = end
    elif forwards:
        # --optimizer-in-backward: no "optimizer step". A micro-batch is the last of its step
        # when its backward holds updates ("optimizer update"), or when steps have one each.
        last_of_step = []
        for f, forward in enumerate(forwards):
            until = forwards[f + 1]["ts"] if f + 1 < len(forwards) else math.inf
            k = bisect.bisect_left(events.update_ts, forward["ts"])
            updates = k < len(events.update_ts) and events.update_ts[k] < until
            if trace.grad_accum == 1 or updates:
                last_of_step.append(f)
        if not last_of_step:
            return []  # neither optimizer steps nor updates: the steps cannot be told apart
        firsts = [0] + [f + 1 for f in last_of_step[:-1]]
        # Each step from its first micro-batch's data (the last "data" span since the previous
        # forward ended: the previous micro-batch's backward comes between), else its forward.
        starts = []
        for f in firsts:
            after = forwards[f - 1]["ts"] + forwards[f - 1]["dur"] if f > 0 else -math.inf
            data = [e["ts"] for e in events.spans_starting(after, forwards[f]["ts"] + 1e-9)
                    if e["name"] == "data" and e["track"] == "data"]
            starts.append(data[-1] if data else forwards[f]["ts"])
        # A step ends with the last compute or communication span before the next step (or the
        # micro-batches after the last complete step) begins.
        after_last = last_of_step[-1] + 1
        ends_at = starts[1:] + [forwards[after_last]["ts"] if after_last < len(forwards)
                                else math.inf]
        for start, f, until in zip(starts, firsts, ends_at):
            end = max((e["ts"] + e["dur"] for e in events.spans_starting(forwards[f]["ts"], until)
                       if e["track"] in ("compute", "communication")),
                      default=forwards[f]["ts"] + forwards[f]["dur"])
            windows.append(Window(start, end, _data_ms(events, start, end)))
    for k, w in enumerate(windows):
        where = f"{path}: step {k + 1} of {rank}"
        if not w.step_ms > 0:
            raise InputError(
                f"{where} lasts {w.step_ms:g} ms from its data to its end, data excluded: a step "
                "takes time; the trace's times are not a run's (all its events at one time?)")
        if (w.end - w.start) * 1000.0 > MAX_SPAN_US:
            raise InputError(f"{where} lasts {w.end - w.start:g} ms, more than a day: the trace's "
                             "times are not a run's (a damaged trace)")
    return windows


def step_windows(trace):
    """Per recorded step, {pid: Window} on each rank with steps; checks that the ranks' steps
    overlap in time: a step's collectives join every rank, so a rank cannot end step K before
    another starts it, unless their clocks differ (a trace merged from several hosts)."""
    per_rank = {}
    for pid, name in trace.ranks:
        windows = rank_steps(trace, pid)
        if trace.recorded is not None:
            first, last = trace.recorded
            if len(windows) > last - first + 1:
                raise InputError(
                    f"{trace.path}: {name} has {len(windows)} steps, but the trace's run_config "
                    f"says it holds steps {first} to {last}: two ranks' events under one pid "
                    "(relabelled when traces were merged?) or traces joined")
        if windows:
            per_rank[pid] = windows
    if not per_rank:
        return []
    count = min(len(w) for w in per_rank.values())

    def ms(t):
        return f"{t - trace.start:.2f}"

    steps = [{pid: w[k] for pid, w in per_rank.items()} for k in range(count)]
    for k, own in enumerate(steps):
        latest = max(own, key=lambda p: own[p].start)
        earliest = min(own, key=lambda p: own[p].end)
        if own[latest].start >= own[earliest].end:
            a, b = own[earliest], own[latest]
            raise InputError(
                f"{trace.path}: step {k + 1} of {trace.name_of[earliest]} ({ms(a.start)}–"
                f"{ms(a.end)} ms into the trace) ends before {trace.name_of[latest]}'s starts "
                f"({ms(b.start)} ms), yet its collectives join all ranks: the ranks' times are on "
                "different clocks (a trace merged from several hosts?). This chart needs one "
                "clock: draw a trace of one host's ranks")
    return steps


def reference_pid(own):
    """The rank whose step_ms the header states: the first drawn (rank 0, whose step_ms
    nanoddp-train prints)."""
    return next(iter(own))


def typical_step(windows):
    """The step of median length, leaving out the first (warm-up: first touches, connections)
    unless it is the only one: on a shared machine a chosen number may land on an outlier."""
    lengths = [(w[reference_pid(w)].step_ms, k + 1) for k, w in enumerate(windows)]
    candidates = sorted(lengths[1:] or lengths)
    return candidates[(len(candidates) - 1) // 2][1]


# ---------------------------------------------------------------------------------------------
# What the spans are


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
WAITS = ("wait for all-reduce", "wait for reduce-scatter", "wait for all-gather")
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
    return [k for k in BUCKET_KINDS if k in present]


def kinds_text(comm):
    """'3 all-reduce(s)', '3 reduce-scatter(s)', or both kinds in the order they ran."""
    kinds = []
    for e in sorted(comm, key=lambda e: e["ts"]):
        kind = bucket_collective(e["name"])[0]
        if kind not in kinds:
            kinds.append(kind)
    counts = [sum(1 for e in comm if bucket_collective(e["name"])[0] == k) for k in kinds]
    return " and ".join(f"{n} {k}(s)" for n, k in zip(counts, kinds))


def overlap_summary(trace, lo, hi, own):
    """Per rank, over the bucket collectives that start in the rank's own step (own[pid]; without
    one, in [lo, hi]): (rank name, their total ms, the spans, how many started before the step's
    last backward node ended, ms of them during which a backward node was running, ms of ZeRO's
    parameter all-gather, ms of it after backward ended: measured, not assumed, so that a trace
    in which it did overlap backward would say so; with --zero-overlap-gather instead the ms the
    forward waited for it, and True; and how many gathers those ms are)."""
    out = []
    for pid, name in trace.ranks:
        events = trace.by_pid[pid]
        start, end = window_of(own, pid, lo, hi)
        inside = events.spans_starting(start, end)
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
        overlapped = bool(events.bucket_gathers)
        if overlapped:
            gathers = gathers_beside_forward(events, inside)
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


def window_of(own, pid, lo, hi):
    w = own.get(pid)
    return (w.start, w.end) if w is not None else (lo, hi)


def gathers_beside_forward(events, inside):
    """With --zero-overlap-gather: the gathers this step's forward used, that is those the latest
    "launch all-gathers" before the forward started (in the previous step) launched, not the ones
    this step launches at its end for the next forward (an outside reader found the header
    counting those instead)."""
    forwards = [e for e in inside if e["name"] == "forward"]
    if not forwards:
        return []
    forward = min(forwards, key=lambda e: e["ts"])
    k = bisect.bisect_right(events.launch_ts, forward["ts"])
    since = events.launch_ts[k - 1] if k > 0 else float("-inf")
    forward_end = forward["ts"] + forward["dur"]
    ts = events.bucket_gather_ts
    return events.bucket_gathers[bisect.bisect_left(ts, since):bisect.bisect_left(ts, forward_end)]


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


def visible(trace, lo, hi):
    """The spans that touch [lo, hi] and the instants in it: all the chart draws."""
    spans, instants = [], []
    for pid, _ in trace.ranks:
        events = trace.by_pid[pid]
        spans += events.spans_touching(lo, hi)
        instants += events.instants_in(lo, hi)
    return spans, instants


# ---------------------------------------------------------------------------------------------
# Drawing

ROW_HEIGHT = {"compute": 1.0, "communication": 1.0, "markers": 0.7, "data": 0.5, "prefetch": 0.5}
# Points per character of the chart's fonts (DejaVu Sans averages ~0.6 em) and the figure's width
# in points: enough to tell whether a label fits its bar, and how long a header line or a legend
# row may be before it runs past the figure's right edge (a --compare header did).
CHAR_EM = 0.57
FIGURE_PT = 12 * 72


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    # A "$" in a title, a file or a module name is text, not the start of a formula.
    plt.rcParams["text.parse_math"] = False
    # For papers, the SVG keeps its text as text.
    plt.rcParams["svg.fonttype"] = "none"
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
    fig, ax = plt.subplots(figsize=(12, 1.9 + 0.42 * y))
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
        ax.broken_barh([(start - t0, end - start)], (centre - height / 2, height),
                       facecolors=color, edgecolor="white", linewidth=0.4, alpha=alpha,
                       zorder=3 if nested else 2)
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
                        va="top", fontsize=5.5, color="dimgrey")
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
        fig.text(0.01, 0.005, args.footnote, fontsize=7, color="#666666", ha="left",
                 va="bottom")
        fig.tight_layout(rect=(0, 0.05, 1, 1))
    else:
        fig.tight_layout()
    # "tight": should an estimate above fall short, the figure grows rather than cut the text.
    fig.savefig(args.out, dpi=100, format="png", bbox_inches="tight", pad_inches=0.1)
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
# The header and the printed summary


def pick_step(args, trace, prefer=None):
    """(own, lo, hi, what, step) of the chosen step of one trace; raises InputError. Without
    --step, `prefer` (the first trace's step number, with --compare) wins when this trace has it,
    so that the two runs show the same step of their runs."""
    windows = trace.windows
    if not windows:
        raise InputError(f"{trace.path}: no \"optimizer step\" spans nor forward passes to tell "
                         "its steps apart; pass --from-ms and --to-ms")
    if args.step is not None:
        step = args.step
    elif prefer is not None and prefer <= len(windows):
        step = prefer
    else:
        step = typical_step(windows)
    if step > len(windows):
        raise InputError(f"--step {step}: {trace.path} records {len(windows)} step(s); pass "
                         f"1..{len(windows)} (nanoddp-train --trace-steps sets how many)")
    own = windows[step - 1]
    lo = min(w.start for w in own.values())
    hi = max(w.end for w in own.values())
    ref = reference_pid(own)
    w = own[ref]
    # The step as nanoddp-train's step_ms counts it (data excluded), on the rank whose step_ms it
    # prints; not the drawn window, which adds room on both sides and holds the other ranks.
    whose = f"{trace.name_of[ref]}'s, " if len(own) > 1 else ""
    # A resumed run's trace starts after its checkpoint: its steps are named by the run's numbers
    # too (steps 4501-4503 read as steps 1-3).
    run_step = ""
    if trace.recorded is not None and trace.recorded[0] != 1:
        run_step = f" (the run's step {trace.recorded[0] + step - 1})"
    what = (f"step {step} of {len(windows)} recorded{run_step}, {w.step_ms:.2f} ms ({whose}data "
            f"excluded as in nanoddp-train's step_ms; data {w.data_ms:.2f} ms)")
    return own, lo, hi, what, step


def summary_lines(trace, lo, hi, own):
    lines = []
    for name, total, comm, early, hidden, gather, gather_after, overlapped, gathers in \
            overlap_summary(trace, lo, hi, own):
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


def derived_label(trace, lo, hi, own):
    """What a trace's step shows it ran, for --compare without --labels (a trace holds no command
    line): "ZeRO-2" (reduce-scatters), "ZeRO-1" (all-reduces, then the parameter all-gather) or
    "DDP"; then "overlapped" when a bucket collective started before backward ended, "not
    overlapped" when each rank had several and none did (with one bucket, neither can be told).
    What the drawn step shows, not the flags: under load an overlap-on step may show none."""
    summary = overlap_summary(trace, lo, hi, own)
    kinds = {bucket_collective(e["name"])[0] for row in summary for e in row[2]}
    gathers = any(row[5] > 0 for row in summary)
    label = "ZeRO-2" if "reduce-scatter" in kinds else "ZeRO-1" if gathers else "DDP"
    if any(row[3] > 0 for row in summary):
        label += ", overlapped"
    elif summary and all(len(row[2]) > 1 for row in summary):
        label += ", not overlapped"
    return label


def threads_text(trace):
    """Per rank, the threads its spans show: compute, the communication worker (with several
    ranks), the --prefetch worker."""
    kinds_of = {}
    for pid, _ in trace.ranks:
        tracks = {e["track"] for e in trace.by_pid[pid].spans}
        kinds_of[pid] = tuple(kind for track, kind in (("compute", "compute"),
                                                       ("communication", "communication"),
                                                       ("prefetch", "data prefetch"))
                              if track in tracks)
    count = sum(len(k) for k in kinds_of.values())
    threads = f"{count} thread{'' if count == 1 else 's'}"
    kinds = set(kinds_of.values())
    if len(trace.ranks) == 1:
        return f"{threads} ({' + '.join(next(iter(kinds)))})"
    if len(kinds) == 1:
        return f"{threads} ({len(trace.ranks)} rank(s) x {' + '.join(next(iter(kinds)))})"
    return f"{threads} ({len(trace.ranks)} rank(s))"


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
        trace = load(args.trace)
        args.trace_start = trace.start
        marks, origin = [], None
        if args.from_ms is not None:
            length = trace.end - trace.start
            if args.from_ms >= length:
                raise InputError(f"--from-ms {args.from_ms:g}: {args.trace} lasts {length:.2f} ms "
                                 "from its first event; start the window before that")
            lo = trace.start + args.from_ms
            hi = trace.start + min(args.to_ms, length)
            own = {}
            what = f"{args.from_ms:g}–{args.to_ms:g} ms"
        else:
            own, lo, hi, what, step = pick_step(args, trace)
        comm_ranks = {pid for pid, _ in trace.ranks
                      if any(e["track"] == "communication" for e in trace.by_pid[pid].spans)}
        threads = threads_text(trace)
        spans, instants = visible(trace, lo, hi)
        label_backward_spans(trace, spans)
        lines = summary_lines(trace, lo, hi, own)
        ranks = trace.ranks
        if args.compare is not None:
            trace2 = load(args.compare)
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
            lines = [f"{names[0]}: {line}" for line in lines] + \
                [f"{names[1]}: {line}" for line in summary_lines(trace2, lo2, hi2, own2)]
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
    machine = (f"{threads} on {cores} core(s)"
               f"{'' if args.cores else ' (this machine count)'}")
    title = (f"{args.title}\n" if args.title else f"{os.path.basename(args.trace)}: ") + \
        f"{what}\n{machine}"
    if lines:
        title += "\n" + "\n".join(lines)
    if marks:
        title += "\nstep (dashed lines): " + ", ".join(text.strip() for _, text in marks)
    try:
        draw(args, ranks, spans, instants, lo, hi, own, title, marks, origin, comm_ranks)
    except ImportError as e:
        print(f"{PROG}: error: {e}. Install Debian's python3-matplotlib "
              "(scripts/install-deps.sh) and run this with /usr/bin/python3.", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: error: --out {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: timeline of {what} ({len(ranks)} rank(s))")
    print(f"  {machine}")
    print(f"wrote {args.svg}: the same chart as SVG")
    for line in lines:
        print("  " + line)
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
