"""A model of the user's own, for tests/test_custom_model.py: its own embedding, a block
unlike trirace's (causal mixing by a learned lower-triangular matrix, a gated MLP) and a
head, built by a factory. Workers import this file by the path LayerModel records."""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, D, SEQ, COUNT = 2048, 48, 32, 6


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, ids):
        return self.tok(ids)


class MixerBlock(nn.Module):
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
    return Embed() if i == 0 else Head() if i == COUNT - 1 else MixerBlock()


def make_bad_layer(i: int) -> nn.Module:
    """Layer 2 expects width 32 where the others pass 48: the shapes do not chain."""
    return nn.Linear(32, D) if i == 2 else make_layer(i)


def smoothed_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), label_smoothing=0.1)
