"""DistributedDataParallel over backend "kolo" on 2 ranks: the same weights as DDP over gloo
after the same steps (one job, a gloo sub-group beside kolo's default group), and DDP's
communication hooks (fp16 compression, PowerSGD) train over kolo with ranks in agreement."""
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402

STEPS = 12


def worker():
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP
    import kolo_torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("kolo", timeout=datetime.timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))

    gen = torch.Generator().manual_seed(100 + r)  # each rank its own shard
    x = torch.randn(32, 784, generator=gen)
    data = [(x, x[:, :10].argmax(1))] * STEPS  # one batch per rank, learnt over the steps

    def train(group, hook=None, state=None):
        model = DDP(make(), process_group=group)
        if hook is not None:
            model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.cat([p.detach().reshape(-1) for p in model.module.parameters()]), losses

    initial = torch.cat([p.detach().reshape(-1) for p in make().parameters()])

    def agree(name, flat):
        # Every rank holds the same weights (compared bit for bit through kolo's all_gather).
        outs = [torch.empty_like(flat) for _ in range(n)]
        dist.all_gather(outs, flat)
        for k in range(n):
            assert torch.equal(outs[k], flat), f"{name}: rank {k}'s weights differ from rank {r}'s"

    w_kolo, l_kolo = train(None)
    w_gloo, l_gloo = train(gloo)
    moved = (w_kolo - initial).abs().max().item()
    assert moved > 1e-3, f"training did not change the weights (max change {moved})"
    diff = (w_kolo - w_gloo).abs().max().item()
    assert torch.allclose(w_kolo, w_gloo, rtol=1e-5, atol=1e-6), f"kolo vs gloo weights differ by {diff}"
    agree("plain DDP", w_kolo)
    print(f"rank {r}: DDP kolo == gloo after {STEPS} steps (max |diff| {diff:.3g}; loss {l_kolo[0]:.4f} -> "
          f"{l_kolo[-1]:.4f}, gloo {l_gloo[-1]:.4f})", flush=True)

    w_fp16, l_fp16 = train(None, default_hooks.fp16_compress_hook, None)
    w_fp16_gloo, _ = train(gloo, default_hooks.fp16_compress_hook, gloo)
    assert torch.allclose(w_fp16, w_fp16_gloo, rtol=1e-4, atol=1e-5), "fp16 hook: kolo vs gloo weights differ"
    agree("fp16 hook", w_fp16)
    assert l_fp16[-1] < l_fp16[0], f"fp16 hook: loss did not fall ({l_fp16[0]} -> {l_fp16[-1]})"
    print(f"rank {r}: fp16_compress_hook over kolo == gloo; loss {l_fp16[0]:.4f} -> {l_fp16[-1]:.4f}", flush=True)

    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=3,
                                        random_seed=0)
    w_psgd, l_psgd = train(None, powerSGD_hook.powerSGD_hook, state)
    agree("PowerSGD", w_psgd)
    assert torch.isfinite(w_psgd).all() and l_psgd[-1] < l_psgd[0], f"PowerSGD: loss {l_psgd[0]} -> {l_psgd[-1]}"
    print(f"rank {r}: powerSGD_hook over kolo: ranks agree; loss {l_psgd[0]:.4f} -> {l_psgd[-1]:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker()
    else:
        ranks.require_all_ok(ranks.launch(os.path.abspath(__file__), 2, deadline_s=120), "DDP over kolo")
