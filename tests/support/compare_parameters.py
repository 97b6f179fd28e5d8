#!/usr/bin/env python3
"""Compares two safetensors files of float32 tensors: the same names and shapes, and every
tensor within a relative tolerance of the other (max |a - b| / max |a|), every value finite.
Exits 0 when they match, 1 with the worst tensor named when not. Only the standard library: no
numpy needed.

    compare_parameters.py A B TOLERANCE
"""
import json
import math
import struct
import sys
from array import array


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {info['dtype']}, not F32")
        start, end = info["data_offsets"]
        values = array("f")
        values.frombytes(blob[8 + n + start : 8 + n + end])
        tensors[name] = (info["shape"], values)
    return tensors


def main():
    a_path, b_path, tolerance = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a, b = load(a_path), load(b_path)
    if a.keys() != b.keys():
        sys.exit(f"different tensors: {sorted(a.keys() ^ b.keys())}")
    worst, worst_name = 0.0, ""
    for name, (shape, values) in a.items():
        if b[name][0] != shape:
            sys.exit(f"{name}: shape {shape} vs {b[name][0]}")
        # A NaN or an infinity is a mismatch, never a match: max() and `>` pass over a NaN
        # (max(0.0, nan) is 0.0, nan > x is false), and inf - inf is a NaN.
        for path, vs in ((a_path, values), (b_path, b[name][1])):
            bad = next((v for v in vs if not math.isfinite(v)), None)
            if bad is not None:
                print(f"{path}: {name} holds {bad}")
                sys.exit(1)
        scale = max(max(abs(v) for v in values), 1e-30)
        diff = max(abs(x - y) for x, y in zip(values, b[name][1])) / scale
        if not diff <= worst:
            worst, worst_name = diff, name
    print(f"largest relative difference {worst:.3g} ({worst_name or 'none'})")
    sys.exit(0 if worst <= tolerance else 1)


if __name__ == "__main__":
    main()
