#!/usr/bin/python3
"""torch_resnet.py -- the PyTorch twin of kolo's `--model resnet` (issue #42's definition,
module for module, so that state_dict keys equal kolo's tensor names), and what bench/resnet.sh
needs from PyTorch (its step time and DDP's samples/s come from torch_single_step.py and
torch_ddp_fmnist.py, which build this model):

  init OUT.safetensors [--seed S]        the initial state (weights and buffers) after
                                         torch.manual_seed(S), for kolo train --init
  steps --init F --out OUT [--steps N --batch B --lr LR --momentum M --ranks R --sync-bn
        --double]                        N SGD steps in file order from F on the first N*B
                                         training images (one process, or R DDP ranks over
                                         gloo, each its B/R rows; --double: in f64), the final
                                         state to OUT
  compare A B                            the worst relative difference of two state files
                                         (max |a - b| / max |b| per tensor), and its tensor

Usage: /usr/bin/python3 bench/peers/torch_resnet.py COMMAND ...
"""
import argparse
import json
import os
import socket
import struct
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fmnist_common import load_fmnist  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(s, cin, cout, stride):
        super().__init__()
        s.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False); s.bn1 = nn.BatchNorm2d(cout)
        s.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False); s.bn2 = nn.BatchNorm2d(cout)
        s.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            s.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(s, x):
        y = F.relu(s.bn1(s.conv1(x)))
        return F.relu(s.bn2(s.conv2(y)) + s.shortcut(x))


class ResNet(nn.Module):
    def __init__(s):
        super().__init__()
        s.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False); s.bn1 = nn.BatchNorm2d(16)
        s.layer1 = BasicBlock(16, 16, 1); s.layer2 = BasicBlock(16, 32, 2); s.layer3 = BasicBlock(32, 64, 2)
        s.fc = nn.Linear(64, 10)

    def forward(s, x):
        x = x.reshape(-1, 1, 28, 28)  # kolo's samples are 784 pixels / 255
        x = s.layer3(s.layer2(s.layer1(F.relu(s.bn1(s.conv1(x))))))
        return s.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def save_state(path, state):
    header, blobs, offset = {}, [], 0
    for name, tensor in state.items():
        t = tensor.detach().contiguous()
        kind = "I64" if t.dtype == torch.int64 else "F32"
        data = (t if kind == "I64" else t.to(torch.float32)).numpy().tobytes()
        header[name] = {"dtype": kind, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


def load_state(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64, "F64": np.float64}[entry["dtype"]]
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"])
    return out


def first_rows(n):
    x, y = load_fmnist("train")
    return torch.from_numpy(x[:n].copy()), torch.from_numpy(y[:n].copy())


def train_steps(model, x, y, args, rank=0, ranks=1):
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    share = args.batch // ranks
    for step in range(args.steps):
        lo = step * args.batch + rank * share
        opt.zero_grad()
        F.cross_entropy(model(x[lo:lo + share]), y[lo:lo + share]).backward()
        opt.step()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps_rank(rank, args, port):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    model = ResNet()
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in load_state(args.init).items()})
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = DDP(model)
    x, y = first_rows(args.steps * args.batch)
    train_steps(ddp, x, y, args, rank, args.ranks)
    if rank == 0:
        save_state(args.out, model.state_dict())
    dist.destroy_process_group()


def cmd_init(args):
    torch.manual_seed(args.seed)
    save_state(args.out, ResNet().state_dict())


def cmd_steps(args):
    torch.set_num_threads(1)
    if args.ranks > 1:
        import torch.multiprocessing as mp
        mp.spawn(steps_rank, args=(args, free_port()), nprocs=args.ranks)
        return
    model = ResNet()
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in load_state(args.init).items()})
    x, y = first_rows(args.steps * args.batch)
    if args.double:  # the reference both f32 runs round away from
        model, x = model.double(), x.double()
    train_steps(model, x, y, args)
    save_state(args.out, model.state_dict())


def cmd_compare(args):
    a, b = load_state(args.a), load_state(args.b)
    assert sorted(a) == sorted(b), f"different names: {sorted(set(a) ^ set(b))}"
    worst, where = 0.0, ""
    for name in a:
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        rel = np.abs(x - y).max() / max(np.abs(y).max(), 1e-12)
        if rel > worst:
            worst, where = rel, name
    print(json.dumps({"worst_relative_difference": worst, "tensor": where, "tensors": len(a)}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init")
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("steps")
    p.add_argument("--init", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--sync-bn", action="store_true")
    p.add_argument("--double", action="store_true", help="in f64 (one process)")
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    args = ap.parse_args()
    {"init": cmd_init, "steps": cmd_steps, "compare": cmd_compare}[args.command](args)


if __name__ == "__main__":
    main()
