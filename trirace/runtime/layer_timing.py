"""Per-layer compute time, measured on the spot for the partitioner (`--balance time`), on
the device the job's ranks compute on: a GPU job's stages balance by GPU time, not by what
the same layers cost on the host's CPU.

`trirace profile` times layers for the simulator its own way (trirace/calibrate/layers.py):
whole-model passes, as a pipeline runs them, where this module holds one layer at a time."""

from __future__ import annotations

import time

import torch

from ..models import ModelSpec, build_layer, layer_names
from ..models.build import loss_of
from . import allocator


class _Clock:
    """Seconds of the work between start() and stop(): wall time on the CPU; on a GPU, CUDA
    events on the current stream, which time the kernels rather than their launch and wait
    for nothing else on the device."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self.begin.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if not self.cuda:
            return time.perf_counter() - self.t0
        self.end.record()
        self.end.synchronize()  # this event only: not a device-wide sync
        return self.begin.elapsed_time(self.end) / 1e3


def profile_layers(spec: ModelSpec, inputs: torch.Tensor, targets: torch.Tensor, seed: int,
                   reps: int = 3, device: torch.device = torch.device("cpu")) -> list[float]:
    """Seconds of forward + backward per layer on one micro-batch (the fastest of `reps`
    runs after a warm-up, since the minimum is the least noisy estimate on a shared CPU),
    for the partitioner. The launcher (or torchrun's rank 0) runs this on the whole model
    before training and stays alive through it, so it holds one layer and one activation
    at a time (the whole model at once is every stage's weights on one process: gpt2-xl,
    6 GiB), and hands each layer's pages back to the kernel when done with it: under the
    ranks' malloc settings (runtime/allocator.py) the heap would keep them, and with them
    the peak of the largest layer's repetitions (hundreds of MB for gpt2-small) for the
    whole run."""
    n = len(layer_names(spec))
    times, h, targets, clock = [], inputs.to(device), targets.to(device), _Clock(device)
    for i in range(n):
        layer = build_layer(spec, i, seed).to(device)
        best = float("inf")
        for _ in range(reps + 1):
            x = h.detach().requires_grad_(h.is_floating_point())
            clock.start()
            y = layer(x)
            if i == n - 1:
                loss_of(spec)(y, targets).backward()
            else:
                y.backward(torch.ones_like(y))
            best = min(best, clock.stop())
            layer.zero_grad(set_to_none=True)
        times.append(best)
        if i < n - 1:
            with torch.no_grad():
                h = layer(h)
        del layer, x, y
        allocator.release()  # the layer's pages, before the next one's (the ranks' malloc keeps them)
    return times
