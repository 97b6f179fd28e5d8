"""Shared chart plumbing: the headless backend, sizes, and saving small PNGs."""

import os

import matplotlib

matplotlib.use("Agg")  # no display: these scripts run in CI and over ssh

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FuncFormatter  # noqa: E402

DPI = 100

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


def footnote(fig, text):
    """Provenance in small grey print at the bottom left (which files, which machine)."""
    fig.text(0.01, 0.005, text, fontsize=7, color="#666666", ha="left", va="bottom")


def save(fig, out_dir, name, what, written):
    """Writes OUT_DIR/NAME.png, prints it, and appends the path to `written`."""
    path = os.path.join(out_dir, name + ".png")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    print(f"wrote {path}: {what}")
    written.append(path)


def sources_text(wheres):
    """'a.jsonl, b.jsonl' from 'a.jsonl:3'-style locations (file order kept)."""
    files = []
    for where in wheres:
        path = where.rsplit(":", 1)[0]
        name = os.path.basename(path)
        if name not in files:
            files.append(name)
    return "data: " + ", ".join(files)
