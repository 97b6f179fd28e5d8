#!/usr/bin/env python3
"""Recap of the tests that failed in one CI run, for the end of its log.

CI keeps only the tail of a long log, and ctest prints a failure's output where the test ends,
hundreds of lines before the summary. So .ci/run ends with this: for each build directory whose
last ctest run had failures, the failed tests' names and the last lines of each one's output
(from ctest's own Testing/Temporary/LastTest.log).

Usage: scripts/ci-failures.py [--lines N] [--since EPOCH] BUILD_DIR...
A directory whose LastTestsFailed.log is older than --since (or missing) is from an earlier run
and is skipped.
"""
import argparse
import os
import re
import sys


def failed_names(build_dir, since):
    path = os.path.join(build_dir, "Testing", "Temporary", "LastTestsFailed.log")
    try:
        if os.path.getmtime(path) < since:
            return []
        with open(path, encoding="utf-8", errors="replace") as f:
            # Each line is "<index>:<name>".
            return [line.rstrip("\n").split(":", 1)[1] for line in f if ":" in line]
    except OSError:
        return []


def outputs(build_dir):
    """Each test's output in LastTest.log, by name."""
    path = os.path.join(build_dir, "Testing", "Temporary", "LastTest.log")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    found = {}
    # A test's record: '"<name>" start time: ...', 'Output:', a dashed rule, the output, then
    # '<end of output>'.
    pattern = re.compile(r'^"([^\n]*)" start time:[^\n]*\nOutput:\n-{20,}\n(.*?)<end of output>', re.S | re.M)
    for m in pattern.finditer(text):
        found[m.group(1)] = m.group(2)
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=25)
    parser.add_argument("--since", type=float, default=0.0)
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    any_failed = False
    for build_dir in args.dirs:
        names = failed_names(build_dir, args.since)
        if not names:
            continue
        any_failed = True
        print(f"==== failed in {build_dir}: {len(names)}")
        for name in names:
            print(f"  {name}")
        found = outputs(build_dir)
        for name in names:
            lines = found.get(name, "(no output recorded)\n").rstrip("\n").split("\n")
            print(f"---- {name} (last {min(len(lines), args.lines)} of {len(lines)} lines)")
            for line in lines[-args.lines:]:
                print(f"  | {line[:300]}")
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
