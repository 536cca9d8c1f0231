"""The local passes trirace profile times for the sparse exchange are the allgather method's own (kept here, in tests/, while calibration is rebuilt)."""

from __future__ import annotations

import torch


def test_the_local_passes_profile_times_are_the_allgather_methods_own():
    from trirace.runtime.calibrate import sparse_local_s
    from trirace.runtime.sparse_exchange import local_passes
    from trirace.config import make_config

    g = torch.zeros(50, 8)
    g[[3, 9, 40]] = torch.randn(3, 8)
    before = g.clone()
    out = torch.full_like(g, 7.0)  # stale values: the passes zero it first
    local_passes(g, out, 3)
    assert torch.equal(out, 3 * g) and torch.equal(g, before)  # n sources' rows summed, grad untouched
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "data": "synthetic"})
    assert 0 < sparse_local_s(cfg, 300) < 1.0
    # measured with two replicas' rows even for a job without replicas: a sweep prices other layouts from it
    assert 0 < sparse_local_s(cfg.model_copy(update={"dp": 1}), 300) < 1.0
