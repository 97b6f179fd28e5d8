"""The research ops of engine/functional.h against PyTorch (tests/engine/torch_ops.sh).

Reads the cases nanoddp wrote (inputs, output, gradients of sum(weights * output)), evaluates
each with torch in float64 on the same float32 inputs, and requires agreement to float32
rounding: |nanoddp - torch| <= 2e-5 * (1 + |torch|) for outputs and gradients.
"""
import json
import sys

import torch
import torch.nn.functional as F


def evaluate(case, xs):
    op, a = case["op"], case["args"]
    if op in ("mul", "div", "add", "sub"):
        return getattr(torch, op)(xs[0], xs[1])
    if op in ("neg", "exp", "log", "sqrt", "tanh", "sigmoid"):
        return getattr(torch, op)(xs[0])
    if op == "pow":
        return torch.pow(xs[0], a["exponent"])
    if op == "clamp":
        return torch.clamp(xs[0], a["min"], a["max"])
    if op == "transpose":
        return xs[0].t()
    if op == "narrow":
        return xs[0].narrow(a["dim"], a["start"], a["length"])
    if op == "cat":
        return torch.cat(xs, a["dim"])
    if op in ("sum", "mean"):
        return getattr(torch, op)(xs[0], a["dim"], keepdim=a["keepdim"])
    if op == "max":
        return torch.max(xs[0], a["dim"]).values
    if op == "embedding":
        index = torch.tensor(a["indices"], dtype=torch.int64).reshape(a["indices_shape"])
        return F.embedding(index, xs[0])
    if op == "softmax":
        return F.softmax(xs[0], a["dim"])
    if op == "log_softmax":
        return F.log_softmax(xs[0], a["dim"])
    if op == "cross_entropy":
        t = torch.tensor(a["targets"], dtype=torch.int64)
        return F.cross_entropy(xs[0], t, ignore_index=a["ignore_index"],
                               label_smoothing=a["label_smoothing"])
    if op == "layer_norm":
        return F.layer_norm(xs[0], xs[0].shape[-1:], xs[1], xs[2], eps=a["eps"])
    raise SystemExit(f"unknown op {op}")


def close(name, got, want):
    got = torch.tensor(got, dtype=torch.float64).reshape(-1)
    want = want.detach().reshape(-1)
    err = ((got - want).abs() / (1 + want.abs())).max().item() if want.numel() else 0.0
    if not err <= 2e-5:
        print(f"FAIL {name}: relative error {err:.3g}")
        return False
    return True


def main():
    cases = json.load(open(sys.argv[1]))
    ok = True
    for case in cases:
        xs = [torch.tensor(i["values"], dtype=torch.float32).to(torch.float64)
              .reshape(i["shape"]).requires_grad_(True) for i in case["inputs"]]
        y = evaluate(case, xs)
        ok &= list(y.shape) == case["output"]["shape"] or (
            print(f"FAIL {case['op']}: shape {list(y.shape)} vs {case['output']['shape']}") and False)
        ok &= close(case["op"] + " output", case["output"]["values"], y)
        w = torch.tensor(case["weights"], dtype=torch.float64).reshape(y.shape)
        (y * w).sum().backward()
        for k, (x, g) in enumerate(zip(xs, case["grads"])):
            ok &= close(f"{case['op']} grad {k}", g, x.grad)
    print(f"{len(cases)} ops compared with torch {torch.__version__}: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
