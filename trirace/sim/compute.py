"""How long each layer computes, without running it (memory: plan/memory.py).

Time comes from a calibration (per-layer forward and backward seconds measured where it
will run, `trirace profile`) or else from a FLOP count over the device's achieved rate.
FLOPs per layer for b sequences of s tokens, width d, vocabulary V (forward; backward is
twice that, the standard 1:2 ratio):
  block  2*b*s*12*d^2 (qkv, proj, the two MLP matrices) + 4*b*s^2*d (scores and values)
  head   2*b*s*d*V            embedding, norms: memory-bound, priced as 0 FLOPs
The optimizer streams the stage's parameters: Adam reads and writes weight, gradient,
two moments and the published copy, about 36 bytes per parameter (SGD 16).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from ..models import ModelSpec, layer_names
from ..models.build import layer_flops
from ..models.devices import Device, flop_times, recomputing
from .calibration import Calibration


@dataclass(frozen=True)
class ComputeModel:
    forward_s: tuple[float, ...]  # per layer, one micro-batch
    backward_s: tuple[float, ...]
    optimizer_s_per_param: float
    source: str  # "calibration" or "flops"

    @classmethod
    def build(cls, spec: ModelSpec, batch: int, seq: int, device: Device, optimizer: str = "adam",
              calibration: Calibration | None = None) -> "ComputeModel":
        if calibration is not None:
            calibration.check(spec, batch, seq)
            return cls(tuple(calibration.forward_s), tuple(calibration.backward_s),
                       calibration.optimizer_s_per_param, "calibration")
        t = flop_times(layer_flops(spec, batch, seq), device, optimizer)
        return cls(t.forward_s, t.backward_s, t.optimizer_s_per_param, t.source)

    def stage(self, layers: range) -> tuple[float, float]:
        """(forward seconds of the stage, backward seconds of the stage), one micro-batch."""
        return sum(self.forward_s[i] for i in layers), sum(self.backward_s[i] for i in layers)

    def recomputing(self, spec: ModelSpec) -> "ComputeModel":
        """With --recompute each block runs its forward again inside its backward."""
        return recomputing(self, layer_names(spec))


@dataclass(frozen=True)
class ComputeNoise:
    """How much one computation's time varies on cores that ranks share: the OS hands them
    out unevenly, so replicas that start together drift apart (the lockstep fold cannot
    show this; sim/fabric.py). `trirace profile` measures the coefficient of variation of
    one iteration (the whole model, one micro-batch) with k ranks computing at once; a
    computation draws with the spread of the load it starts under. A shorter computation
    varies more: taking the cores' uneven shares as independent over time, its CV is
    spread * sqrt(iteration / duration), at most 1."""

    spread: tuple[float, ...]  # [k-1]: with k ranks computing
    iteration_s: float
    seed: int = 0

    @classmethod
    def of(cls, calibration: Calibration | None, seed: int) -> "ComputeNoise | None":
        """From the calibration's measured spread; None where it measured none."""
        if calibration is None or not any(calibration.compute_spread):
            return None
        iteration = calibration.iteration_s
        return cls(tuple(calibration.compute_spread), iteration, seed) if iteration > 0 else None

    def sampler(self, rank: int, draw: int = 0) -> Callable[[float, int], float]:
        """A rank's durations: (`seconds`, ranks computing) -> seconds taken, lognormal with
        mean `seconds`, from a stream of its own per simulated run (`draw`), seeded: a
        prediction is repeatable."""
        rng = random.Random(f"{self.seed}:{draw}:{rank}")

        def duration(seconds: float, load: int) -> float:
            if seconds <= 0:
                return seconds
            spread = self.spread[min(max(load, 1), len(self.spread)) - 1]  # past the measured: the last
            cv = min(spread * math.sqrt(self.iteration_s / seconds), 1.0)
            sigma2 = math.log1p(cv * cv)
            return seconds * rng.lognormvariate(-sigma2 / 2, math.sqrt(sigma2))
        return duration
