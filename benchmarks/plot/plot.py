#!/usr/bin/python3
"""Charts (PNG and SVG) from the JSON lines of nanoddp's benchmarks.

  benchmarks/plot/plot.py --out DIR FILE.jsonl [FILE.jsonl ...]

--out is required (there is no default folder): the charts go where the command says.

Each line says which benchmark wrote it, and the charts follow from what the files hold; lines of
one benchmark from several files share its charts (e.g. runs with and without --raw):
  nanoddp-bench-ddp --json        ddp_scaling.png     scaling efficiency vs world size
                                  ddp_breakdown.png   step time: compute / hidden / exposed comm
                                                      vs bucket cap, overlap on and off
  nanoddp-bench-allreduce --json  allreduce_busbw.png bus bandwidth vs message size
  nanoddp-bench-gemm --json       gemm_gflops.png     GFLOP/s vs size, nanoddp vs Eigen
                                  gemm_mlp.png        GFLOP/s of the MLP's GEMM shapes
nanoddp-bench-allreduce --collective reduce_scatter / allgather lines are drawn on the all-reduce
chart, a series per collective. It prints one "wrote PATH: what" line per chart. A missing or
empty file, or a line it does not recognise, is an error naming the file and line (exit code 2).
Files that hold no record a chart can show (every nanoddp-bench-ddp point failed) write no chart:
said on stderr, exit code 1, so that a script does not take the missing charts for drawn ones.

Needs Debian's python3-matplotlib (the Agg backend: no display needed). The shebang is
/usr/bin/python3 because that is the interpreter Debian's packages are installed for.
"""

import argparse
import os
import sys

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPT_DIR)

from records import InputError, read_files  # noqa: E402

PROG = "plot.py"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog=PROG, description="PNG charts from nanoddp benchmark JSON lines "
        "(nanoddp-bench-ddp, nanoddp-bench-allreduce, nanoddp-bench-gemm --json FILE).")
    # Required: a default of "." wrote charts into whatever folder the script ran from (an outside
    # tester's source tree).
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for the PNG and SVG files (created if missing; required)")
    parser.add_argument("--allow-mixed-builds", action="store_true",
                        help="draw records of different commits, dirty trees or hosts as "
                        "separate, labelled series (refused without it)")
    parser.add_argument("files", nargs="+", metavar="FILE.jsonl",
                        help="JSON-lines files written by the benchmarks' --json")
    # argparse keeps the last of a repeated option without a word; the benchmarks refuse repeats.
    if sum(1 for a in argv if a == "--out" or a.startswith("--out=")) > 1:
        parser.error("--out is given twice: give it once")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    try:
        by_kind = read_files(args.files, args.allow_mixed_builds)
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if not by_kind:
        print(f"{PROG}: error: no chart written: the files hold no record a chart can show "
              "(every one a failed point, named above)", file=sys.stderr)
        return 1
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        print(f"{PROG}: error: --out {args.out}: cannot create the directory ({e.strerror})",
              file=sys.stderr)
        return 2
    try:
        import chart_allreduce
        import chart_ddp
        import chart_gemm
    except ImportError as e:
        print(f"{PROG}: error: {e}. Install Debian's python3-matplotlib "
              "(scripts/install-deps.sh) and run this with /usr/bin/python3.", file=sys.stderr)
        return 1
    charts = {"ddp": chart_ddp, "allreduce": chart_allreduce, "gemm": chart_gemm}
    written = []
    for kind in ("ddp", "allreduce", "gemm"):
        if kind not in by_kind:
            continue
        before = len(written)
        charts[kind].plot(by_kind[kind], args.out, written)
        if len(written) == before:
            print(f"{PROG}: note: the {kind} lines hold nothing these charts show", file=sys.stderr)
    if not written:
        print(f"{PROG}: error: no chart written (see the notes above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
