# torch.mm on one thread, fp32, on the shapes bench/gemm_peak.cc times (the lm's products at
# rows B*T and width C): one JSON line per shape with the median GFLOP/s.
import argparse
import json
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--rows", type=int, default=1024)
parser.add_argument("--width", type=int, default=128)
parser.add_argument("--repeats", type=int, default=50)
args = parser.parse_args()
torch.set_num_threads(1)
torch.manual_seed(1)
c, rows = args.width, args.rows
for k, n in [(c, 3 * c), (c, c), (c, 4 * c), (4 * c, c), (c, 256)]:
    a = torch.rand(rows, k) * 2 - 1
    b = torch.rand(k, n) * 2 - 1
    times = []
    for r in range(args.repeats + 5):
        start = time.perf_counter()
        torch.mm(a, b)
        if r >= 5:
            times.append(time.perf_counter() - start)
    times.sort()
    gflops = 2.0 * rows * k * n / times[len(times) // 2] / 1e9
    print(json.dumps({"bench": "torch_gemm", "m": rows, "k": k, "n": n, "gflops": round(gflops, 1)}))
