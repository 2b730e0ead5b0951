#!/usr/bin/python3
"""PyTorch twin of kolo's `lm` (include/kolo/nn/language_model.h) and its file-order batches,
shared by tests/fixtures/make_golden_lm.py (the golden fixture) and bench/lm_vs_torch.sh (run
as a program: the step time of AdamW training on one thread, one JSON line).

The twin has kolo's parameter names, so a state_dict maps onto kolo's namedParameters():
  0            tok (Embedding V x C) + pos (Embedding T x C) of positions 0..T-1
  1 .. L       pre-LN blocks: x + attn(ln1(x)), then + mlp(ln2(.)); attn = qkv Linear(C, 3C)
               (q, k, v the thirds in that order, H heads of C/H), causal softmax(q k^T /
               sqrt(C/H)) v, proj Linear(C, C); mlp = Linear(C, 4C), exact (erf) GELU,
               Linear(4C, C)
  L+1          final LayerNorm(C) (eps 1e-5)
  L+2          head Linear(C, V) without bias (untied)
Loss: mean cross-entropy over all B*T positions. With --arch llama (--kv-heads K) the model
is the twin of `lm --arch llama` instead (bench/peers/torch_llama.py).

Usage: /usr/bin/python3 bench/peers/torch_lm.py [--layers L] [--d-model C] [--heads H]
         [--seq-len T] [--batch B] [--warmup W] [--steps N] [--data FILE] [--precision bf16]
         [--ranks N] [--arch gpt|llama] [--kv-heads K]
(bf16: forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), f32 weights;
--ranks N: N processes under DistributedDataParallel over gloo, rank r training on rows
r*B/N ... (r+1)*B/N - 1 of each global batch of B, one thread each; rank 0 prints)
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
VOCAB = 256


class TokenPositionEmbedding(nn.Module):
    def __init__(self, vocab, dim, max_len):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)

    def forward(self, ids):  # (B, T) -> (B, T, C)
        t = ids.shape[1]
        return self.tok(ids) + self.pos(torch.arange(t, device=ids.device))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, max_len):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        h, hd = self.heads, c // self.heads
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, h, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(b, t, h, hd).transpose(1, 2)
        v = v.view(b, t, h, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, H, T, T)
        att = att.masked_fill(~self.causal[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class TransformerBlock(nn.Module):
    def __init__(self, dim, heads, max_len):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, max_len)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def make_lm(layers, dim, heads, seq_len, vocab=VOCAB):
    """The twin of makeLanguageModel: children 0 .. L+2 as in kolo."""
    blocks = [TransformerBlock(dim, heads, seq_len) for _ in range(layers)]
    return nn.Sequential(TokenPositionEmbedding(vocab, dim, seq_len), *blocks, nn.LayerNorm(dim),
                         nn.Linear(dim, vocab, bias=False))


def training_bytes(path):
    """The training part of ByteCorpus (heldOutFraction 0.1): all but the last
    max(floor(0.1 n), T + 1) bytes; the minimum never binds for the texts used here."""
    data = open(path, "rb").read()
    return data[:len(data) - int(len(data) * 0.1)]


def file_order_batch(part, step, batch, seq_len):
    """ByteCorpus::fileOrderBatch: row i of step s is the window starting at byte
    ((s mod E) * B + i) * T of the part, E = ((len - 1) // T) // B steps per epoch."""
    windows = (len(part) - 1) // seq_len
    assert windows >= batch, "text too short for a batch"
    first = step % (windows // batch) * batch
    rows = [part[(first + i) * seq_len:(first + i) * seq_len + seq_len + 1] for i in range(batch)]
    ids = torch.tensor([list(r) for r in rows], dtype=torch.int64)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def lm_loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def train(rank, args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.arch == "llama":
        from torch_llama import make_llama
        model = make_llama(args.layers, args.d_model, args.heads, args.kv_heads, args.seq_len)
    else:
        model = make_lm(args.layers, args.d_model, args.heads, args.seq_len)
    parameters = sum(p.numel() for p in model.parameters())
    if args.ranks > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
        # The causal masks are constant bool buffers, which gloo cannot broadcast.
        DDP = torch.nn.parallel.DistributedDataParallel
        DDP._set_params_and_buffers_to_ignore_for_model(
            model, [name for name, _ in model.named_buffers() if name.endswith("causal")])
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    part = training_bytes(args.data)
    rows = args.batch // args.ranks
    times, loss = [], None
    for step in range(args.warmup + args.steps):
        x, y = file_order_batch(part, step, args.batch, args.seq_len)
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if step >= args.warmup:
            times.append(1000.0 * (t1 - t0))
    if rank == 0:
        print(json.dumps({"bench": "torch_lm_step", "ranks": args.ranks, "precision": args.precision,
                          "arch": args.arch,
                          "layers": args.layers, "d_model": args.d_model,
                          "heads": args.heads, "seq_len": args.seq_len, "batch": args.batch,
                          "parameters": parameters,
                          "steps": args.steps, "step_ms_median": round(median(times), 3),
                          "step_ms_min": round(min(times), 3), "final_loss": round(loss.item(), 4)}),
              flush=True)
    if args.ranks > 1:
        torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--data", default=DEFAULT_TEXT)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--arch", default="gpt", choices=["gpt", "llama"])
    ap.add_argument("--kv-heads", type=int, default=0)
    args = ap.parse_args()
    assert args.batch % args.ranks == 0, "--batch must split evenly over --ranks"
    if args.ranks == 1:
        train(0, args)
        return
    import os
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    mp.spawn(train, args=(args,), nprocs=args.ranks)


if __name__ == "__main__":
    main()
