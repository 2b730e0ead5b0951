# torch's products on one thread, fp32, on the shapes bench/gemm_peak.cc times (the lm's linear
# layers at rows B*T and width C): one JSON line per product with the median GFLOP/s.
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
# Each linear layer of the lm (in features k, out features n), and the three products a step
# takes of it: the forward x W^T, the input gradient dY W and the weight gradient dY^T x.
for k, n in [(c, 3 * c), (c, c), (c, 4 * c), (4 * c, c), (c, 256)]:
    x = torch.rand(rows, k) * 2 - 1
    w = torch.rand(n, k) * 2 - 1
    dy = torch.rand(rows, n) * 2 - 1
    kinds = [("forward", lambda: torch.nn.functional.linear(x, w)),
             ("input_grad", lambda: torch.mm(dy, w)),
             ("weight_grad", lambda: torch.mm(dy.t(), x))]
    for kind, product in kinds:
        times = []
        for r in range(args.repeats + 5):
            start = time.perf_counter()
            product()
            if r >= 5:
                times.append(time.perf_counter() - start)
        times.sort()
        gflops = 2.0 * rows * k * n / times[len(times) // 2] / 1e9
        print(json.dumps({"bench": "torch_gemm", "kind": kind, "m": rows, "k": k, "n": n,
                          "gflops": round(gflops, 1)}))
