"""nanoddp-bench-allreduce lines -> bus bandwidth (and time per op) against message size.

One line per collective (all-reduce, and --collective reduce_scatter / allgather, labelled when
the chart holds more than all-reduce) / backend / mode (nanoddp ProcessGroup or raw
gloo::allreduce) / transport (shared memory or TCP ring, read from the line's "algorithm" text),
so runs with --raw and with NANODDP_SHM=0 land on one chart and the engine's overhead and the
transports can be compared. Records of different commands (--json aside: other -n, -w, -r,
--repeats, --vs-raw...) are separate series ("run 1", "run 2", each run's command on stderr),
as nanoddp-bench-ddp's are: a time per op amortised over other op counts or warm-ups is another
measurement, not a rerun to merge into one error bar.
"""

import re

import figure


def transport_of(record):
    """'shared memory', 'TCP ring', or for NCCL the NCCL_ALGO setting; '' if unknown."""
    algorithm = record.get("algorithm", "")
    match = re.search(r"transport: ([^(;]+)", algorithm)
    if match:
        return match.group(1).strip()
    match = re.search(r"NCCL_ALGO=(\S+)", algorithm)
    if match:
        return f"NCCL_ALGO={match.group(1)}"
    return ""


MODE_NAMES = {"nanoddp": "nanoddp ProcessGroup", "raw": "raw gloo::allreduce"}
COLLECTIVE_NAMES = {"allreduce": "all-reduce", "reduce_scatter": "reduce-scatter",
                    "allgather": "all-gather"}

# Runs: the commands that wrote the records (output path aside), numbered in reading order.
_RUNS = []
_OUTPUT_FLAGS = re.compile(r"\s--json(=|\s+)\S+")


def _command_of(record):
    p = record.get("provenance") if isinstance(record.get("provenance"), dict) else {}
    command = p.get("command")
    return _OUTPUT_FLAGS.sub("", command) if isinstance(command, str) else None


def _run_of(record):
    run = (_command_of(record), record.get("iters"), record.get("warmup"), record.get("rounds"))
    if run not in _RUNS:
        _RUNS.append(run)
    return _RUNS.index(run) + 1


def series_key(record):
    # Lines from before the column sets were in place.
    return (record.get("benchmark", "allreduce"), record["backend"], record["mode"],
            transport_of(record), record["ranks"], record.get("dtype", "float"),
            record.get("op", "sum"), record.get("placement", "in-place"),
            # --allow-mixed-builds: each build (commit, host) a series of its own.
            record.get("_build"), _run_of(record))


def label_of(key, varying):
    collective, backend, mode, transport, ranks, dtype, op, placement, build, run = key
    parts = [f"{backend}: {MODE_NAMES.get(mode, mode)}"]
    if varying["collective"] or collective != "allreduce":
        parts[0] = f"{COLLECTIVE_NAMES.get(collective, collective)}, {parts[0]}"
    if varying["placement"]:
        parts.append(placement)
    if transport:
        parts.append(transport)
    if varying["ranks"]:
        parts.append(f"{ranks} ranks")
    if varying["dtype"]:
        parts.append(dtype)
    if varying["op"]:
        parts.append(op)
    if build:
        parts.append(build)
    if varying["run"]:
        parts.append(f"run {run}")
    return ", ".join(parts)


def plot(records, out_dir, written):
    _RUNS.clear()
    runs = {_run_of(r): _command_of(r) for r, _ in records}
    if len(runs) > 1:
        for run, command in sorted(runs.items()):
            figure.note(f"nanoddp-bench-allreduce run {run}: {command or 'no command recorded'}")
    series = {}
    for record, where in records:
        # The same series and size more than once (reruns: separate launches) are kept, drawn
        # as their median with min-max error bars.
        series.setdefault(series_key(record), {}).setdefault(record["bytes"], []).append(
            (record, where))
    merged = [(k, b, e) for k, s in series.items() for b, e in s.items() if len(e) > 1]
    if merged:
        figure.note(f"{len(merged)} size(s) measured more than once in one series (e.g. "
                    f"{merged[0][1]} bytes: {', '.join(w for _, w in merged[0][2])}): drawn as "
                    "their median with min-max error bars")
    # nanoddp before raw Gloo, shared memory before TCP: the same order (and colours) every time.
    keys = sorted(series, key=lambda k: (
        list(COLLECTIVE_NAMES).index(k[0]) if k[0] in COLLECTIVE_NAMES else 3, k[0], k[1],
        k[2] != "nanoddp", k[2], k[3] != "shared memory", k[3], k[4], k[5], k[6],
        k[7] != "in-place", k[9]))
    varying = {
        name: len({key[i] for key in keys}) > 1
        for i, name in ((0, "collective"), (4, "ranks"), (5, "dtype"), (6, "op"),
                        (7, "placement"))
    }
    # "run N" only where it tells series apart (runs also differ in what the labels show).
    varying["run"] = len({key[:9] for key in keys}) < len(keys)
    fig, axes = figure.new_figure(ncols=2, width=10.5, height=4.4)
    bw_ax, time_ax = axes[0]
    for i, key in enumerate(keys):
        points = sorted(series[key].items())
        sizes = [size for size, _ in points]
        color = figure.COLORS[i % len(figure.COLORS)]
        label = label_of(key, varying)
        for field, ax in (("busbw_gbps", bw_ax), ("time_us", time_ax)):
            mids, lo, hi = [], [], []
            for size, entries in points:
                values = sorted(r[field] for r, _ in entries)
                mid = values[(len(values) - 1) // 2] if len(values) % 2 else \
                    (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
                spread = list(values)
                if field == "time_us":  # a run's own fastest and slowest round
                    spread += [r[f] for r, _ in entries for f in ("time_us_min", "time_us_max")
                               if isinstance(r.get(f), (int, float))]
                mids.append(mid)
                lo.append(mid - min(spread))
                hi.append(max(spread) - mid)
            ax.errorbar(sizes, mids, yerr=[lo, hi], marker="o", markersize=3, color=color,
                        label=label, capsize=2)
    for ax in (bw_ax, time_ax):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(figure.BYTES_FORMATTER)
        ax.set_xlabel("message size (bytes, log scale)")
        ax.grid(True, which="major", alpha=0.3)
    bw_ax.set_ylabel("bus bandwidth (GB/s, log scale)")
    collectives = [c for c in COLLECTIVE_NAMES if c in {key[0] for key in keys}]
    if collectives == ["allreduce"]:
        bw_ax.set_title("busbw = algbw · 2(n−1)/n", fontsize=10)
        time_ax.set_ylabel("time per all-reduce (µs, log scale)")
    else:  # nccl-tests' factors: 2(n-1)/n for all-reduce, (n-1)/n for the other two
        bw_ax.set_title("busbw = algbw · 2(n−1)/n (all-reduce), · (n−1)/n (" +
                        ", ".join(COLLECTIVE_NAMES[c] for c in collectives if c != "allreduce") +
                        ")", fontsize=8)
        time_ax.set_ylabel("time per op (µs, log scale)")
    time_ax.set_title("time per op, mean over ranks (bars: min-max rounds/runs)", fontsize=9)
    handles, labels = bw_ax.get_legend_handles_labels()
    ncol = 2 if len(labels) > 3 else 1
    legend_rows = (len(labels) + ncol - 1) // ncol
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=ncol,
               bbox_to_anchor=(0.5, 0.07), frameon=False)
    ranks = sorted({key[4] for key in keys})
    fig.suptitle(f"nanoddp-bench-allreduce: {'/'.join(map(str, ranks))} ranks", fontsize=11)
    machines = []
    for record, _ in records:
        m = record.get("machine") or {}
        text = ", ".join(str(v) for v in (m.get("cpu"), m.get("cores") and f"{m['cores']} cores",
                                          m.get("hostname")) if v)
        if text and text not in machines:
            machines.append(text)
    sources = figure.sources_text(w for s in series.values() for e in s.values() for _, w in e)
    figure.footnote(fig, sources + (f"; {'; '.join(machines)}" if machines else ""),
                    [r for r, _ in records])
    fig.tight_layout(rect=(0, 0.1 + 0.035 * legend_rows, 1, 1))
    what = "/".join(COLLECTIVE_NAMES[c] for c in collectives)
    figure.save(fig, out_dir, "allreduce_busbw", f"{what} bus bandwidth and time vs message "
                f"size ({len(keys)} series)", written)
