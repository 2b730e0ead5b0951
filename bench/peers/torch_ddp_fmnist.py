#!/usr/bin/python3
"""PyTorch DDP (gloo, CPU) peer for bench/ddp_vs_torch.sh: trains the mlp, cnn or resnet on
Fashion-MNIST with global batch 128 split over --nprocs processes, one thread each, and
prints one JSON line with the steady-state global throughput (samples/s, first 20 steps
skipped) and, with --epochs, the test accuracy. Same recipe as kolo's peers' recipe:
SGD momentum 0.9, lr 0.05 (mlp, resnet) / 0.02 (cnn), per-epoch permutation seeded 1000+epoch.
The resnet's batch norms stay plain BatchNorm2d: PyTorch 1.13's SyncBatchNorm refuses CPU
modules ("SyncBatchNorm layers only work with GPU modules").
--slow-rank R:F (bench/balance.sh) makes rank R take F times its compute per step, as kolo's
--debug-slow-rank: it sleeps (F - 1) times its last step's time before each step.
"""
import argparse
import gzip
import json
import os
import socket
import sys
import time

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

LR = {"mlp": 0.05, "cnn": 0.02, "resnet": 0.05}
GLOBAL_BATCH = 128
SKIP = 20


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = x.reshape(x.shape[0], -1).astype(np.float32) / np.float32(255.0)
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def make_model(name):
    if name == "resnet":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_resnet import ResNet
        return ResNet()
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 32, 5), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10))


def worker(rank, world, port, a, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    X, Y = load(a.data, "train")
    torch.manual_seed(0)
    model = DDP(make_model(a.model))
    opt = torch.optim.SGD(model.parameters(), lr=LR[a.model], momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    local_b = GLOBAL_BATCH // world
    steps_per_epoch = X.shape[0] // GLOBAL_BATCH
    total = a.steps if a.steps else steps_per_epoch * a.epochs
    slow_rank, slow_factor = (int(a.slow_rank.split(":")[0]), float(a.slow_rank.split(":")[1])) \
        if a.slow_rank else (-1, 1.0)
    sleep = 0.0
    step, t_mark, epoch = 0, None, 0
    dist.barrier()
    while step < total:
        epoch += 1
        g = torch.Generator()
        g.manual_seed(1000 + epoch)
        perm = torch.randperm(X.shape[0], generator=g)
        for s in range(min(steps_per_epoch, total - step)):
            if step == SKIP:
                t_mark = time.perf_counter()
            idx = perm[s * GLOBAL_BATCH + rank * local_b:s * GLOBAL_BATCH + (rank + 1) * local_b]
            if rank == slow_rank:
                time.sleep(sleep)
            t_compute = time.perf_counter()
            opt.zero_grad()
            lossf(model(X[idx]), Y[idx]).backward()
            opt.step()
            # The slow rank is the last to reach each all-reduce: its step is its compute.
            sleep = (slow_factor - 1.0) * (time.perf_counter() - t_compute)
            step += 1
    elapsed = time.perf_counter() - t_mark
    if rank == 0:
        rec = {"peer": "torch_ddp", "model": a.model, "np": world, "steps": total,
               "samples_per_s": round((total - SKIP) * GLOBAL_BATCH / elapsed, 1)}
        if a.epochs and not a.steps:
            XT, YT = load(a.data, "test")
            with torch.no_grad():
                rec["test_accuracy"] = round(
                    (model.module(XT).argmax(1) == YT).float().mean().item(), 4)
        q.put(rec)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn", "resnet"])
    ap.add_argument("--nprocs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--slow-rank", default="", help="R:F rank R takes F times its compute")
    ap.add_argument("--data", default=os.environ.get("FMNIST_DIR",
                                                      "/usr/share/datasets/fashion-mnist"))
    a = ap.parse_args()
    if a.epochs:
        a.steps = 0
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(worker, args=(a.nprocs, port, a, q), nprocs=a.nprocs, join=True,
                       start_method="spawn")
    print(json.dumps(q.get()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
