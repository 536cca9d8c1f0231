"""One pipeline stage's layers and weights.

`versions` holds the weight buffers compute runs on: one for synchronous schedules, two for
2BW (W(t-1), used by step t, and W(t)). The optimizer owns a separate `master` copy of the
latest weights, so its state (Adam moments) belongs to parameters, not to buffers, and
publishing W(t+1) is a copy into the buffer whose version no step needs any more.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models import ModelSpec, build_layers, layer_names


class StageModel:
    def __init__(self, spec: ModelSpec, layers: range, seed: int, n_versions: int, optimizer: str,
                 lr: float, device: torch.device, sparse_embedding: bool = False):
        self.layers = layers
        self.is_first = layers.start == 0
        self.is_last = layers.stop == len(layer_names(spec))
        self.versions = [
            nn.Sequential(*build_layers(spec, seed, layers, sparse_embedding)).to(device)
            for _ in range(n_versions)
        ]
        self.master = [nn.Parameter(p.detach().clone()) for p in self.versions[0].parameters()]
        if optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(self.master, lr=lr)
        else:
            self.optimizer = torch.optim.SGD(self.master, lr=lr)

    def module(self, version: int) -> nn.Module:
        return self.versions[version % len(self.versions)]

    def grads(self, version: int) -> list[torch.Tensor]:
        """The gradients accumulated on a version's buffer, dense (a sparse embedding
        gradient is densified here; sparse exchange methods take it before this)."""
        out = []
        for p in self.module(version).parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                p.grad = p.grad.coalesce().to_dense()
            out.append(p.grad)
        return out

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], publish_version: int) -> None:
        """Apply averaged gradients to the master weights and publish them as `publish_version`."""
        for m, g in zip(self.master, grads):
            m.grad = g
        self.optimizer.step()
        target = self.module(publish_version)
        for m, p in zip(self.master, target.parameters()):
            p.copy_(m)
            p.grad = None
        for m in self.master:
            m.grad = None

    def n_params(self) -> int:
        return sum(p.numel() for p in self.master)
