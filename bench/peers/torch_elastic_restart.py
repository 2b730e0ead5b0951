#!/usr/bin/python3
"""torchrun's elastic restart, reproduced for bench/elastic.sh: Debian's torchrun (PyTorch
1.13 under Python 3.11) fails at start (AttributeError in elastic/multiprocessing/api.py
to_map, whatever --redirects/--tee say), so this agent does what its LocalElasticAgent does
with --max_restarts 1: start every worker, poll them every --monitor-interval seconds
(torchrun's default 5), and when one has failed stop all the others (SIGTERM), start them
all again with a new rendezvous, and let them reload the last checkpoint (written by rank 0
after every epoch, as the torchrun recipe does). Workers train the DDP (gloo) mlp on the
first --samples Fashion-MNIST images, global batch --batch, for --steps steps; launch rank
--kill-rank SIGKILLs itself before step --kill-step in the first attempt. Prints one JSON
line: the time from the kill to the next completed step (recovery_s), from the kill to the
agent seeing it (detect_s), and the steps done again (steps_redone: completed before the
kill, after the checkpoint that was reloaded).
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def read_idx(path):
    import gzip
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def worker(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    rank, world, attempt = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["ATTEMPT"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=world)
    x = read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))[:a.samples]
    y = read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))[:a.samples]
    X = torch.from_numpy(x.reshape(x.shape[0], -1).astype(np.float32) / np.float32(255.0))
    Y = torch.from_numpy(y.astype(np.int64))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                              nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    checkpoint = os.path.join(a.dir, "checkpoint.pt")
    if os.path.exists(checkpoint):  # every rank reloads the last checkpoint
        state = torch.load(checkpoint)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    local = a.batch // world
    per_epoch = a.samples // a.batch
    log = open(os.path.join(a.dir, "steps"), "a") if rank == 0 else None
    while step < a.steps:
        if attempt == 0 and rank == a.kill_rank and step == a.kill_step:
            with open(os.path.join(a.dir, "kill"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator()
        g.manual_seed(1000 + step // per_epoch)
        perm = torch.randperm(a.samples, generator=g)
        s = step % per_epoch
        idx = perm[s * a.batch + rank * local:s * a.batch + (rank + 1) * local]
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
        step += 1
        if log:
            log.write(f"{attempt} {step} {time.time()!r}\n")
            log.flush()
        if rank == 0 and step % per_epoch == 0:
            tmp = checkpoint + ".tmp"
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, checkpoint)
    dist.destroy_process_group()


def start_all(a, attempt):
    port = free_port()  # a new rendezvous per attempt
    procs = []
    for rank in range(a.nprocs):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(a.nprocs), MASTER_PORT=str(port),
                   ATTEMPT=str(attempt), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"] + sys.argv[1:], env=env))
    return procs


def agent(a):
    attempt, restarts = 0, 0
    procs = start_all(a, attempt)
    detected = None
    while True:
        time.sleep(a.monitor_interval)
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            break
        if any(c not in (None, 0) for c in codes):
            detected = detected or time.time()
            if restarts == a.max_restarts:
                raise SystemExit(f"torch_elastic_restart: workers failed after {restarts} restart(s)")
            for p in procs:  # stop the whole group, as the agent does
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            restarts += 1
            attempt += 1
            procs = start_all(a, attempt)
    return detected


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--samples", type=int, default=120)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--kill-step", type=int, default=15)
    ap.add_argument("--monitor-interval", type=float, default=5.0)
    ap.add_argument("--max-restarts", type=int, default=1)
    ap.add_argument("--dir", default="")
    ap.add_argument("--data", default=os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    with tempfile.TemporaryDirectory() as d:
        if not a.dir:
            a.dir = d
            sys.argv += ["--dir", d]
        detected = agent(a)
        kill = float(open(os.path.join(a.dir, "kill")).read())
        rows = [line.split() for line in open(os.path.join(a.dir, "steps"))]
        before = max(int(s) for att, s, _ in rows if att == "0")  # steps completed before the kill
        after = [(int(s), float(t)) for att, s, t in rows if att != "0"]
        first_step, first_time = min(after)
        print(json.dumps({"peer": "torch_elastic_restart", "monitor_interval": a.monitor_interval,
                          "kill_rank": a.kill_rank, "kill_step": a.kill_step,
                          "detect_s": round(detected - kill, 3),
                          "recovery_s": round(first_time - kill, 3),
                          "steps_redone": before - (first_step - 1)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
