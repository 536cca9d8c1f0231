"""Emulated layers: a model that takes a GPU's time and moves its bytes, without its arithmetic.

`--emulate DEVICE` turns a model into one whose layer i
- sleeps, in forward and in backward, `dilation` times what layer i takes on DEVICE for
  one micro-batch (devices.py prices it from FLOPs), so a rank computes by sleeping and
  leaves the host's cores to the ranks that move bytes, as a GPU leaves its host's;
- holds each of layer i's parameters with the last dimension divided by `byte_scale`
  (rounded up), so the gradients a stage reduces, and the activations between stages
  ([batch, seq, d / byte_scale]), are 1/byte_scale of the real bytes. Links shaped to
  1/(dilation x byte_scale) of the real rate then take every transfer dilation times as
  long as on the real cluster, in proportion with the computation;
- keeps token ids real: the first layer looks them up in a [vocab, d / byte_scale] table,
  so the rows a sparse exchange sends are the rows the real model touches.
Values are cheap: a layer passes its input on, the loss is the output's mean (so backward
runs through every layer), only the token table receives a gradient, and the optimizer's
step sleeps the device's time for the real parameter count instead of updating anything.
So every executor, policy and schedule runs the emulated model unchanged: it is an
ordinary layer list (a custom model, models/custom.py) with the real model's boundaries.

Python's sleep overshoots by up to a scheduler tick; each thread takes its overshoot off
its next sleep, so a run of computations keeps to its total.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from .build import build_layer, head_name, layer_names, table_name
from .custom import LayerModel, spec_of_model
from .devices import WEIGHT_GRAD_SHARE, LayerTimes
from .presets import ModelSpec


@dataclass(frozen=True)
class Emulation:
    device: str  # what `times` were priced for (a device name)
    dilation: float  # K: every computation and every transfer takes K times its real time
    byte_scale: int  # s: every tensor a stage sends holds 1/s of the real bytes
    times: LayerTimes  # per layer, one micro-batch, on the device (not dilated)

    def __post_init__(self) -> None:
        if not self.dilation >= 1:
            raise UsageError(f"dilation {self.dilation:g}: it must be at least 1 (time runs K times slower)")
        if self.byte_scale < 1:
            raise UsageError(f"byte scale {self.byte_scale}: it must be at least 1")


# ------------------------------------------------------------------ sleeping as computing

_ahead = threading.local()  # seconds this thread has slept beyond what it was asked


def compute_for(seconds: float) -> None:
    """Take `seconds` as a device would: sleep, less what the thread's last sleeps overshot."""
    want = seconds - getattr(_ahead, "s", 0.0)
    slept = 0.0
    if want > 0:
        t0 = time.perf_counter()
        time.sleep(want)
        slept = time.perf_counter() - t0
    _ahead.s = slept - want


_part = threading.local()  # which part of the backward this thread's autograd pass computes


@contextlib.contextmanager
def input_grad_only():
    """A backward pass that computes the input gradient alone (a split backward's I): each
    emulated layer takes the I share of its backward time. The W share is taken
    where the weight gradients are computed (`StageModel.emulated_weight_s`)."""
    _part.input_only = True
    try:
        yield
    finally:
        _part.input_only = False


class _Compute(torch.autograd.Function):
    """Identity whose forward and backward take a device's time."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:  # type: ignore[override]
        ctx.backward_s = backward_s
        if not x.is_meta:  # tracing shapes on the meta device takes no time
            compute_for(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        share = 1.0 - WEIGHT_GRAD_SHARE if getattr(_part, "input_only", False) else 1.0
        compute_for(share * ctx.backward_s)
        return grad, None, None


# ------------------------------------------------------------------ layers


def scaled(shape: tuple[int, ...], s: int) -> tuple[int, ...]:
    """A parameter's emulated shape: the last dimension divided by `s`, rounded up."""
    return (*shape[:-1], math.ceil(shape[-1] / s)) if shape else shape


class EmulatedLayer(nn.Module):
    """Layer `index` of the real model as sleeps over parameters of the scaled shapes, under
    the real names (so ties and the token table are found as in the real model)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], forward_s: float, backward_s: float, optimizer_s: float,
                 table: str | None = None):
        super().__init__()
        self.forward_s, self.backward_s = forward_s, backward_s
        self.optimizer_s = optimizer_s  # the optimizer's time for the real parameters, dilated
        self.table = table
        for name, shape in shapes.items():
            if name == table:  # a real embedding, whose gradient touches the real rows
                module, _, leaf = name.rpartition(".")
                if not module or leaf != "weight":
                    raise UsageError(f"an emulated token table must be an embedding's weight, not {name!r}")
                emb = nn.Embedding(*shape)
                with torch.no_grad():
                    emb.weight.normal_(0.0, 0.02)
                parent, attr = self._owner(module)
                setattr(parent, attr, emb)
            else:
                owner, leaf = self._owner(name)
                owner.register_parameter(leaf, nn.Parameter(torch.zeros(shape)))

    def _owner(self, dotted: str) -> tuple[nn.Module, str]:
        *path, leaf = dotted.split(".")
        module: nn.Module = self
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        return module, leaf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is not None:  # token ids -> their rows
            x = F.embedding(x, self.get_parameter(self.table))
        return _Compute.apply(x, self.forward_s, self.backward_s)


def step_seconds(layers: nn.Module) -> float | None:
    """The optimizer step's time for the emulated layers among `layers` (which update
    nothing and take this instead), or None where none is emulated (a real step)."""
    emulated = [m for m in layers if isinstance(m, EmulatedLayer)]
    return sum(m.optimizer_s for m in emulated) if emulated else None


def emulated_loss(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A scalar that depends on every output value (so backward reaches every layer)."""
    return out.float().mean()


@functools.lru_cache(maxsize=8)
def emulated_spec(spec: ModelSpec, em: Emulation) -> ModelSpec:
    """`spec` as emulated layers: a custom model of the same layer count, boundaries, tie
    and vocabulary."""
    if spec.arch not in ("gpt", "llama"):
        raise UsageError(f"--emulate runs causal language models (gpt, llama), not arch {spec.arch!r}")
    if spec.weights is not None:
        raise UsageError("--emulate prices a model's shape; it does not load weights (use the shape alone)")
    names = layer_names(spec)
    if len(em.times.forward_s) != len(names):
        raise UsageError(f"device times for {len(em.times.forward_s)} layers, but {spec.name} has {len(names)}")
    shapes = []
    with torch.device("meta"):
        for i in range(len(names)):
            layer = build_layer(spec, i, 0)
            shapes.append({n: tuple(p.shape) for n, p in layer.named_parameters()})
    k, s = em.dilation, em.byte_scale
    opt, table = em.times.optimizer_s_per_param, table_name(spec)

    def make(i: int) -> nn.Module:
        real = sum(math.prod(sh) for sh in shapes[i].values())
        return EmulatedLayer({n: scaled(sh, s) for n, sh in shapes[i].items()}, k * em.times.forward_s[i],
                             k * em.times.backward_s[i], k * opt * real, table=table if i == 0 else None)
    tie = (f"0.{table}", f"{len(names) - 1}.{head_name(spec)}") if spec.tie_embeddings else None
    model = LayerModel(make, len(names), spec.vocab_size, spec.max_seq_len, tie, emulated_loss)
    return spec_of_model(model, f"{spec.name}@{em.device}")
