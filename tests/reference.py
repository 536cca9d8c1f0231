"""Single-process training, written plainly and independently of the runtime: the ground
truth that every pipeline-parallel run must reproduce."""

from __future__ import annotations

import copy
import math

import torch

from trirace.config import TrainConfig
from trirace.models import build_model, lm_loss
from trirace.models.build import loss_of
from trirace.data.batches import batch_fn, sampler_for


def _optimizer(cfg: TrainConfig, model):
    wd = cfg.optim.weight_decay if cfg.optim.weight_decay is not None else (0.01 if cfg.optim.optimizer in ("adamw", "muon") else 0.0)
    if cfg.optim.optimizer == "muon":  # the hidden layers' matrices to Muon, everything else to AdamW
        hidden = {id(p) for layer in list(model)[1:-1] for m in layer.modules() if not isinstance(m, torch.nn.Embedding)
                  for p in m.parameters(recurse=False) if p.ndim == 2}
        return _Pair(torch.optim.Muon([p for p in model.parameters() if id(p) in hidden], lr=cfg.optim.learning_rate,
                                      weight_decay=wd, adjust_lr_fn="match_rms_adamw"),
                     torch.optim.AdamW([p for p in model.parameters() if id(p) not in hidden], lr=cfg.optim.learning_rate,
                                       weight_decay=wd))
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[cfg.optim.optimizer]
    return cls(model.parameters(), lr=cfg.optim.learning_rate, weight_decay=wd)


class _Pair:
    """Two optimizers stepped as one."""

    def __init__(self, *opts):
        self.opts = opts
        self.param_groups = [g for o in opts for g in o.param_groups]
        self.state = {p: s for o in opts for p, s in o.state.items()}

    def step(self):
        for o in self.opts:
            o.step()
        self.state = {p: s for o in self.opts for p, s in o.state.items()}

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)


def _lr(cfg: TrainConfig, t: int) -> float:
    """Linear warm-up to lr, then constant, or linear/cosine decay to min_lr at the last step."""
    lr, w = cfg.optim.learning_rate, cfg.optim.warmup_steps
    if t < w:
        return lr * (t + 1) / w
    span = cfg.steps - 1 - w
    frac = 1.0 if span <= 0 else min(1.0, (t - w) / span)
    if cfg.optim.lr_schedule == "linear":
        return cfg.optim.min_lr + (lr - cfg.optim.min_lr) * (1 - frac)
    if cfg.optim.lr_schedule == "cosine":
        return cfg.optim.min_lr + (lr - cfg.optim.min_lr) * (1 + math.cos(math.pi * frac)) / 2
    return lr


def _update(cfg: TrainConfig, opt, params, t: int) -> None:
    """Clip the gradient about to be applied (torch's own clip), set step t's rate, step."""
    if cfg.optim.clip_grad is not None:
        torch.nn.utils.clip_grad_norm_(params, cfg.optim.clip_grad)
    for group in opt.param_groups:
        group["lr"] = _lr(cfg, t)
    opt.step()


def _batch_grad(cfg: TrainConfig, model, batch, step: int) -> float:
    """Accumulate the mean-over-global-batch gradient into model; return the mean loss."""
    n = cfg.parallel.dp * cfg.parallel.micro_batches
    losses = []
    loss_fn = loss_of(cfg.spec)  # the model's own loss (a LayerModel may bring one), else cross entropy
    for j in range(n):
        x, y = batch(step, j)
        loss = loss_fn(model(x), y)
        (loss / n).backward()
        losses.append(loss.item())
    return sum(losses) / n


def train_sync(cfg: TrainConfig, after_update=None) -> list[float]:
    """W(t+1) = W(t) - lr * grad f(W(t)). `after_update(t, model)` sees W(t+1)."""
    torch.set_num_threads(1)
    model = build_model(cfg.spec, cfg.seed)
    opt = _optimizer(cfg, model)
    batch = batch_fn(cfg, sampler_for(cfg))
    out = []
    for t in range(cfg.steps):
        out.append(_batch_grad(cfg, model, batch, t))
        _update(cfg, opt, list(model.parameters()), t)
        opt.zero_grad(set_to_none=True)
        if after_update:
            after_update(t, model)
    return out


@torch.no_grad()
def held_out_loss(cfg: TrainConfig, model) -> float:
    """Mean loss over the evaluation micro-batches every replica together evaluates."""
    batch = batch_fn(cfg, sampler_for(cfg, held_out=True))
    n = cfg.parallel.dp * cfg.data.eval_batches
    return sum(lm_loss(model(x), y).item() for x, y in (batch(0, i) for i in range(n))) / n


def train_2bw(cfg: TrainConfig, after_update=None) -> list[float]:
    """PipeDream-2BW's rule W(t+1) = W(t) - lr * grad f(B(t-1)), where the buffer B(v) is
    W(v), with B(-1) = B(0) = W(0). With delay compensation, "predict" makes B(v) =
    2 W(v) - W(v-1) for v >= 1, and "dc" adds lambda g*g / sqrt(s) * (W(t) - B(t-1)) to
    the (clipped) gradient, s being Adam's second moment (1 for SGD)."""
    torch.set_num_threads(1)
    current = build_model(cfg.spec, cfg.seed)  # W(t), owned by the optimizer
    take, then = copy.deepcopy(current), copy.deepcopy(current)  # B(t-1) for step t, B(t) for step t+1
    opt = _optimizer(cfg, current)
    batch = batch_fn(cfg, sampler_for(cfg))
    out = []
    for t in range(cfg.steps):
        out.append(_batch_grad(cfg, take, batch, t))
        before = copy.deepcopy(current)
        if cfg.optim.clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(list(take.parameters()), cfg.optim.clip_grad)
        for p, q in zip(current.parameters(), take.parameters()):
            g = q.grad
            if cfg.optim.delay_compensation == "dc":
                v = opt.state.get(p, {}).get("exp_avg_sq")
                h = g * g / (v.sqrt() + 1e-8) if v is not None else g * g
                g = g + 2.0 * h * (p.detach() - q.detach())
            p.grad = g
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, t)
        opt.step()
        opt.zero_grad(set_to_none=True)
        published = copy.deepcopy(current)
        if cfg.optim.delay_compensation == "predict":
            with torch.no_grad():
                for w_next, w_now in zip(published.parameters(), before.parameters()):
                    w_next.mul_(2.0).sub_(w_now)
        take, then = then, published
        if after_update:
            after_update(t, current)  # W(t+1), the update's result (not its prediction)
    return out
