#!/usr/bin/python3
"""PyTorch twin of kolo's `lm --arch llama` (include/kolo/nn/language_model.h,
include/kolo/nn/llama.h), written as torchtitan writes LLaMA, with kolo's parameter names so
that a state_dict maps onto kolo's:
  0            tok Embedding(V, C) ("0.weight"), tied to the head
  1 .. L       blocks: x + attn(attn_norm(x)), then + mlp(mlp_norm(.)); attn = q Linear(C, H d),
               k, v Linear(C, K d), o Linear(H d, C), all without bias, d = C / H; q and k
               rotated by RoPE (pairs (2i, 2i+1) as complex numbers times
               e^(i p theta^(-2i/d)), theta 10000); causal softmax(q k^T / sqrt(d)) v with
               query head h reading key/value head h // (H / K); mlp = down(silu(gate(x)) *
               up(x)), gate, up Linear(C, F), down Linear(F, C), no bias, F = the multiple of
               64 nearest 8C/3
  L+1          final RMSNorm(C) (eps 1e-5; weight "L+1.weight")
  L+2          the head: logits = x @ (0.weight)^T (tied; the state_dict names it
               "L+2.weight" too)
bench/peers/torch_lm.py --arch llama trains it; this module only defines it.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def swiglu_hidden(dim, multiple=64):
    return max(multiple, int(round(8 * dim / 3 / multiple)) * multiple)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, head_dim, theta=10000.0, offset=0):
    """x (B, T, H*d): pairs (2i, 2i+1) of each head rotated by angle p * theta^(-2i/d)."""
    b, t, width = x.shape
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(offset, offset + t, dtype=torch.float32), freqs)
    cis = torch.polar(torch.ones_like(angles), angles)  # (T, d/2)
    xc = torch.view_as_complex(x.float().reshape(b, t, width // head_dim, head_dim // 2, 2))
    return torch.view_as_real(xc * cis[None, :, None, :]).reshape(b, t, width).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, max_len):
        super().__init__()
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        d = self.head_dim
        q, k, v = rotary(self.q(x), d), rotary(self.k(x), d), self.v(x)
        q = q.view(b, t, -1, d).transpose(1, 2)  # (B, H, T, d)
        k = k.view(b, t, -1, d).transpose(1, 2)  # (B, K, T, d)
        v = v.view(b, t, -1, d).transpose(1, 2)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (B, H, T, T)
        att = F.softmax(att.masked_fill(~self.causal[:t, :t], float("-inf")), dim=-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, dim, heads, kv_heads, max_len):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, max_len)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, swiglu_hidden(dim))

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TiedHead(nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self.weight = embedding.weight  # one parameter

    def forward(self, x):
        return F.linear(x, self.weight)


def make_llama(layers, dim, heads, kv_heads, seq_len, vocab=256):
    """The twin of makeLanguageModel with arch llama: children 0 .. L+2 as in kolo."""
    embedding = nn.Embedding(vocab, dim)
    with torch.no_grad():
        embedding.weight.mul_(1.0 / math.sqrt(dim))  # kolo draws N(0, 1/C)
    blocks = [LlamaBlock(dim, heads, kv_heads or heads, seq_len) for _ in range(layers)]
    return nn.Sequential(embedding, *blocks, RMSNorm(dim), TiedHead(embedding))
