"""Makes optim_fixtures.json: a few steps of torch.optim SGD / Adam / AdamW on two small
parameters with fixed gradients, for tests/optim/optimizer_test.cc.

Run with Debian's PyTorch:  /usr/bin/python3 tests/optim/make_fixtures.py
"""
import json
import os

import torch

STEPS = 4
SHAPES = {"0.weight": [3, 4], "0.bias": [3]}

CASES = [
    ("sgd_plain", "sgd", dict(lr=0.1)),
    ("sgd_momentum", "sgd", dict(lr=0.05, momentum=0.9)),
    ("sgd_dampening_wd", "sgd", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    ("sgd_nesterov_wd", "sgd", dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.05)),
    ("adam", "adam", dict(lr=0.01)),
    ("adam_wd", "adam", dict(lr=0.003, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", "adamw", dict(lr=0.01, weight_decay=0.05)),
]


def main():
    gen = torch.Generator().manual_seed(1234)
    init = {name: torch.randn(shape, generator=gen) for name, shape in SHAPES.items()}
    grads = [{name: torch.randn(shape, generator=gen) for name, shape in SHAPES.items()}
             for _ in range(STEPS)]
    cases = []
    for case_name, kind, options in CASES:
        params = {name: value.clone().requires_grad_(True) for name, value in init.items()}
        ctor = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
        opt = ctor(list(params.values()), **options)
        expected = []
        for step in range(STEPS):
            for name, p in params.items():
                p.grad = grads[step][name].clone()
            opt.step()
            expected.append({name: p.detach().flatten().tolist() for name, p in params.items()})
        opts = dict(options)
        if "betas" in opts:
            opts["beta1"], opts["beta2"] = opts.pop("betas")
        cases.append({"name": case_name, "kind": kind, "options": opts, "expected": expected})
    fixture = {
        "shapes": SHAPES,
        "init": {name: value.flatten().tolist() for name, value in init.items()},
        "grads": [{name: g.flatten().tolist() for name, g in step.items()} for step in grads],
        "cases": cases,
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_fixtures.json")
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
