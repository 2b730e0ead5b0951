#!/usr/bin/python3
"""DDP of torchvision's resnet18 over kolo against gloo with more ranks than CPUs, in one
invocation: 4 ranks (default) left to the scheduler on this machine's CPUs, synthetic
CIFAR-shaped data (3x32x32, 10 classes), global batch 32, SGD with momentum, one intra-op thread
per rank. Each round runs gloo, then every kolo_torch build given (--kolo DIR, a folder that
holds the kolo_torch package: a build before and after a change), and prints samples/s and the
load average; the summary is the median over rounds of each build's samples/s over gloo's."""
import argparse
import datetime
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from torch_backend import run  # noqa: E402  (spawns the ranks; bench/torch_backend.py)


def ddp_worker(rank, world, port, backend, package, steps, q):
    if package:
        sys.path.insert(0, package)
        import kolo_torch  # noqa: F401
    import torch.nn as nn
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(0)
    model = DDP(torchvision.models.resnet18(num_classes=10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    per_rank = 32 // world
    x, y = torch.rand(per_rank, 3, 32, 32), torch.randint(0, 10, (per_rank,))
    warm = 3
    for step in range(steps + warm):
        if step == warm:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    dist.destroy_process_group()
    if rank == 0:
        q.put(steps * 32 / elapsed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kolo", action="append", required=True,
                    help="LABEL=DIR: a folder holding a kolo_torch package (repeat for before/after)")
    a = ap.parse_args()
    builds = [k.split("=", 1) for k in a.kolo]
    print(f"# {datetime.datetime.utcnow():%F %H:%M} UTC, {os.cpu_count()} CPUs, {a.ranks} ranks, resnet18, "
          f"global batch 32, {a.steps} timed steps, torch {torch.__version__}", flush=True)
    ratios = {label: [] for label, _ in builds}
    for r in range(a.rounds):
        gloo = run(ddp_worker, a.ranks, "gloo", None, a.steps)
        line = f"round {r + 1}: load {os.getloadavg()[0]:.1f}, gloo {gloo:.1f} samples/s"
        for label, package in builds:
            kolo = run(ddp_worker, a.ranks, "kolo", package, a.steps)
            ratios[label].append(kolo / gloo)
            line += f", kolo {label} {kolo:.1f} ({kolo / gloo:.2f}x gloo)"
        print(line, flush=True)
    for label, values in ratios.items():
        print(f"kolo {label}: median {statistics.median(values):.2f}x gloo's samples/s over {a.rounds} rounds "
              f"({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
