#!/usr/bin/python3
"""Peer benchmark: torch.distributed's gloo all_reduce (float32, SUM, in place), timed as
`kolo bench allreduce --anchor-schedule` times kolo's, so the two can be compared.

Per size: one checked all_reduce (rank r contributes r+1; every element must equal
n(n+1)/2), the tensor zeroed, W warm-up operations, then I timed operations, each
    dist.barrier(); t0; dist.all_reduce(t); t1
with the per-operation time the maximum over ranks (reduced after t1). Reported: median,
min, p10, p90, max; algbw = bytes / median; busbw = algbw * 2(n-1)/n (GB = 1e9 bytes).
Same warm-up/iteration schedule as bench/peers/mpi_allreduce.c.

Usage: /usr/bin/python3 bench/peers/torch_allreduce.py --np 2 [--sizes 4096 1048576 ...]
The ranks are started here (torch.multiprocessing, spawn) and meet through a TCP store on
127.0.0.1; gloo uses the loopback interface. Output: one JSON object per size (rank 0).
"""
import argparse
import json
import os
import socket
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def schedule(nbytes):
    if nbytes <= 64 << 10:
        return 20, 200
    if nbytes <= 1 << 20:
        return 10, 100
    if nbytes <= 16 << 20:
        return 3, 30
    return 2, 20


def percentile(sorted_times, q):
    index = int(q * (len(sorted_times) - 1) + 0.5)
    return sorted_times[min(max(index, 0), len(sorted_times) - 1)]


def median(sorted_times):
    n = len(sorted_times)
    return sorted_times[n // 2] if n % 2 else 0.5 * (sorted_times[n // 2 - 1] + sorted_times[n // 2])


def measure(rank, world, nbytes):
    count = nbytes // 4
    data = torch.full((count,), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(data)
    good = torch.tensor([1 if bool((data == world * (world + 1) // 2).all()) else 0], dtype=torch.int32)
    dist.all_reduce(good, op=dist.ReduceOp.MIN)
    data.zero_()
    warmup, iters = schedule(nbytes)
    for _ in range(warmup):
        dist.all_reduce(data)
    elapsed = torch.zeros(1, dtype=torch.float64)
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(data)
        elapsed[0] = time.perf_counter() - start
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed[0]))
    times.sort()
    mid = median(times)
    algbw = nbytes / mid / 1e9
    return {
        "bench": "torch_allreduce", "impl": f"torch-{torch.__version__}-gloo", "np": world,
        "dtype": "f32", "op": "sum", "inplace": True, "bytes": nbytes, "count": count,
        "warmup": warmup, "iters": iters, "t_median_us": round(mid * 1e6, 3),
        "t_min_us": round(times[0] * 1e6, 3), "t_p10_us": round(percentile(times, 0.1) * 1e6, 3),
        "t_p90_us": round(percentile(times, 0.9) * 1e6, 3), "t_max_us": round(times[-1] * 1e6, 3),
        "algbw_GBps": round(algbw, 4), "busbw_GBps": round(algbw * 2 * (world - 1) / world, 4),
        "correct": bool(good.item()),
    }


def rank_main(rank, world, port, sizes, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = [measure(rank, world, nbytes) for nbytes in sizes]
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def unused_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of ranks")
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20], help="message sizes in bytes")
    args = parser.parse_args()
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(rank_main, args=(args.np, unused_port(), args.sizes, results), nprocs=args.np,
                       join=True, start_method="spawn")
    for row in results.get():
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
