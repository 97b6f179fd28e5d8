"""nanoddp-bench-ddp lines -> two charts.

ddp_scaling: scaling efficiency (and samples/s) against world size, one line per model / bucket
  configuration. Efficiency is the line's own "scaling_efficiency"; where that is null it is
  derived from the world-size-1 line of the same configuration as
  samples_per_s(W) / (W * samples_per_s(1)). A baseline line ("baseline": true, the plain
  1-process run without DDP) is the world-1 point of every configuration with its model and
  batch. Strong scaling groups by the global batch, weak by the batch per rank. Several records
  of one point (--repeats, or reruns in other files) are drawn as their median with min-max
  error bars, and said so on stderr: no record is dropped silently.

ddp_breakdown: where a step's time goes, against the bucket cap, overlap on and off side by side,
  one panel per model / world size (W > 1). A bar stacks
    compute, no comm running  = compute_ms - hidden_comm_ms
    compute with comm running = hidden_comm_ms   (the all-reduce time hidden under compute)
    exposed comm              = exposed_comm_ms  (waiting for the all-reduce after backward)
  so its height is compute_ms + exposed_comm_ms, what the step costs; a black tick marks the
  measured median step time, which also holds what neither covers (data, the loss exchange).
"""

import re
import textwrap

import figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

# Config fields that tell two scaling series apart, in label order. Not the ones that follow from
# the world size (backend: none on one process; nnodes, global batch, buckets).
SERIES_FIELDS = ["hidden", "layers", "in", "out", "activation", "device", "scaling",
                 "batch_per_rank", "global_batch", "threads", "comm_hook", "zero_stage", "zero_overlap_gather", "first_bucket_mb",
                 "bucket_cap_mb",
                 "optimizer_in_backward", "overlap", "run", "_build"]
# What is on the breakdown chart's x axis or side by side, not a panel of its own.
BAR_FIELDS = {"bucket_cap_mb", "overlap"}
# The breakdown's panels: one per model / world size / backend / nodes.
PANEL_FIELDS = [f for f in SERIES_FIELDS if f not in BAR_FIELDS] + ["backend", "nnodes",
                                                                     "world_size"]


def _mb(value):
    return f"{value:g} MiB"


def _field_text(name, value):
    return {
        "hidden": lambda v: f"hidden {v}",
        "layers": lambda v: f"{v} layers",
        "in": lambda v: f"in {v}",
        "out": lambda v: f"out {v}",
        "activation": str,
        "device": str,
        "backend": str,
        "scaling": lambda v: f"{v} scaling",
        "batch_per_rank": lambda v: f"batch {v}/rank",
        "global_batch": lambda v: f"global batch {v}",
        "threads": lambda v: f"{v} thread{'s' if v != 1 else ''}",
        "comm_hook": lambda v: f"hook {v}",
        "zero_stage": lambda v: f"ZeRO-{v}",
        "zero_overlap_gather": lambda v: "gather in forward" if v else "gather after step",
        "first_bucket_mb": lambda v: f"first bucket {_mb(v)}",
        "bucket_cap_mb": lambda v: f"buckets {_mb(v)}",
        "overlap": lambda v: "overlap on" if v else "overlap off",
        "optimizer_in_backward": lambda v: "optimizer in backward" if v else "optimizer after",
        "nnodes": lambda v: f"{v} node{'s' if v != 1 else ''}",
        "run": lambda v: f"run {v}",
        "_build": str,
    }[name](value)


# Runs: records written by different commands (or the same command with other steps or
# warm-up) are separate series, numbered in the order they are read; reruns of one command
# (its --repeats, or the same command again, into another file) are one series with error bars.
_RUNS = []
_OUTPUT_FLAGS = re.compile(r"\s--(json|csv)(=|\s+)\S+")


def _command_of(record):
    p = record.get("provenance") if isinstance(record.get("provenance"), dict) else {}
    command = p.get("command")
    return _OUTPUT_FLAGS.sub("", command) if isinstance(command, str) else None


def _run_of(record):
    run = (_command_of(record), record.get("steps"), record.get("warmup"))
    if run not in _RUNS:
        _RUNS.append(run)
    return _RUNS.index(run) + 1


def _series_config(record):
    """Strong scaling keeps the global batch fixed (the per-rank batch shrinks with W), weak the
    per-rank batch: the batch that is constant along a line is the one in its key."""
    c = dict(record["config"])
    c["batch_per_rank" if c.get("scaling") == "strong" else "global_batch"] = None
    c["run"] = _run_of(record)
    # ZeRO stage 0 is plain DDP, as in records from before --zero: no label, the same series.
    c["zero_stage"] = c.get("zero_stage") or None
    c["_build"] = record.get("_build")
    return c


# Fields a plain 1-process baseline does not have (no DDP): it serves every value of them.
DDP_FIELDS = {"comm_hook", "zero_stage", "zero_overlap_gather", "first_bucket_mb", "bucket_cap_mb",
              "optimizer_in_backward", "overlap"}


def _is_baseline(record):
    return bool(record.get("baseline")) or record["config"].get("ddp") is False


def _key(config, fields):
    return tuple((f, config.get(f)) for f in fields)


def _label(key, varying, always=()):
    parts = [_field_text(f, v) for f, v in key if v is not None and (f in varying or f in always)]
    return ", ".join(parts)


def _sort_key(key):
    """Numbers as numbers (1 < 4 < 25 MiB), overlap on before off, None last."""
    return tuple((0, -v if isinstance(v, bool) else v, "") if isinstance(v, (int, float))
                 else (1, 0, str(v)) for _, v in key)


def _wrap(text, width=110):
    return textwrap.fill(text, width=width)


def _varying(keys, fields):
    return {f for i, f in enumerate(fields) if len({k[i][1] for k in keys}) > 1}


def _machine_text(records):
    machines = []
    for record, _ in records:
        m = record.get("machine") or {}
        text = ", ".join(str(m[f]) for f in ("cpu", "cores", "hostname") if m.get(f))
        if m.get("cores"):
            text = text.replace(f", {m['cores']},", f", {m['cores']} cores,", 1)
        if text and text not in machines:
            machines.append(text)
    return "; ".join(machines)


def _median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def _efficiency_values(record, baseline):
    """The record's efficiency and, with --repeats, every launch's."""
    value = _efficiency(record, baseline)
    if value is None:
        return []
    launches = [v for v in record.get("scaling_efficiency_repeats") or []
                if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [value] + launches


def _efficiency(record, baseline):
    value = record.get("scaling_efficiency")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    world = record["config"]["world_size"]
    if baseline is None or baseline["samples_per_s"] <= 0:
        return None
    return record["samples_per_s"] / (world * baseline["samples_per_s"])


def plot_scaling(records, out_dir, written):
    series = {}
    baselines = []
    for record, where in records:
        if _is_baseline(record):
            baselines.append((record, where))
            continue
        key = _key(_series_config(record), SERIES_FIELDS)
        series.setdefault(key, {}).setdefault(record["config"]["world_size"], []).append(
            (record, where))
    # The baselines: the world-1 point of every series with their model and batch; alone (a
    # sweep of one rank) they are series of their own.
    for record, where in baselines:
        key = _key(_series_config(record), SERIES_FIELDS)
        model = [(f, v) for f, v in key if f not in DDP_FIELDS]
        matches = [k for k in series
                   if [(f, v) for f, v in k if f not in DDP_FIELDS] == model]
        for k in matches or [key]:
            series.setdefault(k, {}).setdefault(1, []).append((record, where))
    keys = sorted(series, key=_sort_key)
    varying = _varying(keys, SERIES_FIELDS)
    # A colour per configuration but overlap; overlap off is the dashed twin of overlap on.
    colour_keys = sorted({tuple((f, v) for f, v in k if f != "overlap") for k in keys},
                         key=_sort_key)
    fig, axes = figure.new_figure(ncols=2, width=10.5, height=5.4)
    eff_ax, sps_ax = axes[0]
    worlds = sorted({w for s in series.values() for w in s})
    for i, key in enumerate(keys):
        points = sorted(series[key].items())
        base_entries = series[key].get(1, [])
        baseline = base_entries[0][0] if base_entries else None
        colour_key = tuple((f, v) for f, v in key if f != "overlap")
        color = figure.COLORS[colour_keys.index(colour_key) % len(figure.COLORS)]
        style = "-" if dict(key).get("overlap", True) else "--"
        label = _label(key, varying, always=("bucket_cap_mb", "overlap"))
        eff_x, eff_y, eff_lo, eff_hi = [], [], [], []
        sps_x, sps_y, sps_lo, sps_hi = [], [], [], []
        for world, entries in points:
            if len(entries) > 1:
                what = ("baseline records" if all(_is_baseline(r) for r, _ in entries)
                        else "records")
                figure.note(f"{len(entries)} {what} for '{label}' at {world} rank(s) "
                            f"({', '.join(w for _, w in entries)}): drawn as their median with "
                            "min-max error bars")
            effs = [e for r, _ in entries for e in _efficiency_values(r, baseline)]
            if effs:
                mid = _median([_efficiency(r, baseline) for r, _ in entries
                               if _efficiency(r, baseline) is not None])
                eff_x.append(world)
                eff_y.append(mid)
                eff_lo.append(mid - min(effs))
                eff_hi.append(max(effs) - mid)
            sps = [r["samples_per_s"] for r, _ in entries]
            sps += [v for r, _ in entries for v in r.get("repeat_samples_per_s") or []]
            mid = _median([r["samples_per_s"] for r, _ in entries])
            sps_x.append(world)
            sps_y.append(mid)
            sps_lo.append(mid - min(sps))
            sps_hi.append(max(sps) - mid)
        if eff_x:
            eff_ax.errorbar(eff_x, eff_y, yerr=[eff_lo, eff_hi], marker="o", markersize=4,
                            linestyle=style, color=color, label=label, capsize=3)
        sps_ax.errorbar(sps_x, sps_y, yerr=[sps_lo, sps_hi], marker="o", markersize=4,
                        linestyle=style, color=color, label=label, capsize=3)
    eff_ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    eff_ax.set_ylabel("scaling efficiency (1 = linear)")
    eff_ax.set_ylim(0, max(1.1, eff_ax.get_ylim()[1]))
    eff_ax.set_title("samples/s(W) / (W · samples/s of the baseline)", fontsize=10)
    sps_ax.set_ylabel("samples/s (all ranks)")
    sps_ax.set_ylim(bottom=0)
    sps_ax.set_title("throughput (bars: min-max over launches)", fontsize=10)
    for ax in (eff_ax, sps_ax):
        if len(worlds) > 1 and worlds[-1] / worlds[0] >= 4:
            ax.set_xscale("log", base=2)  # 1, 2, 4, 8, ... evenly spaced
            ax.minorticks_off()
        ax.set_xticks(worlds)
        ax.set_xticklabels([str(w) for w in worlds])
        ax.set_xlabel("world size (ranks)")
        ax.grid(True, alpha=0.3)
    # The legend below the panels, where it covers no data.
    handles, labels = eff_ax.get_legend_handles_labels()
    if not handles:
        handles, labels = sps_ax.get_legend_handles_labels()
    ncol = 2 if len(labels) > 3 else 1
    legend_rows = (len(labels) + ncol - 1) // ncol
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=ncol, handlelength=3.5,
               bbox_to_anchor=(0.5, 0.07), frameon=False)
    common = [(f, v) for f, v in keys[0] if f not in varying and f not in BAR_FIELDS]
    fig.suptitle(_wrap("nanoddp-bench-ddp: " + _label(common, {f for f, _ in common})),
                 fontsize=10)
    shown = [e for s in series.values() for entries in s.values() for e in entries]
    note = figure.sources_text(w for _, w in shown)
    machine = _machine_text(records)
    figure.footnote(fig, note + (f"; {machine}" if machine else ""), [r for r, _ in records])
    bottom = 0.1 + 0.035 * legend_rows
    fig.tight_layout(rect=(0, bottom, 1, 1))
    figure.save(fig, out_dir, "ddp_scaling", f"scaling efficiency vs world size ({len(keys)} "
                "configurations)", written)


SEGMENTS = [("compute,\nno comm running", "#4c72b0"),
            ("compute with comm\nrunning (hidden comm)", "#8fbc8f"),
            ("exposed comm\n(waiting for it)", "#d62728")]


def _segments(record):
    compute = max(record["compute_ms"], 0.0)
    hidden = min(max(record["hidden_comm_ms"], 0.0), compute)
    return [compute - hidden, hidden, max(record["exposed_comm_ms"], 0.0)]


def plot_breakdown(records, out_dir, written):
    multi = [(r, w) for r, w in records if r["config"]["world_size"] > 1]
    shown = multi or records  # a single-process sweep still shows its compute
    panel_fields = PANEL_FIELDS
    panels = {}
    grouped = {}
    for record, where in shown:
        key = _key(_series_config(record), panel_fields)
        bar = (record["config"]["bucket_cap_mb"], record["config"]["overlap"])
        grouped.setdefault(key, {}).setdefault(bar, []).append((record, where))
    for key, bars in grouped.items():
        panel = panels.setdefault(key, {})
        for bar, entries in bars.items():
            # One bar per configuration: several records (reruns) show the median one, said so.
            entries = sorted(entries, key=lambda e: e[0]["step_ms_median"])
            if len(entries) > 1:
                figure.note(f"{len(entries)} records for one breakdown bar (bucket cap "
                            f"{_mb(bar[0])}, overlap {'on' if bar[1] else 'off'}; "
                            f"{', '.join(w for _, w in entries)}): showing the median one, "
                            f"{entries[(len(entries) - 1) // 2][1]}")
            panel[bar] = entries[(len(entries) - 1) // 2]
    keys = sorted(panels, key=_sort_key)
    varying = _varying(keys, panel_fields)
    ncols = min(len(keys), 2)
    nrows = (len(keys) + ncols - 1) // ncols
    height = 3.4 * nrows + 1.2  # + title and the labels below the bars
    fig_width = 4.6 * ncols + 2.6  # + the legend on the right
    fig, axes = figure.new_figure(ncols=ncols, nrows=nrows, width=fig_width, height=height)
    for index, key in enumerate(keys):
        ax = axes[index // ncols][index % ncols]
        bars = panels[key]
        caps = sorted({cap for cap, _ in bars})
        overlaps = [o for o in (True, False) if any((c, o) in bars for c in caps)]
        width = 0.8 / len(overlaps)
        ticks, tick_labels = [], []
        for c, cap in enumerate(caps):
            for j, overlap in enumerate(overlaps):
                entry = bars.get((cap, overlap))
                if entry is None:
                    continue
                record = entry[0]
                x = c - 0.4 + width * (j + 0.5)
                bottom = 0.0
                for (name, color), value in zip(SEGMENTS, _segments(record)):
                    ax.bar(x, value, width=width * 0.9, bottom=bottom, color=color,
                           hatch=None if overlap else "//", edgecolor="white", linewidth=0.5)
                    bottom += value
                # The step the segments break down (the median step; older lines: the median).
                step = (record.get("median_step") or {}).get("step_ms", record["step_ms_median"])
                ax.plot([x - width * 0.45, x + width * 0.45], [step] * 2,
                        color="black", linewidth=2)
                ticks.append(x)
                tick_labels.append("on" if overlap else "off")
            ax.text(c, -0.085, f"cap {_mb(cap)}", transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=9)
        ax.set_xticks(ticks)
        ax.set_xticklabels(tick_labels, fontsize=8)
        ax.set_xlim(-0.6, len(caps) - 0.4)
        ax.set_ylabel("ms per step")
        ax.grid(True, axis="y", alpha=0.3)
        world = dict(key)["world_size"]
        title = f"{world} rank{'s' if world != 1 else ''}"
        detail = _label(key, varying - {"world_size"})
        ax.set_title(title + (f", {detail}" if detail else ""), fontsize=10)
    for index in range(len(keys), nrows * ncols):
        axes[index // ncols][index % ncols].set_visible(False)
    handles = [Line2D([], [], color="black", linewidth=2, label="measured step\n(the median one)")]
    handles += [Patch(facecolor=color, label=name) for name, color in reversed(SEGMENTS)]
    handles.append(Patch(facecolor="#999999", edgecolor="white", hatch="//",
                         label="overlap off\n(--no-overlap)"))
    right = 1 - 2.5 / fig_width
    fig.legend(handles=handles, loc="center left", fontsize=8, labelspacing=1.0,
               bbox_to_anchor=(right + 0.01, 0.5), frameon=False)
    common = [(f, v) for f, v in keys[0] if f not in varying and f != "world_size"]
    fig.suptitle(_wrap("nanoddp-bench-ddp: step time by bucket cap, overlap on / off (hatched); "
                       + _label(common, {f for f, _ in common}), int(fig_width * 11)), fontsize=10)
    note = figure.sources_text(w for b in panels.values() for _, w in b.values())
    machine = _machine_text(shown)
    figure.footnote(fig, note + (f"; {machine}" if machine else ""), [r for r, _ in shown])
    fig.subplots_adjust(left=0.75 / fig_width, right=right, top=1 - 0.85 / height,
                        bottom=0.95 / height, hspace=0.6, wspace=0.25)
    figure.save(fig, out_dir, "ddp_breakdown", "step-time breakdown vs bucket cap, overlap on/off "
                f"({len(keys)} panel{'s' if len(keys) != 1 else ''})", written)


def plot(records, out_dir, written):
    _RUNS.clear()
    runs = {_run_of(r): _command_of(r) for r, _ in records}
    if len(runs) > 1:
        for run, command in sorted(runs.items()):
            figure.note(f"run {run}: {command or 'no command recorded'}")
    plot_scaling(records, out_dir, written)
    plot_breakdown(records, out_dir, written)
