"""What `trirace profile` times in its own process (trirace/calibrate/layers.py): the
optimizer on a real step's gradients, the host's memory speed, the sparse exchange's
passes, the layers on the job's device."""

from __future__ import annotations

import torch

from trirace.calibrate.layers import (copy_rate, layer_times, optimizer_time, rows_touched,
                                      step_gradients)
from trirace.config import make_config
from trirace.data.batches import batch_fn, sampler_for
from trirace.runtime.device import job_device


def test_the_memory_speed_is_read_by_one_thread_whatever_the_callers_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        one = copy_rate(8 << 20)  # (torch would split a copy this large over its threads)
        assert torch.get_num_threads() == 2  # the caller's count, back
    finally:
        torch.set_num_threads(before)
    assert 1e8 < one < 1e12


def test_the_optimizer_is_timed_on_a_real_steps_gradients():
    # an optimizer's cost depends on its inputs: every layer's gradient is there, and the
    # token table's is non-zero on exactly the rows that step's micro-batches touched
    cfg = make_config({"model": "gpt-test", "pp": 1, "dp": 2, "micro_batches": 3, "data": "synthetic"})
    layers, grads = step_gradients(cfg)
    assert len(grads) == sum(1 for layer in layers for _ in layer.parameters())
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    sample = batch_fn(cfg, sampler_for(cfg))
    touched = torch.unique(torch.cat([sample(0, i)[0].reshape(-1) for i in range(cfg.parallel.micro_batches)]))
    table = grads[0]
    assert table.shape[0] == cfg.spec.vocab_size
    assert torch.equal(torch.nonzero(table.abs().sum(dim=1)).flatten(), touched)
    _, grads = step_gradients(cfg, most=2)  # a long step is cut at `most` micro-batches
    touched = torch.unique(torch.cat([sample(0, i)[0].reshape(-1) for i in range(2)]))
    assert torch.equal(torch.nonzero(grads[0].abs().sum(dim=1)).flatten(), touched)
    assert 0 < optimizer_time(cfg) < 1e-6  # seconds per parameter: real, and not absurd


def test_layers_are_timed_per_layer_on_the_jobs_device_and_rows_on_its_data():
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "data": "synthetic"})
    device = job_device(cfg)
    assert device.type == ("cuda" if torch.cuda.device_count() >= cfg.world_size else "cpu")  # a GPU per rank
    assert job_device(cfg.with_(backend="gloo")).type == "cpu"  # gloo's ranks compute on the CPU
    nccl = cfg.with_(backend="nccl")  # one of a job's GPUs, however many ranks it has
    assert job_device(nccl).type == ("cuda" if torch.cuda.is_available() else "cpu")
    fwd, bwd, opt = layer_times(cfg, reps=1, device=device)
    assert len(fwd) == len(bwd) == 7 and all(t > 0 for t in fwd + bwd) and opt > 0
    rows = rows_touched(cfg)
    assert 0 < rows <= min(cfg.spec.vocab_size, cfg.tokens_per_replica_step)


def test_the_local_passes_profile_times_are_the_allgather_methods_own():
    from trirace.calibrate.layers import sparse_local_s
    from trirace.config import make_config
    from trirace.runtime.sparse_exchange import local_passes

    g = torch.zeros(50, 8)
    g[[3, 9, 40]] = torch.randn(3, 8)
    before = g.clone()
    out = torch.full_like(g, 7.0)  # stale values: the passes zero it first
    local_passes(g, out, 3)
    assert torch.equal(out, 3 * g) and torch.equal(g, before)  # n sources' rows summed, grad untouched
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "data": "synthetic"})
    assert 0 < sparse_local_s(cfg, 300) < 1.0
    # measured with two replicas' rows even for a job without replicas: a sweep prices other layouts from it
    assert 0 < sparse_local_s(cfg.with_(dp=1), 300) < 1.0
