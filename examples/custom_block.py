"""Train your own model with trirace: a custom block, pipeline x data parallel.

    python examples/custom_block.py             # 4 local processes: pp=2 x dp=2
    torchrun --nproc-per-node 4 examples/custom_block.py

Each layer is an nn.Module from one tensor to one tensor: the first takes token ids, the
last gives logits. `make_layer` is called on each rank for its own layers only, so a large
model is never built whole. It is defined at module level: local processes find it again
by importing this file (the training call stays under the __main__ guard).
"""

import torch
import torch.nn.functional as F
from torch import nn

import trirace

VOCAB, D, SEQ, LAYERS = 2048, 64, 32, 6


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, ids):
        return self.tok(ids)


class MixerBlock(nn.Module):
    """Causal token mixing by a learned lower-triangular matrix, then a gated MLP."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.mix = nn.Parameter(torch.randn(SEQ, SEQ) * 0.02)
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(2 * D, D)

    def forward(self, x):
        t = x.shape[1]
        x = x + torch.tril(self.mix[:t, :t]) @ self.norm1(x)
        a, b = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(a) * b)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, VOCAB, bias=False)

    def forward(self, x):
        return self.out(self.norm(x))


def make_layer(i: int) -> nn.Module:
    return Embed() if i == 0 else Head() if i == LAYERS - 1 else MixerBlock()


if __name__ == "__main__":
    model = trirace.LayerModel(make_layer, count=LAYERS, vocab_size=VOCAB, max_seq_len=SEQ,
                               tie=("0.tok.weight", f"{LAYERS - 1}.out.weight"))  # optional: tied table and head
    cfg = trirace.make_config(data="synthetic", pp=2, dp=2, steps=20, micro_batch_size=4, seq_len=SEQ,
                              optimizer="adamw", lr_schedule="cosine", warmup_steps=2)
    rows = trirace.train(cfg, model=model)  # stages balanced by each layer's measured time
    if rows:  # the reporting rank
        print(f"loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}")
