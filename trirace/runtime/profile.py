"""Per-layer compute time, measured on the spot, for the partitioner."""

from __future__ import annotations

import time

import torch

from ..models import ModelSpec, build_layers
from ..models.build import loss_of


def profile_layers(spec: ModelSpec, inputs: torch.Tensor, targets: torch.Tensor, seed: int,
                   reps: int = 3) -> list[float]:
    """Seconds of forward + backward per layer on one micro-batch (the fastest of `reps`
    runs after a warm-up, since the minimum is the least noisy estimate on a shared CPU)."""
    layers = build_layers(spec, seed)
    acts = [inputs]
    with torch.no_grad():
        for layer in layers:
            acts.append(layer(acts[-1]))
    times = []
    for i, layer in enumerate(layers):
        best = float("inf")
        for _ in range(reps + 1):
            x = acts[i].detach().requires_grad_(acts[i].is_floating_point())
            t0 = time.perf_counter()
            y = layer(x)
            if i == len(layers) - 1:
                loss_of(spec)(y, targets).backward()
            else:
                y.backward(torch.ones_like(y))
            best = min(best, time.perf_counter() - t0)
            layer.zero_grad(set_to_none=True)
        times.append(best)
    return times
