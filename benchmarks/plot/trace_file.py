"""Reading a nanoddp-train --trace file: checked, indexed by rank, and cut into steps.

plot_trace.py draws what this returns; its module comment says what a trace holds, how a step is
found, and which traces are refused and why. Here each refusal is an InputError naming the file
(and the event, as traceEvents[i]) that plot_trace.py turns into exit 2: a trace this cannot read
truthfully is refused, never drawn as if fine.
"""

import bisect
import json
import math
import os
import stat

from records import InputError, read_regular_file

# The file read so far, named by plot_trace.py's last-resort error handler.
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


# ---------------------------------------------------------------------------------------------
# The spans' names: one place for the reader's indexes, the header's figures and the chart

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


# ---------------------------------------------------------------------------------------------
# Reading and checking a trace


def read_text(path):
    """The file's text; refuses anything but a regular file of at most MAX_TRACE_BYTES before
    reading it (records.read_regular_file)."""
    return read_regular_file(path, MAX_TRACE_BYTES, "the file written by nanoddp-train --trace",
                             "it holds the whole trace in memory); record fewer steps "
                             "(nanoddp-train --trace-steps)")


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


def load(path, windowed=False):
    """The trace at `path`, checked (see plot_trace.py's module comment): a Trace with path,
    ranks [(pid, name)] and name_of, spans and instants (dicts with ts/dur in ms and a track
    name), by_pid {pid: PidEvents}, grad_accum, recorded, start and end (ms), and windows (its
    steps: step_windows). `windowed` (a window given by time): steps that cannot be told apart
    leave windows None and the reason in steps_note, instead of refusing the trace."""
    CURRENT_FILE[0] = path
    text = read_text(path)
    # A leading byte order mark (an editor's): RFC 8259 lets a parser ignore it, and nanoddp-sim
    # does; json.loads refused it, so the two readers of one file disagreed.
    if text.startswith("\ufeff"):
        text = text[1:]
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
    grad_accum, recorded, partial = 1, None, None
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
                if "partial" in args:
                    partial = _partial_config(path, i, args)
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
    trace.partial = partial  # a rank's own trace of a run that stopped: _partial_config's
    trace.stopped = None  # then {pid: Window} of the step it stopped in (stopped_step)
    if partial is not None:
        _check_partial(trace, pids, spans + instants)
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
    try:
        trace.windows = step_windows(trace)
    except InputError as e:
        if not windowed:
            raise
        # A window given by time (--from-ms/--to-ms) draws the spans as they are: a step
        # skipped by --skip-nonfinite (no optimizer step) made every step unfindable, and the
        # advice to pass a window was refused the same way (an outside tester's).
        trace.windows = None
        trace.steps_note = f"its steps cannot be told apart, drawn by time only: {e}"
    if partial is not None and trace.windows is not None:
        trace.stopped = stopped_step(trace)
    return trace


def _partial_config(path, i, args):
    """A partial trace's run_config (nanoddp-train writes T.rankR.partial.json when a run stops
    inside its traced steps: that rank's events alone, up to where it stopped): {rank,
    world_size, stopped_in_step, restart, first_step}, checked."""
    where = f"{path}: traceEvents[{i}] ('run_config')"
    if args["partial"] is not True:
        raise InputError(f"{where} has partial {args['partial']!r}; expected true (a rank's own "
                         "trace of a run that stopped) or no partial at all")
    config = {}
    for key, least in (("rank", 0), ("world_size", 1), ("stopped_in_step", 1), ("restart", 0),
                       ("first_step", 1)):
        value = args.get(key, 1 if key == "first_step" else None)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise InputError(f"{where} of a partial trace has {key} {value!r}; expected an "
                             f"integer >= {least}")
        config[key] = value
    if config["rank"] >= config["world_size"]:
        raise InputError(f"{where}: rank {config['rank']} of world_size "
                         f"{config['world_size']}; a rank is below the world size")
    last = args.get("last_step", config["stopped_in_step"])
    if not config["first_step"] <= config["stopped_in_step"] <= last:
        raise InputError(f"{where}: stopped_in_step {config['stopped_in_step']} is not among "
                         f"the steps it holds ({config['first_step']} to {last})")
    # The step it stopped in, counted among the recorded steps (from 1).
    config["index"] = config["stopped_in_step"] - config["first_step"] + 1
    return config


def _check_partial(trace, pids, events):
    """A partial trace holds its own rank's events, under its pid: another pid's are another
    rank's (files joined?)."""
    rank = trace.partial["rank"]
    for e in sorted(events, key=lambda e: e["i"]):
        if e["pid"] != rank:
            raise InputError(
                f"{trace.path}: traceEvents[{e['i']}] ('{e['name']}') is pid {e['pid']}'s, but "
                f"the trace is partial, rank {rank}'s events alone (its run_config): two ranks' "
                "files joined? Draw two ranks' partial traces with --compare")


def last_event(events):
    """(ms, event) of the rank's last event: the latest span end or instant."""
    candidates = [(e["ts"] + e["dur"], e) for e in events.spans] + \
        [(e["ts"], e) for e in events.instants]
    return max(candidates, key=lambda c: c[0])


def stopped_step(trace):
    """{pid: Window} of the step a partial trace's rank stopped in: from that step's start (its
    first data or compute span after the previous step's end) to the rank's last event. The
    usual step finding ends a step with its optimizer step, which the step a run stopped in has
    not (unless it stopped after it, before the next step: then that step is whole). A rank
    that stopped before anything of the step was recorded gets its previous step's start, with
    trace.partial["empty"] set."""
    pid = trace.partial["rank"]
    events, k = trace.by_pid[pid], trace.partial["index"]
    whole = [own[pid] for own in trace.windows if pid in own]
    if not k - 1 <= len(whole) <= k:
        raise InputError(
            f"{trace.path}: its run_config says the run stopped in step "
            f"{trace.partial['stopped_in_step']} (recorded step {k}), but rank {pid} has "
            f"{len(whole)} whole step(s) before it; expected {k - 1} (a damaged trace, or a "
            "step skipped by --skip-nonfinite: pass --from-ms and --to-ms)")
    end = last_event(events)[0]
    trace.partial["empty"] = False
    if len(whole) == k:
        start = whole[k - 1].start
    else:
        previous_end = whole[-1].end if whole else -math.inf
        after = [e["ts"] for e in events.spans if e["ts"] >= previous_end and
                 e["track"] in ("compute", "data") and
                 e["name"] != "prefetch data"]
        if after and min(after) < end:
            start = min(after)
        else:
            trace.partial["empty"] = True
            start = whole[-1].start if whole else trace.start
    return {pid: Window(start, end, _data_ms(events, start, end))}


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


# ---------------------------------------------------------------------------------------------
# Its steps


class Window:
    """One rank's step: start (its data), end (its optimizer step's end), data_ms (its "data"
    spans, which nanoddp-train's step_ms leaves out)."""

    def __init__(self, start, end, data_ms):
        self.start, self.end, self.data_ms = start, end, data_ms

    @property
    def step_ms(self):
        return self.end - self.start - self.data_ms


def window_of(own, pid, lo, hi):
    w = own.get(pid)
    return (w.start, w.end) if w is not None else (lo, hi)


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


def visible(trace, lo, hi):
    """The spans that touch [lo, hi] and the instants in it: all the chart draws."""
    spans, instants = [], []
    for pid, _ in trace.ranks:
        events = trace.by_pid[pid]
        spans += events.spans_touching(lo, hi)
        instants += events.instants_in(lo, hi)
    return spans, instants
