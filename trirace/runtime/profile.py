"""Per-layer compute time, measured on the spot: for the simulator's calibration
(pass_times, runtime/calibrate.py) and for the partitioner (profile_layers)."""

from __future__ import annotations

import time

import torch

from ..models import ModelSpec, build_layer, build_layers, layer_names
from ..models.build import loss_of
from . import allocator


def pass_times(spec: ModelSpec, inputs: torch.Tensor, targets: torch.Tensor, seed: int,
               reps: int = 3) -> tuple[list[float], list[float]]:
    """(forward seconds, backward seconds) per layer on one micro-batch, timed the way a
    pipeline runs them: in whole-model passes, layer after layer, so each layer meets the
    caches the previous one left rather than its own weights from the last repetition,
    with every gradient accumulating in place into an existing buffer, as the runtime's
    flat gradient buffers do, and each backward fed the gradient the next layer really
    returned. Each layer's fastest of `reps + 1` passes (the first warms caches and the
    allocator, and is rarely the fastest): the minimum is the least noisy estimate on a
    shared CPU. It holds a whole pass's activations and every layer's gradient at once:
    `trirace profile` runs it, not every training start. (On gpt-tiny that moved stage 0's layer
    times by up to 5% from timing each layer alone, about the run-to-run noise: stop 29.)"""
    layers = build_layers(spec, seed)
    for p in (p for layer in layers for p in layer.parameters()):
        p.grad = torch.zeros_like(p)
    loss = loss_of(spec)
    fwd, bwd = [float("inf")] * len(layers), [float("inf")] * len(layers)
    for _ in range(reps + 1):
        ins, outs, h = [], [], inputs
        for i, layer in enumerate(layers):  # each input detached, so each backward is one layer's
            x = h.detach().requires_grad_(h.is_floating_point())
            t0 = time.perf_counter()
            h = layer(x)
            fwd[i] = min(fwd[i], time.perf_counter() - t0)
            ins.append(x)
            outs.append(h)
        grad = None
        for i in reversed(range(len(layers))):
            t0 = time.perf_counter()
            if i == len(layers) - 1:
                loss(outs[i], targets).backward()
            else:
                outs[i].backward(grad)
            bwd[i] = min(bwd[i], time.perf_counter() - t0)
            grad = ins[i].grad
    return fwd, bwd


def profile_layers(spec: ModelSpec, inputs: torch.Tensor, targets: torch.Tensor, seed: int,
                   reps: int = 3) -> list[float]:
    """Seconds of forward + backward per layer on one micro-batch (the fastest of `reps`
    runs after a warm-up, since the minimum is the least noisy estimate on a shared CPU),
    for the partitioner. The launcher (or torchrun's rank 0) runs this on the whole model
    before training and stays alive through it, so it holds one layer and one activation
    at a time (the whole model at once is every stage's weights on one process: gpt2-xl,
    6 GiB), and hands each layer's pages back to the kernel when done with it: under the
    ranks' malloc settings (runtime/allocator.py) the heap would keep them, and with them
    the peak of the largest layer's repetitions (gpt2-small: ~800 MB) for the whole run.
    (pass_times' whole pass is for `trirace profile`.)"""
    n = len(layer_names(spec))
    times, h = [], inputs
    for i in range(n):
        layer = build_layer(spec, i, seed)
        best = float("inf")
        for _ in range(reps + 1):
            x = h.detach().requires_grad_(h.is_floating_point())
            t0 = time.perf_counter()
            y = layer(x)
            if i == n - 1:
                loss_of(spec)(y, targets).backward()
            else:
                y.backward(torch.ones_like(y))
            best = min(best, time.perf_counter() - t0)
            layer.zero_grad(set_to_none=True)
        times.append(best)
        if i < n - 1:
            with torch.no_grad():
                h = layer(h)
        del layer, x, y
        allocator.release()  # the layer's pages, before the next one's (the ranks' malloc keeps them)
    return times
