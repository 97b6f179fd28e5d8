#!/usr/bin/env python3
"""Library messages name the library's options and API, never a program's command-line flags:
an embedding program has no `--device` or `--find-unused-parameters`; the programs translate
(nanoddp-train prefixes the flag that gave a value). Usage: check_library_flags.py SOURCE BIN_DIR

Reads the flags from `nanoddp-train --help` and `nanoddp-run --help`, then every string literal in
engine/ kernels/ nn/ comm/, and fails naming each literal that contains one of them."""
import pathlib
import re
import subprocess
import sys

source, bin_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
flags = set()
for program in ("nanoddp-train", "nanoddp-run"):
    text = subprocess.run([str(bin_dir / program), "--help"], capture_output=True, text=True,
                          check=True).stdout
    flags |= set(re.findall(r"^\s+(--[a-z][a-z0-9-]+)", text, re.M))
flags -= {"--help"}
assert len(flags) > 20, f"too few flags read from --help: {sorted(flags)}"
literal = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
problems = []
for layer in ("engine", "kernels", "nn", "comm"):
    for path in sorted((source / layer).rglob("*")):
        if path.suffix not in {".cpp", ".h", ".cu", ".cuh"}:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("//"):
                continue
            for text in literal.findall(line):
                for flag in re.findall(r"--[a-z][a-z0-9-]+", text):
                    if flag in flags:
                        problems.append(f"{path.relative_to(source)}:{number}: names {flag}: "
                                        f"{line.strip()}")
for p in problems:
    print(p)
print(f"{len(flags)} program flags; {len(problems)} library messages name one")
sys.exit(1 if problems else 0)
