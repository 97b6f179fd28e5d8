#!/usr/bin/python3
"""nanoddp-train against PyTorch, number for number (driven by pytorch_parity.sh).

  pytorch_parity.py prepare DIR   data (X.npy, Y.npy), the starting parameters of PyTorch's own
                                  init (init.safetensors), and PyTorch's training runs: the
                                  parameters after STEPS steps and the loss of every step
  pytorch_parity.py compare DIR RUN OPTIMIZER
                                  RUN.safetensors and RUN.jsonl (nanoddp-train --save/--metrics)
                                  against PyTorch's OPTIMIZER run; exit 1 on a mismatch

The model is PyTorch's: a module whose `layers` is nn.Sequential(Linear, ReLU, Linear, ReLU,
Linear), so its state_dict names ("layers.0.weight", ...) are nanoddp's. Batches are taken in
order (nanoddp-train --no-shuffle). The GEMMs of the two engines add in different orders, so
results agree to float rounding, not bit for bit: the bound is relative to each tensor's size,
and a wrong formula (a momentum without dampening, a missing bias correction, a gradient
averaged twice) misses it by orders of magnitude.
"""
import json
import math
import struct
import sys

import numpy as np
import torch

IN, HIDDEN, OUT, N, BATCH, STEPS = 16, 32, 4, 256, 32, 16
CONFIGS = {
    "sgd": dict(cls=torch.optim.SGD, kwargs=dict(lr=0.05, momentum=0.9), act="relu"),
    "adamw": dict(cls=torch.optim.AdamW, kwargs=dict(lr=0.01, weight_decay=0.01), act="relu"),
    # nanoddp's GELU is the tanh form: PyTorch's GELU(approximate="tanh").
    "sgd-gelu": dict(cls=torch.optim.SGD, kwargs=dict(lr=0.05, momentum=0.9), act="gelu"),
}
TOLERANCE = 5e-6  # max |nanoddp - torch| / max |torch|, per tensor (measured: 1e-7 to 5e-7)


def worst_of(*errors):
    """The largest error, where NaN is worse than any number: max() keeps a NaN only when it
    comes first (max(0.0, nan) is 0.0), and `nan > bound` is false, so a NaN result would pass."""
    worst = 0.0
    for e in errors:
        if math.isnan(e):
            return math.nan
        worst = e if e > worst else worst
    return worst


class Net(torch.nn.Module):
    def __init__(self, act="relu"):
        super().__init__()
        make = (lambda: torch.nn.ReLU()) if act == "relu" else (
            lambda: torch.nn.GELU(approximate="tanh"))
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(IN, HIDDEN), make(), torch.nn.Linear(HIDDEN, HIDDEN), make(),
            torch.nn.Linear(HIDDEN, OUT))

    def forward(self, x):
        return self.layers(x)


def write_safetensors(path, tensors):
    """The format by hand (no safetensors package on Debian 12): header length, JSON, bytes."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(body[begin:end], dtype="<f4").reshape(info["shape"])
    return out


def prepare(d):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N, IN)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((IN, OUT)).astype(np.float32) / 4).astype(np.float32)
    np.save(f"{d}/X.npy", x)
    np.save(f"{d}/Y.npy", y)
    torch.manual_seed(3)
    init = Net().state_dict()
    write_safetensors(f"{d}/init.safetensors", init)
    for name, cfg in CONFIGS.items():
        model = Net(cfg["act"])
        model.load_state_dict(init)
        opt = cfg["cls"](model.parameters(), **cfg["kwargs"])
        losses = []
        for step in range(STEPS):
            b = (step * BATCH) % N
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x[b:b + BATCH])),
                                                torch.from_numpy(y[b:b + BATCH]))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        np.savez(f"{d}/torch-{name}.npz", losses=np.array(losses),
                 **{k: v.detach().numpy() for k, v in model.state_dict().items()})


def compare(d, run, optimizer):
    want = np.load(f"{d}/torch-{optimizer}.npz")
    got = read_safetensors(f"{d}/{run}.safetensors")
    names = sorted(k for k in want.files if k != "losses")
    ok = sorted(got) == names
    if not ok:
        print(f"{run}: tensors {sorted(got)}, PyTorch has {names}")
    worst = 0.0
    for name in names:
        if name not in got:
            continue
        error = float(np.abs(got[name] - want[name]).max() / np.abs(want[name]).max())
        worst = worst_of(worst, error)
        if not error <= TOLERANCE:  # a NaN (np.max keeps one) fails too
            ok = False
            print(f"{run}: {name} differs from PyTorch's by {error:.3g} of its largest value")
    # The loss nanoddp logs at step k is the loss of the batch the step trained on, as PyTorch's.
    losses = [json.loads(line)["loss"] for line in open(f"{d}/{run}.jsonl")]
    loss_error = worst_of(*(abs(a - b) / abs(b) for a, b in zip(losses, want["losses"])))
    if len(losses) != STEPS or not loss_error <= TOLERANCE:
        ok = False
        print(f"{run}: {len(losses)} losses, largest relative difference {loss_error:.3g}")
    print(f"{run} vs PyTorch {optimizer}: parameters within {worst:.2e}, losses within "
          f"{loss_error:.2e} (bound {TOLERANCE:g}): {'ok' if ok else 'MISMATCH'}")
    return ok


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        sys.exit(0 if compare(sys.argv[2], sys.argv[3], sys.argv[4]) else 1)
