#!/usr/bin/python3
"""nanoddp-train --task classify against PyTorch, number for number (driven by
classify_parity.sh).

  classify_parity.py prepare DIR   data (X.npy, int64 Y.npy and the same labels as int32
                                   Y32.npy), PyTorch's init (init.safetensors) and PyTorch's
                                   cross-entropy runs: parameters after STEPS steps, and the loss
                                   and train accuracy of every step
  classify_parity.py compare DIR RUN OPTIMIZER
                                   RUN.safetensors and RUN.jsonl (nanoddp-train --save/--metrics)
                                   against PyTorch's OPTIMIZER run; exit 1 on a mismatch

The model and the bound are pytorch_parity.py's, with K = 5 outputs and F.cross_entropy.
"""
import json
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import pytorch_parity as base  # noqa: E402  (Net, safetensors I/O, the bound)

IN, HIDDEN, K, N, BATCH, STEPS = 16, 32, 5, 256, 32, 16
base.IN, base.HIDDEN, base.OUT = IN, HIDDEN, K
CONFIGS = {
    "sgd": dict(cls=torch.optim.SGD, kwargs=dict(lr=0.1, momentum=0.9)),
    "adamw": dict(cls=torch.optim.AdamW, kwargs=dict(lr=0.01, weight_decay=0.01)),
}
TOLERANCE = base.TOLERANCE
worst_of = base.worst_of


def prepare(d):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N, IN)).astype(np.float32)
    y = np.argmax(x @ rng.standard_normal((IN, K)).astype(np.float32), axis=1).astype(np.int64)
    np.save(f"{d}/X.npy", x)
    np.save(f"{d}/Y.npy", y)
    np.save(f"{d}/Y32.npy", y.astype(np.int32))
    torch.manual_seed(3)
    init = base.Net().state_dict()
    base.write_safetensors(f"{d}/init.safetensors", init)
    for name, cfg in CONFIGS.items():
        model = base.Net()
        model.load_state_dict(init)
        opt = cfg["cls"](model.parameters(), **cfg["kwargs"])
        losses, accuracies = [], []
        for step in range(STEPS):
            b = (step * BATCH) % N
            opt.zero_grad()
            logits = model(torch.from_numpy(x[b:b + BATCH]))
            target = torch.from_numpy(y[b:b + BATCH])
            loss = torch.nn.functional.cross_entropy(logits, target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            accuracies.append((logits.argmax(1) == target).float().mean().item())
        np.savez(f"{d}/torch-{name}.npz", losses=np.array(losses),
                 accuracies=np.array(accuracies),
                 **{k: v.detach().numpy() for k, v in model.state_dict().items()})


def compare(d, run, optimizer):
    want = np.load(f"{d}/torch-{optimizer}.npz")
    got = base.read_safetensors(f"{d}/{run}.safetensors")
    names = sorted(k for k in want.files if k not in ("losses", "accuracies"))
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
    lines = [json.loads(line) for line in open(f"{d}/{run}.jsonl")]
    losses = [line["loss"] for line in lines]
    accuracies = [line.get("accuracy", -1.0) for line in lines]
    loss_error = worst_of(*(abs(a - b) / abs(b) for a, b in zip(losses, want["losses"])))
    if len(losses) != STEPS or not loss_error <= TOLERANCE:
        ok = False
        print(f"{run}: {len(losses)} losses, largest relative difference {loss_error:.3g}")
    # The arg-max of logits that agree to float rounding: equal, unless two logits of a row tie
    # to rounding (then one row of the step may flip).
    accuracy_error = worst_of(*(abs(a - b) for a, b in zip(accuracies, want["accuracies"])))
    if not accuracy_error <= 1.0 / BATCH + 1e-9:
        ok = False
        print(f"{run}: accuracies {accuracies}, PyTorch's {list(want['accuracies'])}")
    print(f"{run} vs PyTorch {optimizer}: parameters within {worst:.2e}, losses within "
          f"{loss_error:.2e} (bound {TOLERANCE:g}), accuracies within {accuracy_error:.3g}: "
          f"{'ok' if ok else 'MISMATCH'}")
    return ok


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        sys.exit(0 if compare(sys.argv[2], sys.argv[3], sys.argv[4]) else 1)
