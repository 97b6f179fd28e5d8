"""nanoddp-bench-ddp lines -> two charts.

ddp_scaling: scaling efficiency (and samples/s) against world size, one line per model / bucket
  configuration. Efficiency is the line's own "scaling_efficiency"; where that is null it is
  derived from the world-size-1 line of the same configuration as
  samples_per_s(W) / (W * samples_per_s(1)).

ddp_breakdown: where a step's time goes, against the bucket cap, overlap on and off side by side,
  one panel per model / world size (W > 1). A bar stacks
    compute, no comm running  = compute_ms - hidden_comm_ms
    compute with comm running = hidden_comm_ms   (the all-reduce time hidden under compute)
    exposed comm              = exposed_comm_ms  (waiting for the all-reduce after backward)
  so its height is compute_ms + exposed_comm_ms, what the step costs; a black tick marks the
  measured median step time, which also holds what neither covers (data, the loss exchange).
"""

import textwrap

import figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

# Config fields that tell two scaling series apart, in label order. Not the ones that follow from
# the world size (backend: none on one process; nnodes, global batch, buckets).
SERIES_FIELDS = ["hidden", "layers", "in", "out", "activation", "device", "scaling",
                 "batch_per_rank", "threads", "comm_hook", "first_bucket_mb", "bucket_cap_mb",
                 "optimizer_in_backward", "overlap"]
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
        "threads": lambda v: f"{v} thread{'s' if v != 1 else ''}",
        "comm_hook": lambda v: f"hook {v}",
        "first_bucket_mb": lambda v: f"first bucket {_mb(v)}",
        "bucket_cap_mb": lambda v: f"buckets {_mb(v)}",
        "overlap": lambda v: "overlap on" if v else "overlap off",
        "optimizer_in_backward": lambda v: "optimizer in backward" if v else "optimizer after",
        "nnodes": lambda v: f"{v} node{'s' if v != 1 else ''}",
    }[name](value)


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
    for record, where in records:
        key = _key(record["config"], SERIES_FIELDS)
        series.setdefault(key, {})[record["config"]["world_size"]] = (record, where)
    keys = sorted(series, key=_sort_key)
    varying = _varying(keys, SERIES_FIELDS)
    # A colour per configuration but overlap; overlap off is the dashed twin of overlap on.
    colour_keys = sorted({tuple((f, v) for f, v in k if f != "overlap") for k in keys},
                         key=_sort_key)
    fig, axes = figure.new_figure(ncols=2, width=10.5, height=4.6)
    eff_ax, sps_ax = axes[0]
    worlds = sorted({w for s in series.values() for w in s})
    for i, key in enumerate(keys):
        points = sorted(series[key].items())
        baseline = series[key].get(1, (None, None))[0]
        colour_key = tuple((f, v) for f, v in key if f != "overlap")
        color = figure.COLORS[colour_keys.index(colour_key) % len(figure.COLORS)]
        style = "-" if dict(key).get("overlap", True) else "--"
        label = _label(key, varying, always=("bucket_cap_mb", "overlap"))
        eff = [(w, _efficiency(r, baseline)) for w, (r, _) in points]
        eff = [(w, e) for w, e in eff if e is not None]
        if eff:
            eff_ax.plot([w for w, _ in eff], [e for _, e in eff], marker="o", markersize=4,
                        linestyle=style, color=color, label=label)
        sps_ax.plot([w for w, _ in points], [r["samples_per_s"] for _, (r, _) in points],
                    marker="o", markersize=4, linestyle=style, color=color, label=label)
    eff_ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    eff_ax.set_ylabel("scaling efficiency (1 = linear)")
    eff_ax.set_ylim(0, max(1.1, eff_ax.get_ylim()[1]))
    eff_ax.set_title("samples/s(W) / (W · samples/s(1))", fontsize=10)
    sps_ax.set_ylabel("samples/s (all ranks)")
    sps_ax.set_ylim(bottom=0)
    sps_ax.set_title("throughput", fontsize=10)
    for ax in (eff_ax, sps_ax):
        if len(worlds) > 1 and worlds[-1] / worlds[0] >= 4:
            ax.set_xscale("log", base=2)  # 1, 2, 4, 8, ... evenly spaced
            ax.minorticks_off()
        ax.set_xticks(worlds)
        ax.set_xticklabels([str(w) for w in worlds])
        ax.set_xlabel("world size (ranks)")
        ax.grid(True, alpha=0.3)
    eff_ax.legend(fontsize=7, loc="lower left", handlelength=3.5)
    common = [(f, v) for f, v in keys[0] if f not in varying and f not in BAR_FIELDS]
    fig.suptitle(_wrap("nanoddp-bench-ddp: " + _label(common, {f for f, _ in common})),
                 fontsize=10)
    note = figure.sources_text(w for s in series.values() for _, w in s.values())
    machine = _machine_text(records)
    figure.footnote(fig, note + (f"; {machine}" if machine else ""))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
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
    for record, where in shown:
        key = _key(record["config"], panel_fields)
        bars = panels.setdefault(key, {})
        bars[(record["config"]["bucket_cap_mb"], record["config"]["overlap"])] = (record, where)
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
                ax.plot([x - width * 0.45, x + width * 0.45], [record["step_ms_median"]] * 2,
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
    handles = [Line2D([], [], color="black", linewidth=2, label="measured step\n(median)")]
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
    figure.footnote(fig, note + (f"; {machine}" if machine else ""))
    fig.subplots_adjust(left=0.75 / fig_width, right=right, top=1 - 0.85 / height,
                        bottom=0.75 / height, hspace=0.6, wspace=0.25)
    figure.save(fig, out_dir, "ddp_breakdown", "step-time breakdown vs bucket cap, overlap on/off "
                f"({len(keys)} panel{'s' if len(keys) != 1 else ''})", written)


def plot(records, out_dir, written):
    plot_scaling(records, out_dir, written)
    plot_breakdown(records, out_dir, written)
