"""nanoddp-bench-allreduce lines -> bus bandwidth (and time per op) against message size.

One line per backend / mode (nanoddp ProcessGroup or raw gloo::allreduce) / transport (shared
memory or TCP ring, read from the line's "algorithm" text), so runs with --raw and with
NANODDP_SHM=0 land on one chart and the engine's overhead and the transports can be compared.
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


def series_key(record):
    # Lines from before the column sets were in place.
    return (record["backend"], record["mode"], transport_of(record), record["ranks"],
            record.get("dtype", "float"), record.get("op", "sum"),
            record.get("placement", "in-place"),
            # --allow-mixed-builds: each build (commit, host) a series of its own.
            record.get("_build"))


def label_of(key, varying):
    backend, mode, transport, ranks, dtype, op, placement, build = key
    parts = [f"{backend}: {MODE_NAMES.get(mode, mode)}"]
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
    return ", ".join(parts)


def plot(records, out_dir, written):
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
    keys = sorted(series, key=lambda k: (k[0], k[1] != "nanoddp", k[1], k[2] != "shared memory",
                                         k[2], k[3], k[4], k[5], k[6] != "in-place"))
    varying = {
        name: len({key[i] for key in keys}) > 1
        for i, name in ((3, "ranks"), (4, "dtype"), (5, "op"), (6, "placement"))
    }
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
    bw_ax.set_title("busbw = algbw · 2(n−1)/n", fontsize=10)
    time_ax.set_ylabel("time per all-reduce (µs, log scale)")
    time_ax.set_title("time per op, mean over ranks (bars: min-max rounds/runs)", fontsize=9)
    handles, labels = bw_ax.get_legend_handles_labels()
    ncol = 2 if len(labels) > 3 else 1
    legend_rows = (len(labels) + ncol - 1) // ncol
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=ncol,
               bbox_to_anchor=(0.5, 0.07), frameon=False)
    ranks = sorted({key[3] for key in keys})
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
    figure.save(fig, out_dir, "allreduce_busbw", "all-reduce bus bandwidth and time vs message "
                f"size ({len(keys)} series)", written)
