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
skipped. Exit status 1 when a test failed for good, else 0.
"""
import argparse
import os
import re
import sys

# One attempt of one test in LastTest.log: "N/M Testing: <name>", ..., "Output:", a dashed rule,
# the output, "<end of output>", ..., "Test Passed." or "Test Failed." (or another status line).
ATTEMPT = re.compile(r"^\d+/\d+ Testing: ([^\n]*)\n.*?\nOutput:\n-{20,}\n(.*?)<end of output>\n"
                     r"Test time[^\n]*\n-{20,}\n([^\n]*)$", re.S | re.M)


def attempts(build_dir, since):
    """[(name, output, passed)] in the order ctest ran them; [] for a log from an earlier run."""
    path = os.path.join(build_dir, "Testing", "Temporary", "LastTest.log")
    try:
        if os.path.getmtime(path) < since:
            return []
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    return [(m.group(1), m.group(2), m.group(3).strip() != "Test Failed.")
            for m in ATTEMPT.finditer(text)]


def tail(output, lines):
    got = output.rstrip("\n").split("\n")
    return got[-lines:], len(got)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=25)
    parser.add_argument("--since", type=float, default=0.0)
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    any_failed = False
    for build_dir in args.dirs:
        runs = attempts(build_dir, args.since)
        last = {}  # name -> passed, from the name's last attempt
        first_failure = {}  # name -> the output of its first failed attempt
        for name, output, passed in runs:
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
    return 1 if any_failed else 0


if __name__ == "__main__":
    sys.exit(main())
