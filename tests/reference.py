"""Single-process training, written plainly and independently of the runtime: the ground
truth that every pipeline-parallel run must reproduce."""

from __future__ import annotations

import copy

import torch

from trirace.config import TrainConfig
from trirace.models import build_model, lm_loss
from trirace.runtime.trainer import batch_fn, sampler_for


def _optimizer(cfg: TrainConfig, params):
    cls = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.SGD
    return cls(params, lr=cfg.learning_rate)


def _batch_grad(cfg: TrainConfig, model, batch, step: int) -> float:
    """Accumulate the mean-over-global-batch gradient into model; return the mean loss."""
    n = cfg.dp * cfg.micro_batches
    losses = []
    for j in range(n):
        x, y = batch(step, j)
        loss = lm_loss(model(x), y)
        (loss / n).backward()
        losses.append(loss.item())
    return sum(losses) / n


def train_sync(cfg: TrainConfig) -> list[float]:
    """W(t+1) = W(t) - lr * grad f(W(t))."""
    torch.set_num_threads(1)
    model = build_model(cfg.spec, cfg.seed)
    opt = _optimizer(cfg, model.parameters())
    batch = batch_fn(cfg, sampler_for(cfg))
    out = []
    for t in range(cfg.steps):
        out.append(_batch_grad(cfg, model, batch, t))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return out


def train_2bw(cfg: TrainConfig) -> list[float]:
    """PipeDream-2BW's rule W(t+1) = W(t) - lr * grad f(W(t-1)), with W(-1) = W(0)."""
    torch.set_num_threads(1)
    current = build_model(cfg.spec, cfg.seed)  # W(t), owned by the optimizer
    previous = copy.deepcopy(current)  # W(t-1), where step t's gradient is taken
    opt = _optimizer(cfg, current.parameters())
    batch = batch_fn(cfg, sampler_for(cfg))
    out = []
    for t in range(cfg.steps):
        out.append(_batch_grad(cfg, previous, batch, t))
        snapshot = copy.deepcopy(current)
        for p, q in zip(current.parameters(), previous.parameters()):
            p.grad = q.grad
        opt.step()
        opt.zero_grad(set_to_none=True)
        previous = snapshot
    return out
