#!/usr/bin/env python3
"""Checks that the docs' links into the source land where they say.

A link such as [`Reducer::launch`](../nanoddp/comm/reducer.cpp#L166) in docs/*.md (or
(nanoddp/...#L166) in README.md) must name a file that exists and a line that exists; when the
link text is code (in backticks), that line must contain it as a whole token — the part after the last
`::`, and without a trailing "(...)". So when code moves, the test names the stale link instead of the
guide silently pointing at the wrong line.

Usage: check_source_links.py SOURCE_DIR   (exit 1 and one line per broken link)
"""
import pathlib
import re
import sys

LINK = re.compile(r"\[([^\]]+)\]\(([^)#\s]+)#L(\d+)\)")


def key_of(label):
    code = label.strip()
    if not (code.startswith("`") and code.endswith("`")):
        return None
    code = code[1:-1]
    if code.endswith("(...)"):
        code = code[: -len("(...)")]
    return code.split("::")[-1] if "::" in code and "(" not in code.split("::")[-1] else code


def contains(line, key):
    # As a whole token: `launch` must not match "launched", nor `run` "run_allreduce".
    return re.search(r"(?<![A-Za-z0-9_])" + re.escape(key) + r"(?![A-Za-z0-9_])", line) is not None


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    docs = sorted((root / "docs").glob("*.md")) + [root / "README.md"]
    problems, checked = [], 0
    for doc in docs:
        for number, text in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for match in LINK.finditer(text):
                label, target, line = match.group(1), match.group(2), int(match.group(3))
                where = f"{doc.relative_to(root)}:{number}: [{label}]({target}#L{line})"
                path = (doc.parent / target).resolve()
                checked += 1
                if not path.is_file():
                    problems.append(f"{where}: no such file {path}")
                    continue
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
                if line < 1 or line > len(lines):
                    problems.append(f"{where}: the file has {len(lines)} lines")
                    continue
                key = key_of(label)
                if key is not None and not contains(lines[line - 1], key):
                    near = [n for n in range(max(1, line - 40), min(len(lines), line + 40) + 1)
                            if contains(lines[n - 1], key)]
                    near.sort(key=lambda n: abs(n - line))
                    hint = f" (nearest match: line {near[0]})" if near else ""
                    problems.append(f"{where}: line {line} does not contain '{key}'{hint}: "
                                    f"{lines[line - 1].strip()!r}")
    for p in problems:
        print(p)
    print(f"{checked} source links checked, {len(problems)} broken")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
