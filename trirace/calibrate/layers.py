"""Computation the simulator prices, timed in this process on the job's device: each
layer's forward and backward, the optimizer step per parameter, the sparse exchange's
passes over the token table, and the data's touched rows.

Every timing is the fastest of a few repetitions after a warm-up: on a shared machine the
minimum is the least noisy estimate of what the work itself costs."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..config import TrainConfig
from ..models import ModelSpec, build_layers
from ..models.build import loss_of
from ..optim import make_optimizer, muon_matrices
from ..data.batches import batch_fn, sampler_for


def _sync(device: torch.device) -> None:
    """Wait for the device's queued kernels: a GPU returns from a launch before the work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_of(fn: Callable[[], object], reps: int, device: torch.device = torch.device("cpu")) -> float:
    """Seconds of `fn`'s fastest run of `reps`, after one warm-up run."""
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def pass_times(spec: ModelSpec, inputs: torch.Tensor, targets: torch.Tensor, seed: int, reps: int = 3,
               device: torch.device = torch.device("cpu")) -> tuple[list[float], list[float]]:
    """(forward seconds, backward seconds) per layer on one micro-batch, timed the way a
    pipeline runs them: in whole-model passes, layer after layer, so each layer meets the
    caches the previous one left rather than its own weights from the last repetition,
    with every gradient accumulating in place into an existing buffer, as the runtime's
    flat gradient buffers do, and each backward fed the gradient the next layer really
    returned. Each layer's fastest of `reps + 1` passes (the first warms caches and the
    allocator, and is rarely the fastest). It holds a whole pass's activations and every
    layer's gradient at once, which a profile can afford and a training start cannot
    (runtime/layer_timing.py times one layer at a time for the partitioner)."""
    layers = [layer.to(device) for layer in build_layers(spec, seed)]
    inputs, targets = inputs.to(device), targets.to(device)
    for p in (p for layer in layers for p in layer.parameters()):
        p.grad = torch.zeros_like(p)
    loss = loss_of(spec)
    fwd, bwd = [float("inf")] * len(layers), [float("inf")] * len(layers)
    for _ in range(reps + 1):
        ins, outs, h = [], [], inputs
        for i, layer in enumerate(layers):  # each input detached, so each backward is one layer's
            x = h.detach().requires_grad_(h.is_floating_point())
            _sync(device)
            t0 = time.perf_counter()
            h = layer(x)
            _sync(device)
            fwd[i] = min(fwd[i], time.perf_counter() - t0)
            ins.append(x)
            outs.append(h)
        grad = None
        for i in reversed(range(len(layers))):
            _sync(device)
            t0 = time.perf_counter()
            if i == len(layers) - 1:
                loss(outs[i], targets).backward()
            else:
                outs[i].backward(grad)
            _sync(device)
            bwd[i] = min(bwd[i], time.perf_counter() - t0)
            grad = ins[i].grad
    return fwd, bwd


def layer_passes(cfg: TrainConfig, reps: int = 5, device: torch.device = torch.device("cpu")
                 ) -> tuple[list[float], list[float]]:
    """`pass_times` on the job's first micro-batch of its own data."""
    inputs, targets = batch_fn(cfg, sampler_for(cfg))(0, 0)
    return pass_times(cfg.spec, inputs, targets, cfg.seed, reps, device)


def layer_times(cfg: TrainConfig, reps: int = 5, device: torch.device = torch.device("cpu")
                ) -> tuple[list[float], list[float], float]:
    """(forward_s per layer, backward_s per layer, optimizer seconds per parameter)."""
    return (*layer_passes(cfg, reps, device), optimizer_time(cfg, device=device))


def _forward_backward(layers: list[torch.nn.Module], loss, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    """`inputs` through every layer and the loss, and back: each gradient accumulates."""
    h = inputs
    for layer in layers:
        h = layer(h)
    loss(h, targets).backward()


def step_gradients(cfg: TrainConfig, most: int = 4, device: torch.device = torch.device("cpu")
                   ) -> tuple[list[torch.nn.Module], list[torch.Tensor]]:
    """The model's layers and each parameter's gradient after one replica's first step
    (its m micro-batches, at most `most`: a profile's time stays bounded, and where m is
    larger the optimizer is a smaller share of the step), as the runtime accumulates them."""
    layers = [layer.to(device) for layer in build_layers(cfg.spec, cfg.seed)]
    sample, loss = batch_fn(cfg, sampler_for(cfg)), loss_of(cfg.spec)
    for i in range(min(cfg.parallel.micro_batches, most)):
        _forward_backward(layers, loss, *(t.to(device) for t in sample(0, i)))
    return layers, [p.grad for layer in layers for p in layer.parameters()]


def optimizer_time(cfg: TrainConfig, reps: int = 3, device: torch.device = torch.device("cpu")) -> float:
    """Seconds per parameter of the optimizer phase as the runtime runs it (runtime/stage.py
    `step`): the optimizer's step, publishing the new weights into the other buffer, and
    zeroing a gradient buffer. On a real step's gradients: the token table's gradient is
    zero outside the rows the step touched, and an optimizer's cost depends on its inputs
    (all-zero gradients make Adam's step measurably slower)."""
    layers, grads = step_gradients(cfg, device=device)
    originals = [p for layer in layers for p in layer.parameters()]
    params = [torch.nn.Parameter(p.detach().clone()) for p in originals]
    for p, g in zip(params, grads):
        p.grad = g if g is not None else torch.zeros_like(p)  # a parameter the loss never reached
    hidden = muon_matrices(layers, 0, len(layers))  # muon: its split, so its Newton-Schulz cost is timed
    opt = make_optimizer(params, cfg.optim.optimizer, cfg.optim.learning_rate, cfg.optim.decay,
                         {id(c) for c, p in zip(params, originals) if id(p) in hidden})
    copies = [p.detach().clone() for p in params]
    n = sum(p.numel() for p in params)
    flat_grad = torch.empty(n, device=device)  # the buffer the runtime zeroes for the next version's gradients

    def step():
        opt.step()
        with torch.no_grad():  # publishing the new version is part of the phase
            for c, p in zip(copies, params):
                c.copy_(p)
        flat_grad.zero_()
    return best_of(step, reps, device) / n


def compute_now(cfg: TrainConfig, threads: int) -> float:
    """One micro-batch's forward and backward through the whole model on the CPU, in
    seconds, timed as a calibration times it with its thread count: the host's speed right
    now, to set beside what a calibration saw."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fwd, bwd = layer_passes(cfg, 5)
    finally:
        torch.set_num_threads(before)
    return sum(fwd) + sum(bwd)


def copy_rate(nbytes: int = 64 << 20, reps: int = 5) -> float:
    """Bytes per second one thread copies a buffer far larger than the caches: the host's
    memory speed right now, for the record beside each compute timing (a transfer's
    per-byte cost is memory traffic, which a small model's layers in cache mostly are not).
    Always one intra-op thread, whatever the caller's: torch splits a copy this large over
    its threads, and a rank sharing the cores has one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        return nbytes / best_of(lambda: dst.copy_(src), reps)
    finally:
        torch.set_num_threads(before)


def rows_touched(cfg: TrainConfig, steps: int = 4) -> float:
    """Distinct token ids in one replica's step (its m micro-batches), the largest over the
    replicas, averaged over a few steps: what the sparse exchange ships."""
    sample = batch_fn(cfg, sampler_for(cfg))
    m = cfg.parallel.micro_batches
    per_step = []
    for t in range(steps):
        per_step.append(max(
            int(torch.unique(torch.cat([sample(t, r * m + i)[0].reshape(-1) for i in range(m)])).numel())
            for r in range(cfg.parallel.dp)))
    return sum(per_step) / len(per_step)


def sparse_local_s(cfg: TrainConfig, rows: float, reps: int = 5) -> float:
    """Seconds one replica's sparse exchange of the token table's gradient spends on its own
    memory (runtime/sparse_exchange.py `local_passes`: a scan of the whole [V, d] table for
    the `rows` touched, zeroing it and adding the replicas' rows), fastest of `reps`. The
    bytes on the wire do not show this cost, and under the priority policy the exchange
    goes first and holds the step's chunks behind it. With at least two replicas' rows even
    where the profiled job has none: a sweep prices other layouts from the same file."""
    from ..runtime.sparse_exchange import local_passes

    spec = cfg.spec
    k = min(max(int(round(rows)), 1), spec.vocab_size)
    gen = torch.Generator().manual_seed(cfg.seed)
    grad = torch.zeros(spec.vocab_size, spec.d_model)
    grad[torch.randperm(spec.vocab_size, generator=gen)[:k]] = torch.randn(k, spec.d_model, generator=gen)
    out = torch.empty_like(grad)
    return best_of(lambda: local_passes(grad, out, max(cfg.parallel.dp, 2)), reps)


def model_step(cfg: TrainConfig) -> Callable[[], None]:
    """One micro-batch's forward and backward through the whole model on the CPU, as a
    function: the computation the testbed's contention probes run in their own processes."""
    layers = build_layers(cfg.spec, cfg.seed)
    x = torch.randint(0, cfg.spec.vocab_size, (cfg.parallel.micro_batch_size, cfg.tokens_seq))
    loss = loss_of(cfg.spec)
    return lambda: _forward_backward(layers, loss, x, x)
