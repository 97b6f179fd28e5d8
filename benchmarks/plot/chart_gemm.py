"""nanoddp-bench-gemm lines -> GFLOP/s against matrix size (square shapes), one line per backend
(the `eigen` yardstick, nanoddp's CPU backend with its own kernels and with Eigen, the CUDA GEMMs
where they ran), and a bar chart
of the MLP's own GEMM shapes (forward, input grad, weight grad, and the cold-cache step row).
Error bars: the slowest to the fastest timed call of each row (min_ms, max_ms; lines written
before the benchmark recorded them get none).
"""

import figure

MLP_SHAPES = ["mlp-forward", "mlp-input-grad", "mlp-weight-grad", "mlp-step"]
BACKEND_ORDER = ["eigen", "nanoddp-cpu", "nanoddp-eigen", "cuda-hand", "cuda-cublas"]
LABELS = {"eigen": "Eigen (reference)", "nanoddp-cpu": "nanoddp CPU backend (own kernels)",
          "nanoddp-eigen": "nanoddp CPU backend, --gemm eigen"}


CPU_BACKENDS = ("eigen", "nanoddp-cpu", "nanoddp-eigen")
LINESTYLES = {"eigen": "--", "nanoddp-eigen": ":"}


def _backend_rank(name):
    return BACKEND_ORDER.index(name) if name in BACKEND_ORDER else len(BACKEND_ORDER)


def series_key(record):
    return (record["backend"], record.get("threads", 1))


def label_of(key, threads_vary):
    backend, threads = key
    label = LABELS.get(backend, backend)
    if threads_vary:
        label += f", {threads} thread{'s' if threads != 1 else ''}"
    return label


def _colour(key, keys):
    """The CPU rows group up: Eigen and nanoddp (both GEMMs) at one thread count share a colour
    (Eigen dashed or hatched, nanoddp's Eigen dotted); other backends (CUDA) get colours of their
    own."""
    threads = sorted({k[1] for k in keys})
    if key[0] in CPU_BACKENDS:
        index = threads.index(key[1])
    else:
        others = sorted({k[0] for k in keys} - set(CPU_BACKENDS), key=_backend_rank)
        index = len(threads) + others.index(key[0])
    return figure.COLORS[index % len(figure.COLORS)]


def _gflops_error(records):
    """Error bars (below, above) of GFLOP/s from the spread of the timed calls: the fastest call
    (min_ms) gives the highest rate, the slowest (max_ms) the lowest. None when a record predates
    the spread fields (then no bar is drawn for any)."""
    below, above = [], []
    for r in records:
        if not all(isinstance(r.get(k), (int, float)) and r[k] > 0
                   for k in ("median_ms", "min_ms", "max_ms")):
            return None
        # max(0, ...): one call, or a median equal to an extreme, differs only by rounding.
        below.append(max(0.0, r["gflops"] - r["gflops"] * r["median_ms"] / r["max_ms"]))
        above.append(max(0.0, r["gflops"] * r["median_ms"] / r["min_ms"] - r["gflops"]))
    return [below, above]


def _host_text(records):
    hosts = sorted({r.get("hostname", "") for r, _ in records} - {""})
    compilers = sorted({r.get("compiler", "") for r, _ in records} - {""})
    parts = []
    if hosts:
        parts.append("host " + ", ".join(hosts))
    if compilers:
        parts.append(", ".join(compilers))
    return "; ".join(parts)


def plot_squares(records, out_dir, written):
    squares = [(r, w) for r, w in records if r["shape"] == "square"]
    if not squares:
        return
    series = {}
    for record, where in squares:
        points = series.setdefault(series_key(record), {})
        if record["n"] in points:
            figure.note(f"{where} measures n = {record['n']} again for {record['backend']} "
                        f"(first: {points[record['n']][1]}): the later line is drawn")
        points[record["n"]] = (record, where)
    keys = sorted(series, key=lambda k: (k[1], _backend_rank(k[0])))
    threads_vary = len({k[1] for k in keys}) > 1
    fig, axes = figure.new_figure(width=7.0, height=4.4)
    ax = axes[0][0]
    for key in keys:
        points = sorted(series[key].items())
        xs, ys = [n for n, _ in points], [r["gflops"] for _, (r, _) in points]
        ax.plot(xs, ys, marker="o" if key[0] == "eigen" else "s", markersize=4,
                color=_colour(key, keys), linestyle=LINESTYLES.get(key[0], "-"),
                label=label_of(key, threads_vary))
        error = _gflops_error([r for _, (r, _) in points])
        if error is not None:
            ax.errorbar(xs, ys, yerr=error, fmt="none", ecolor=_colour(key, keys), capsize=2,
                        linewidth=0.8)
    ax.set_xscale("log", base=2)
    sizes = sorted({r["n"] for r, _ in squares})
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(n) for n in sizes])
    ax.set_xlabel("matrix size n (C = A·B, all n × n, float32)")
    ax.set_ylabel("GFLOP/s (2n³ flops / median time; bars: slowest to fastest call)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    threads = sorted({k[1] for k in keys})
    ax.set_title(f"nanoddp-bench-gemm: square GEMMs, {'/'.join(map(str, threads))} "
                 f"thread{'s' if threads != [1] else ''}", fontsize=11)
    note = figure.sources_text(w for s in series.values() for _, w in s.values())
    host = _host_text(squares)
    figure.footnote(fig, note + (f"; {host}" if host else ""), [r for r, _ in squares])
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    figure.save(fig, out_dir, "gemm_gflops", f"GEMM GFLOP/s vs matrix size ({len(keys)} series)",
                written)


def plot_mlp(records, out_dir, written):
    mlp = [(r, w) for r, w in records if r["shape"] in MLP_SHAPES]
    if not mlp:
        return
    values = {}
    for record, where in mlp:
        if (series_key(record), record["shape"]) in values:
            figure.note(f"{where} measures {record['shape']} again for {record['backend']}: the "
                        "later line is drawn")
        values[(series_key(record), record["shape"])] = record
    keys = sorted({k for k, _ in values}, key=lambda k: (k[1], _backend_rank(k[0])))
    shapes = [s for s in MLP_SHAPES if any((k, s) in values for k in keys)]
    threads_vary = len({k[1] for k in keys}) > 1
    fig, axes = figure.new_figure(width=7.5, height=4.4)
    ax = axes[0][0]
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        xs, ys, drawn = [], [], []
        for j, shape in enumerate(shapes):
            record = values.get((key, shape))
            if record is None:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(record["gflops"])
            drawn.append(record)
        bars = ax.bar(xs, ys, width=width * 0.95, color=_colour(key, keys),
                      hatch={"eigen": "//", "nanoddp-eigen": ".."}.get(key[0]), edgecolor="white",
                      label=label_of(key, threads_vary), yerr=_gflops_error(drawn),
                      error_kw={"capsize": 2, "linewidth": 0.8})
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    labels = []
    for shape in shapes:
        record = next(values[(k, shape)] for k in keys if (k, shape) in values)
        if shape == "mlp-step":
            labels.append(f"{shape}\n{record.get('gemms', '?')} GEMMs,\ncold caches")
        else:
            labels.append(f"{shape}\n{record['layout']} {record['m']}×{record['n']}×{record['k']}")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("GFLOP/s")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.4)  # room for the legend above the bars
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax.set_title("nanoddp-bench-gemm: the GEMMs of one MLP layer (m×n×k)", fontsize=11)
    host = _host_text(mlp)
    figure.footnote(fig, figure.sources_text(w for _, w in mlp) + (f"; {host}" if host else ""),
                    [r for r, _ in mlp])
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    figure.save(fig, out_dir, "gemm_mlp", f"GFLOP/s of the MLP's GEMM shapes ({len(shapes)} "
                "shapes)", written)


def plot(records, out_dir, written):
    plot_squares(records, out_dir, written)
    plot_mlp(records, out_dir, written)
