"""A small decoder-only transformer and its synthetic token data, for the training-step canary.

Imported only inside a worker (torch is passed in). Everything is fixed by a seed: the
weights are initialised on the CPU and then moved, and the tokens are drawn on the CPU, so
every device starts from the same bits. Attention is written out (matmul, causal mask,
softmax) rather than through fused kernels whose backward pass may be nondeterministic.

Data: a Markov chain over the vocabulary (the next token is a fixed permutation of the
previous one with probability 3/4, uniform otherwise), so the loss falls within a few
steps from ln(vocab) towards its entropy and a change to the numerics shows in it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    layers: int
    d_model: int
    heads: int
    seq_len: int
    batch: int
    vocab: int


def build(torch, shape: Shape, seed: int):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = shape.d_model
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, mask):
            b, t, d = x.shape
            h = shape.heads
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
            att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(shape.vocab, shape.d_model)
            self.pos = nn.Embedding(shape.seq_len, shape.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.ln = nn.LayerNorm(shape.d_model)
            self.head = nn.Linear(shape.d_model, shape.vocab, bias=False)
            self.register_buffer("mask", torch.ones(shape.seq_len, shape.seq_len, dtype=torch.bool).triu(1),
                                 persistent=False)

        def forward(self, idx, targets):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                x = blk(x, self.mask)
            logits = self.head(self.ln(x)).float()
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

    torch.manual_seed(seed)
    return TinyLM()


def batches(torch, shape: Shape, seed: int, count: int):
    """``count`` (inputs, targets) pairs of shape (batch, seq_len) from the Markov chain, on the CPU."""
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    perm = torch.randperm(shape.vocab, generator=g)
    out = []
    for _ in range(count):
        seq = torch.empty(shape.batch, shape.seq_len + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(shape.vocab, (shape.batch,), generator=g)
        noise = torch.randint(shape.vocab, (shape.batch, shape.seq_len), generator=g)
        keep = torch.rand(shape.batch, shape.seq_len, generator=g) < 0.75
        for i in range(shape.seq_len):
            seq[:, i + 1] = torch.where(keep[:, i], perm[seq[:, i]], noise[:, i])
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def params(model) -> int:
    return sum(p.numel() for p in model.parameters())
