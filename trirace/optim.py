"""The update rule's pieces that are pure functions of the configuration: the optimizer,
the learning rate of each step, and the clipping factor of a gradient norm. The runtime,
the single-process references in the tests and the simulator's memory model all use
these, so a schedule or a clip means the same thing everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

# Values of optimizer state per parameter beyond the fp32 master copy: Adam and AdamW keep
# two moments; plain SGD (no momentum here) keeps nothing; Muon keeps one momentum buffer
# for the hidden matrices and AdamW's two moments for the rest, so two bounds it.
STATE_VALUES = {"adam": 2, "adamw": 2, "sgd": 0, "muon": 2}


def muon_matrices(layers: Sequence[nn.Module], start: int, total: int) -> set[int]:
    """ids of the parameters Muon updates in layers start.. of a `total`-layer model: the
    weight matrices of the hidden layers. The first and last layers (token table,
    positions, head) and every vector (norms, biases) stay with AdamW, as Muon's authors
    prescribe: orthogonalising an embedding's or a classifier's update has no meaning."""
    ids: set[int] = set()
    for i, layer in enumerate(layers, start):
        if 0 < i < total - 1:
            for m in layer.modules():
                if not isinstance(m, nn.Embedding):
                    ids.update(id(p) for p in m.parameters(recurse=False) if p.ndim == 2)
    return ids


class MuonAdamW:
    """Muon on the hidden matrices, AdamW on every other parameter, stepped together.

    torch ships both but not the pair, and refuses vectors in Muon. Muon takes Moonshot's
    learning-rate adjustment ("match_rms_adamw"), which scales its orthogonalised update
    to AdamW's RMS, so one learning rate and weight decay serve both (arXiv 2502.16982).
    The one-step-delay study (arXiv 2606.30634) finds Muon robust where AdamW degrades,
    which is why 2BW users want it. Duck-typed like torch.optim.Optimizer where the
    runtime reaches in: param_groups, state, step, zero_grad, state_dict."""

    def __init__(self, params: Iterable[torch.nn.Parameter], matrices: set[int], lr: float, weight_decay: float):
        params = list(params)
        mats = [p for p in params if id(p) in matrices]
        rest = [p for p in params if id(p) not in matrices]
        self.parts: list[torch.optim.Optimizer] = []
        if mats:
            self.parts.append(torch.optim.Muon(mats, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"))
        if rest:
            self.parts.append(torch.optim.AdamW(rest, lr=lr, weight_decay=weight_decay))
        self.param_groups = [g for o in self.parts for g in o.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for o in self.parts for p, s in o.state.items()}

    def step(self) -> None:
        for o in self.parts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"parts": [o.state_dict() for o in self.parts]}

    def load_state_dict(self, state: dict) -> None:
        if len(state.get("parts", ())) != len(self.parts):
            raise ValueError("optimizer state is not Muon+AdamW's (saved by another --optimizer?)")
        for o, s in zip(self.parts, state["parts"]):
            o.load_state_dict(s)


def make_optimizer(params: Iterable[torch.nn.Parameter], optimizer: str, lr: float,
                   weight_decay: float, matrices: set[int] | None = None) -> torch.optim.Optimizer | MuonAdamW:
    """torch's own implementations, one parameter group; "muon" splits `params` by
    `matrices` (muon_matrices' ids)."""
    if optimizer == "muon":
        return MuonAdamW(params, matrices or set(), lr, weight_decay)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {optimizer!r}")


def lr_at(step: int, lr: float, steps: int, schedule: str = "constant", warmup_steps: int = 0,
          min_lr: float = 0.0) -> float:
    """The learning rate of update `step` (0-based) in a run of `steps` updates.

    Warm-up rises linearly, lr * (step + 1) / warmup_steps, so the first update is not a
    zero step. After it, `constant` holds lr; `linear` and `cosine` fall from lr to min_lr,
    reaching it at the last update (the Megatron and nanoGPT convention)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    span = steps - 1 - warmup_steps
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup_steps) / span)
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    if schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def clip_factor(norm: float, max_norm: float | None) -> float:
    """What gradients are multiplied by so their global norm is at most max_norm (1.0 when
    it already is, or when clipping is off). The same formula as torch's clip_grad_norm_."""
    if max_norm is None:
        return 1.0
    return min(1.0, max_norm / (norm + 1e-6))


# Delay compensation for 2BW, whose update W(t+1) = W(t) - lr g(W(t-1)) applies a gradient
# taken one version back. Two corrections keep 2BW's two weight buffers and are elementwise,
# so every communication policy still gives the same bits:
# - "predict" (weight prediction, after PipeMare and XPipe): OPT t publishes
#   2 W(t+1) - W(t), the last update extrapolated one step, so step t+2 takes its gradient
#   at an estimate of W(t+2), the weights it will be applied to. W(t) is copied into the
#   buffer being freed before the optimizer steps, so no third copy exists.
# - "dc" (DC-ASGD-a): g += lambda g*g / sqrt(v) * (W(t) - W(t-1)), a first-order Taylor
#   correction of the stale gradient with the diagonal outer-product approximation of the
#   Hessian; v is Adam's second moment (1 for SGD).
# Which correction to use is measured by python -m trirace.bench.convergence (reports in
# docs/benchmarks/): with AdamW the delay costs a tenth or more of the validation loss and
# prediction recovers part of it; with Muon (MuonAdamW above) the delay costs little, as
# arXiv 2606.30634 reports. Prediction suits the Adam family and Muon, whose normalised
# updates are smooth enough to extrapolate, and not plain SGD, whose raw steps overshoot
# when doubled. So the default stays "none"; for 2bw, use muon with "predict".
DC_LAMBDA = 2.0


@torch.no_grad()
def dc_correct(grad: torch.Tensor, current: torch.Tensor, stale: torch.Tensor,
               second_moment: torch.Tensor | None, lam: float = DC_LAMBDA) -> None:
    """DC-ASGD-a in place: the gradient taken at `stale`, moved towards `current`."""
    scale = grad * grad
    if second_moment is not None:
        scale = scale / (second_moment.sqrt() + 1e-8)
    grad.add_(lam * scale * (current - stale))


@dataclass(frozen=True)
class UpdateRule:
    """What an update does with a step's averaged gradient, beyond the optimizer itself."""

    lr: float
    steps: int
    schedule: str = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    clip: float | None = None
    on_nonfinite: str = "stop"  # or "skip"
    compensation: str = "none"  # 2BW's delay compensation: "none", "predict" or "dc"

    @classmethod
    def of(cls, cfg) -> "UpdateRule":
        """From a TrainConfig."""
        return cls(cfg.optim.learning_rate, cfg.steps, cfg.optim.lr_schedule, cfg.optim.warmup_steps, cfg.optim.min_lr, cfg.optim.clip_grad,
                   cfg.faults.on_nonfinite, cfg.optim.delay_compensation)

    def lr_at(self, step: int) -> float:
        return lr_at(step, self.lr, self.steps, self.schedule, self.warmup_steps, self.min_lr)

    def factor(self, norm: float) -> float:
        return clip_factor(norm, self.clip)
