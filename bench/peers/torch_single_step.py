#!/usr/bin/python3
"""PyTorch peer of bench/train_step.cc: one training step (zero_grad + forward + loss +
backward + SGD momentum 0.9) of the built-in mlp / cnn at batch 128 (or --batch B) on one
thread, on the first 1024 Fashion-MNIST training images cycled; warm-up 30 / 10, timed
300 / 40 steps.
Set OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 before starting (train_step.sh
does). Prints one JSON line per model with the median step time, and the median CPU time
of a step (the process's: on a machine shared with other work, it leaves out the waits for a core).
Usage: /usr/bin/python3 bench/peers/torch_single_step.py [--batch B] [mlp] [cnn]
"""
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp_fmnist import make_model, read_idx  # noqa: E402

FMNIST_DIR = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
WARM = {"mlp": 30, "cnn": 10, "resnet": 5}
STEPS = {"mlp": 300, "cnn": 40, "resnet": 20}
LR = {"mlp": 0.05, "cnn": 0.02, "resnet": 0.05}


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def main():
    torch.set_num_threads(1)
    args = sys.argv[1:]
    batch = 128
    if len(args) >= 2 and args[0] == "--batch":
        batch = int(args[1])
        args = args[2:]
    models = args or ["mlp", "cnn"]
    images = read_idx(os.path.join(FMNIST_DIR, "train-images-idx3-ubyte.gz"))[:1024]
    labels = read_idx(os.path.join(FMNIST_DIR, "train-labels-idx1-ubyte.gz"))[:1024]
    X = torch.from_numpy(images.reshape(1024, -1).astype(np.float32) / np.float32(255.0))
    Y = torch.from_numpy(labels.astype(np.int64))
    for name in models:
        torch.manual_seed(0)
        model = make_model(name)
        opt = torch.optim.SGD(model.parameters(), lr=LR[name], momentum=0.9)
        lossf = nn.CrossEntropyLoss()
        total, cpu = [], []
        for i in range(WARM[name] + STEPS[name]):
            j = i % (1024 // batch)
            xb, yb = X[batch * j:batch * (j + 1)], Y[batch * j:batch * (j + 1)]
            t0, c0 = time.perf_counter(), time.process_time()
            loss = lossf(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
            t1, c1 = time.perf_counter(), time.process_time()
            if i >= WARM[name]:
                total.append(t1 - t0)
                cpu.append(c1 - c0)
        print(json.dumps({"bench": "torch_train_step", "model": name, "batch": batch,
                          "threads": torch.get_num_threads(), "warmup": WARM[name],
                          "steps": STEPS[name], "step_ms_median": round(median(total) * 1e3, 3),
                          "step_ms_min": round(min(total) * 1e3, 3),
                          "cpu_ms_median": round(median(cpu) * 1e3, 3),
                          "final_loss": round(float(loss), 4)}), flush=True)


if __name__ == "__main__":
    main()
