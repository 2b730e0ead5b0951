"""Starting a backend-"kolo" DDP script the ways users do: `kolo run -n 2 -- python3 ...`
(kolo's variables, mapped onto torch's by `import kolo_torch`) and torchrun (torch's
variables). Both runs must train and print the same final loss on every rank."""
import datetime
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402


def worker():
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    import kolo_torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("kolo", timeout=datetime.timedelta(seconds=30))
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 20, generator=torch.Generator().manual_seed(r))
    y = (x[:, 0] > 0).long()
    for _ in range(10):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    check = sum(p.detach().sum() for p in model.parameters()).reshape(1)
    dist.all_reduce(check, op=dist.ReduceOp.MAX)
    print(f"kolo_torch rank {r}/{n} launcher-ok weights-checksum {check.item():.6f}", flush=True)
    dist.destroy_process_group()


def lines_with(out, word):
    return [line for line in out.splitlines() if word in line]


def main():
    kolo = sys.argv[1] if len(sys.argv) > 1 else ""
    me = os.path.abspath(__file__)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    runs = {}
    if kolo:
        p = subprocess.run([kolo, "run", "-n", "2", "--", sys.executable, me, "--worker"], env=env,
                           capture_output=True, text=True, timeout=120)
        print(f"---- kolo run -n 2 (exit {p.returncode})\n{p.stdout}{p.stderr}")
        runs["kolo run"] = (p.returncode, p.stdout + p.stderr)
    else:
        print("no kolo binary given (first argument): `kolo run` not tried")
    with tempfile.TemporaryDirectory() as logs:
        # Debian's torchrun needs -r/-t/--log_dir under Python 3.11 (pytorch/pytorch#92319).
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--master_port", str(ranks.free_port()), "-r", "1", "-t", "1", "--log_dir", logs,
                            me, "--worker"], env=env, capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        for root, _, files in os.walk(logs):
            for f in files:
                with open(os.path.join(root, f), errors="replace") as fh:
                    out += fh.read()
        print(f"---- torchrun --nproc_per_node 2 (exit {p.returncode})\n{out}")
        runs["torchrun"] = (p.returncode, out)
    sums = set()
    for name, (rc, out) in runs.items():
        # torchrun's own output and its per-rank logs may both hold a rank's line.
        ok = {line[line.index("kolo_torch rank"):] for line in lines_with(out, "launcher-ok")}
        if rc != 0 or len(ok) != 2:
            print(f"FAIL: {name}: exit {rc}, {len(ok)} of 2 ranks finished")
            sys.exit(1)
        sums.update(line.split()[-1] for line in ok)
    if len(sums) != 1:
        print(f"FAIL: the launches disagree on the trained weights: {sorted(sums)}")
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker()
    else:
        main()
