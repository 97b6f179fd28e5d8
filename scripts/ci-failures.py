#!/usr/bin/env python3
"""Recap of the tests that failed in one CI run, for the end of its log.

CI keeps only the tail of a long log, and ctest prints a failure's output where the test ends,
hundreds of lines before the summary. So .ci/run ends with this: for each build directory whose
last ctest run had failures, the failed tests' names and the last lines of each one's output
(from ctest's own Testing/Temporary/LastTest.log). Tests that failed and then passed when ctest
ran them again (NANODDP_TEST_RETRIES) are listed too, as flaky, with the failed attempt's output:
a retry lets the run pass, it does not hide the failure.

Usage: scripts/ci-failures.py [--lines N] [--since EPOCH] BUILD_DIR...
A directory whose LastTest.log is older than --since (or missing) is from an earlier run and is
skipped. Then, per directory, its slowest tests (--slowest N, 10 by default; 0: none). Exit
status 1 when a test failed for good, else 0.
"""
import argparse
import os
import re
import sys

# One attempt of one test in LastTest.log: "N/M Testing: <name>", ..., "Output:", a dashed rule,
# the output, "<end of output>", ..., "Test Passed." or "Test Failed." (or another status line).
ATTEMPT = re.compile(r"^\d+/\d+ Testing: ([^\n]*)\n.*?\nOutput:\n-{20,}\n(.*?)<end of output>\n"
                     r"Test time =\s*([0-9.]+)[^\n]*\n-{20,}\n([^\n]*)$", re.S | re.M)


def attempts(build_dir, since):
    """[(name, output, passed, seconds)] in the order ctest ran them; [] for a log from an earlier
    run."""
    path = os.path.join(build_dir, "Testing", "Temporary", "LastTest.log")
    try:
        if os.path.getmtime(path) < since:
            return []
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    return [(m.group(1), m.group(2), m.group(4).strip() != "Test Failed.", float(m.group(3)))
            for m in ATTEMPT.finditer(text)]


def tail(output, lines):
    got = output.rstrip("\n").split("\n")
    return got[-lines:], len(got)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=25)
    parser.add_argument("--since", type=float, default=0.0)
    parser.add_argument("--slowest", type=int, default=10,
                        help="also list this many of the slowest tests of each directory")
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    any_failed = False
    for build_dir in args.dirs:
        runs = attempts(build_dir, args.since)
        last = {}  # name -> passed, from the name's last attempt
        first_failure = {}  # name -> the output of its first failed attempt
        spent = {}  # name -> seconds, over all its attempts
        for name, output, passed, seconds in runs:
            spent[name] = spent.get(name, 0.0) + seconds
            last[name] = passed
            if not passed:
                first_failure.setdefault(name, output)
        failed = [n for n in first_failure if not last[n]]
        flaky = [n for n in first_failure if last[n]]
        for title, names in (("failed", failed), ("failed, then passed on a retry (flaky)", flaky)):
            if not names:
                continue
            print(f"==== {title} in {build_dir}: {len(names)}")
            for name in names:
                print(f"  {name}")
            for name in names:
                lines, total = tail(first_failure[name], args.lines)
                print(f"---- {name} (the failed attempt's last {len(lines)} of {total} lines)")
                for line in lines:
                    print(f"  | {line[:300]}")
        any_failed = any_failed or bool(failed)
        # Where the time went: a run that ends at CI's limit says which tests to look at.
        if runs and args.slowest > 0:
            print(f"==== {build_dir}: {len(spent)} tests, {sum(spent.values()):.0f} s of test "
                  f"time; the slowest {min(args.slowest, len(spent))}:")
            for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1])[:args.slowest]:
                print(f"  {seconds:8.1f} s  {name[:110]}")
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
