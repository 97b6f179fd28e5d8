"""Shared chart plumbing: the headless backend, sizes, and saving small PNGs."""

import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: these scripts run in CI and over ssh

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FuncFormatter  # noqa: E402

DPI = 100
# SVG text stays text (editable in a paper's figure, searchable), not glyph outlines.
plt.rcParams["svg.fonttype"] = "none"

# One colour per series, in a fixed order, so a series keeps its colour across charts.
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
          "#17becf", "#7f7f7f", "#bcbd22"]


def human_bytes(value, _pos=None):
    """8, 1K, 64M: the powers of 1024 nccl-tests and nanoddp-bench-allreduce use."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if value >= scale:
            shown = value / scale
            return f"{shown:.0f}{unit}" if shown == int(shown) else f"{shown:.1f}{unit}"
    return f"{value:.0f}"


BYTES_FORMATTER = FuncFormatter(human_bytes)


def new_figure(ncols=1, nrows=1, width=7.0, height=4.2, **kwargs):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kwargs)
    return fig, axes


def footnote(fig, text, records=None):
    """Provenance in small grey print at the bottom left (which files, which machine; with
    `records`, a second line: steps, warm-up, commit, date, load)."""
    if records is not None:
        text = provenance_text(records) + "\n" + text
    fig.text(0.01, 0.005, text, fontsize=7, color="#666666", ha="left", va="bottom")


def save(fig, out_dir, name, what, written):
    """Writes OUT_DIR/NAME.png and, for papers, the same chart as OUT_DIR/NAME.svg; prints both
    and appends their paths to `written`."""
    path = os.path.join(out_dir, name + ".png")
    # "tight": the figure grows to hold a legend or footnote that would otherwise be clipped.
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.1)
    svg = os.path.join(out_dir, name + ".svg")
    fig.savefig(svg, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    print(f"wrote {path}: {what}")
    print(f"wrote {svg}: the same chart as SVG")
    written.extend([path, svg])


def note(text):
    """Something the reader of a chart must know (records merged or set aside): on stderr."""
    print(f"plot.py: note: {text}", file=sys.stderr)


def _span(values, fmt):
    values = sorted(set(values))
    if not values:
        return None
    return fmt(values[0]) if len(values) == 1 else f"{fmt(values[0])}–{fmt(values[-1])}"


def provenance_text(records):
    """What the chart's numbers rest on, from the records themselves: steps (or iterations) and
    warm-up, launches, the commit(s) and whether the tree was dirty, the date(s) and the load
    average. Lines written before provenance existed say so."""
    parts = []
    steps = _span([r["steps"] for r in records if "steps" in r], str)
    iters = _span([r["iters"] for r in records if "iters" in r], str)
    warmup = _span([r["warmup"] for r in records if "warmup" in r], str)
    if steps:
        parts.append(f"{steps} steps")
    if iters:
        parts.append(f"{iters} ops/round")
    if warmup:
        parts.append(f"{warmup} warm-up")
    rounds = _span([r["rounds"] for r in records if "rounds" in r], str)
    if rounds:
        parts.append(f"{rounds} round(s)")
    launches = _span([r.get("repeats", 1) for r in records if r.get("bench") == "ddp"], str)
    if launches and launches != "1":
        parts.append(f"{launches} launches")
    provs = [r["provenance"] for r in records if isinstance(r.get("provenance"), dict)]
    if provs:
        commits = []
        for p in provs:
            text = str(p.get("commit", "?"))[:10] + (" dirty" if p.get("dirty") == "yes" else "")
            if text not in commits:
                commits.append(text)
        parts.append("commit " + ", ".join(commits))
        dates = _span([str(p.get("utc", ""))[:16].replace("T", " ") for p in provs if p.get("utc")],
                      str)
        if dates:
            parts.append(dates + " UTC")
        loads = _span([p["load_average"][0] for p in provs
                       if isinstance(p.get("load_average"), list)], lambda v: f"{v:.1f}")
        if loads:
            parts.append(f"load {loads}")
    if len(provs) < len(records):
        parts.append(f"{len(records) - len(provs)} line(s) without provenance (older runs)")
    return "; ".join(parts)


def sources_text(wheres):
    """'a.jsonl, b.jsonl' from 'a.jsonl:3'-style locations (file order kept)."""
    files = []
    for where in wheres:
        path = where.rsplit(":", 1)[0]
        name = os.path.basename(path)
        if name not in files:
            files.append(name)
    return "data: " + ", ".join(files)
