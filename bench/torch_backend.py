#!/usr/bin/python3
"""torch.distributed over kolo vs gloo in one invocation: all_reduce (float32 sum, in place)
from 4 KiB to 64 MiB at each world size, timed as the anchors time gloo (barrier; t0;
all_reduce; t1; max over ranks; median), and DDP samples/s of the Fashion-MNIST MLP
(784-512-256-10) and CNN (bench/peers/torch_ddp_fmnist.py's: two 5x5 convolutions, 32 and 64
channels, max-pooling, 1024-128-10) on synthetic data of that shape, global batch 128, 2 ranks.
Rank i is bound to the i-th CPU it may use (modulo their count), as `kolo bench` and mpirun bind
ranks; --bind none leaves placement to the scheduler."""
import argparse
import datetime
import os
import socket
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def schedule(nbytes, quick):
    warm, iters = (20, 200) if nbytes <= 64 << 10 else (10, 100) if nbytes <= 1 << 20 else (3, 30) if nbytes <= 16 << 20 else (2, 20)
    return (warm, max(5, iters // 4)) if quick else (warm, iters)


def bind_rank(rank, bind):
    if bind == "core":
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})


def allreduce_worker(rank, world, port, backend, quick, bind, q):
    import kolo_torch  # noqa: F401
    bind_rank(rank, bind)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    rows = []
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        dist.all_reduce(t)
        assert t[0].item() == world, f"{backend}: wrong sum {t[0].item()}"
        t.zero_()
        warm, iters = schedule(nbytes, quick)
        for _ in range(warm):
            dist.all_reduce(t)
        times, dt = [], torch.zeros(1, dtype=torch.float64)
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            dt[0] = time.perf_counter() - t0
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            times.append(dt.item())
        times.sort()
        rows.append((nbytes, times[len(times) // 2]))
    dist.destroy_process_group()
    if rank == 0:
        q.put(rows)


def ddp_worker(rank, world, port, backend, model_name, steps, bind, q):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    import kolo_torch  # noqa: F401
    bind_rank(rank, bind)
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    if model_name == "cnn":
        net = nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(1024, 128), nn.ReLU(), nn.Linear(128, 10))
    else:
        net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    per_rank = 128 // world
    x, y = torch.rand(per_rank, 784), torch.randint(0, 10, (per_rank,))
    for step in range(steps + 20):
        if step == 20:
            t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    dist.destroy_process_group()
    if rank == 0:
        q.put(steps * 128 / elapsed)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(fn, world, *args):
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(fn, args=(world, free_port(), *args, q), nprocs=world, join=True, start_method="spawn")
    return q.get()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--quick", action="store_true", help="a quarter of the timed iterations")
    ap.add_argument("--ddp-steps", type=int, default=200, help="the MLP's DDP steps")
    ap.add_argument("--cnn-steps", type=int, default=60, help="the CNN's DDP steps")
    ap.add_argument("--ddp-only", action="store_true", help="only the DDP rows")
    ap.add_argument("--bind", choices=("core", "none"), default="core",
                    help="core: rank i on the i-th CPU this process may use (modulo their count); none: the scheduler's")
    a = ap.parse_args()
    if a.ddp_only:
        a.worlds = []
    print("| ranks | bytes | gloo µs | kolo µs | kolo/gloo time | gloo GB/s | kolo GB/s | bandwidth × |")
    print("|---|---|---|---|---|---|---|---|")
    for world in a.worlds:
        res = {b: dict(run(allreduce_worker, world, b, a.quick, a.bind)) for b in ("gloo", "kolo")}
        for nbytes in SIZES:
            g, k = res["gloo"][nbytes], res["kolo"][nbytes]
            print(f"| {world} | {nbytes} | {g * 1e6:.1f} | {k * 1e6:.1f} | {k / g:.3f} | {nbytes / g / 1e9:.2f} | "
                  f"{nbytes / k / 1e9:.2f} | {g / k:.1f} |", flush=True)
    print()
    for name, label, steps in (("mlp", "MLP 784-512-256-10", a.ddp_steps), ("cnn", "CNN", a.cnn_steps)):
        sps = {b: run(ddp_worker, 2, b, name, steps, a.bind) for b in ("gloo", "kolo")}
        print(f"DDP {label}, 2 ranks, global batch 128, {steps} steps: gloo {sps['gloo']:.0f} "
              f"samples/s, kolo {sps['kolo']:.0f} samples/s, kolo/gloo {sps['kolo'] / sps['gloo']:.2f}×", flush=True)


if __name__ == "__main__":
    main()
