"""What one drawn step shows, in words: which step it is and how long it took (pick_step), how
much of each rank's communication ran beside backward (the header's lines, printed too), what a
--compare trace ran (derived_label) and the threads that shared the cores. Measured from the
spans of a trace_file.Trace, never assumed from flags the trace does not hold.
"""

import bisect

from records import InputError
from trace_file import (GATHER, bucket_collective, is_bucket_collective, is_parameter_gather,
                        last_event, reference_pid, typical_step, window_of)


def pick_step(args, trace, prefer=None):
    """(own, lo, hi, what, step) of the chosen step of one trace; raises InputError. Without
    --step, `prefer` (the first trace's step number, with --compare) wins when this trace has it,
    so that the two runs show the same step of their runs. A partial trace's default is the step
    its run stopped in (stopped_step)."""
    if trace.stopped is not None:
        return _pick_partial_step(args, trace)
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
    run_step = _run_step(trace, step)
    what = (f"step {step} of {len(windows)} recorded{run_step}, {w.step_ms:.2f} ms ({whose}data "
            f"excluded as in nanoddp-train's step_ms; data {w.data_ms:.2f} ms)")
    return own, lo, hi, what, step


def _run_step(trace, step):
    """' (the run's step N)' for a resumed run's recorded step `step`, else ''."""
    if trace.recorded is not None and trace.recorded[0] != 1:
        return f" (the run's step {trace.recorded[0] + step - 1})"
    return ""


def _pick_partial_step(args, trace):
    """pick_step for a partial trace: by default the step its run stopped in, from its start to
    the rank's last event (where it waited); --step K a whole step before it."""
    k = trace.partial["index"]
    whole = len(trace.windows)
    step = args.step if args.step is not None else k
    if step > k:
        raise InputError(f"--step {step}: {trace.path} is a partial trace of {k} step(s): "
                         f"1..{k - 1} whole and {k}, where the run stopped; pass 1..{k}")
    if step <= whole and step != k:
        own = trace.windows[step - 1]
        w = own[reference_pid(own)]
        what = (f"step {step} of {k} recorded{_run_step(trace, step)}, {w.step_ms:.2f} ms (data "
                f"excluded as in nanoddp-train's step_ms; data {w.data_ms:.2f} ms)")
        return own, w.start, w.end, what, step
    own = trace.stopped
    w = own[reference_pid(own)]
    if trace.partial["empty"]:
        what = (f"step {k} of {k} recorded{_run_step(trace, k)}, where the run stopped: nothing "
                f"of it traced, drawn from step {k - 1}'s start to the rank's last event, "
                f"{w.end - w.start:.2f} ms" if k > 1 else
                f"step {k}, where the run stopped: nothing of it traced")
    else:
        cut = "whole: it stopped after its optimizer step" if whole >= k else \
            "cut short: no optimizer step"
        what = (f"step {k} of {k} recorded{_run_step(trace, k)}, where the run stopped: "
                f"{w.end - w.start:.2f} ms from its start to the rank's last event (data "
                f"{w.data_ms:.2f} ms; {cut})")
    return own, w.start, w.end, what, k


def partial_text(trace):
    """What a partial trace is, for the header and the summary."""
    p = trace.partial
    recorded = f" (recorded step {p['index']})" if p["index"] != p["stopped_in_step"] else ""
    return (f"partial trace: rank {p['rank']} of {p['world_size']} alone, written when the run "
            f"stopped in step {p['stopped_in_step']}{recorded}")


def _stop_state(trace):
    """(last event's end, the event, the waiting buckets' names, the collective's kind) of a
    partial trace's rank in the step it stopped in."""
    pid = trace.partial["rank"]
    w = trace.stopped[pid]
    events = trace.by_pid[pid]
    end, last = last_event(events)
    if trace.partial["empty"] or len(trace.windows) >= trace.partial["index"]:
        return end, last, [], None
    ready = {}
    for e in events.instants_in(w.start, w.end):
        if e["name"].startswith("bucket ") and e["name"].endswith(" ready"):
            ready.setdefault(e["name"][len("bucket "):-len(" ready")], e["ts"])
    ran = {bucket_collective(e["name"])[1] for e in events.spans_starting(w.start, w.end + 1e-6)
           if is_bucket_collective(e)}
    # The collective's name from the rank's earlier steps (DDP all-reduces, ZeRO-2
    # reduce-scatters); none ended in a trace that stopped in its first step.
    kinds = {bucket_collective(e["name"])[0] for e in events.spans if is_bucket_collective(e)}
    kind = next(iter(kinds)) if len(kinds) == 1 else "collective"
    return end, last, [b for b in ready if b not in ran], kind


def stop_label(trace):
    """A partial trace's rank and how it stopped, short (a row's label): "rank 1, stopped in
    b0's all-reduce"."""
    end, last, waiting, kind = _stop_state(trace)
    rank = trace.name_of[trace.partial["rank"]]
    if trace.partial["empty"]:
        return f"{rank}, stopped before its step"
    if len(trace.windows) >= trace.partial["index"]:
        return f"{rank}, stopped after its step"
    if waiting:
        return f"{rank}, stopped in {', '.join('b' + b for b in waiting)}'s {kind}"
    name = last["name"] if len(last["name"]) <= 24 else last["name"][:23] + "…"
    return f"{rank}, stopped after {name}"


def stop_text(trace):
    """How a partial trace's rank stopped, from what it recorded in the step it stopped in (its
    run_config does not say why: a signal, a timeout or a NaN): its last event, and the buckets
    ready there whose collective never ended (a span is recorded when it ends: the rank was
    still in it, waiting for its peers, or was stopped before it ran)."""
    p = trace.partial
    w = trace.stopped[p["rank"]]
    end, last, waiting, kind = _stop_state(trace)
    text = (f"{trace.name_of[p['rank']]} stopped in step {p['stopped_in_step']}: its last event "
            f"'{last['name']}' at {end - w.start:.2f} ms into the step")
    if p["empty"]:
        return text + " (before it: nothing of the step was traced)"
    if len(trace.windows) >= p["index"]:
        return text + " (after its optimizer step: the step is whole)"
    if waiting:
        buckets = ", ".join(f"b{b}" for b in waiting)
        text += f"; bucket(s) {buckets} ready, their {kind} not ended when it stopped"
    return text


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


def kinds_text(comm):
    """'3 all-reduce(s)', '3 reduce-scatter(s)', or both kinds in the order they ran."""
    kinds = []
    for e in sorted(comm, key=lambda e: e["ts"]):
        kind = bucket_collective(e["name"])[0]
        if kind not in kinds:
            kinds.append(kind)
    counts = [sum(1 for e in comm if bucket_collective(e["name"])[0] == k) for k in kinds]
    return " and ".join(f"{n} {k}(s)" for n, k in zip(counts, kinds))


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
