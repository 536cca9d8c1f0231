"""Hierarchical all-reduce gives the flat one's sums, on real processes."""

import pytest

from trirace.config import make_config
from trirace.runtime import run_local


def test_hierarchical_allreduce_matches_flat(tmp_path):
    """pp=1 x dp=4 on 2 nodes x 2 ranks: trirace reduces hierarchically, blocking flat; the
    training math agrees (sums in another order: a float tolerance, not bitwise)."""
    topo = tmp_path / "topo.yaml"
    topo.write_text("nodes: 2\nranks_per_node: 2\nintra: {bandwidth: 100gbit, latency: 2us}\n"
                    "inter: {bandwidth: 250mbit, latency: 100us}\n")
    base = dict(model="gpt-test", data="synthetic", pp=1, dp=4, steps=4, micro_batches=2, micro_batch_size=1,
                seq_len=16, progress=False, balance="params", topology=topo, probe=False)
    res = run_local([make_config(base, comm_policy=p) for p in ("trirace", "blocking")], timeout_s=240)
    tri, blk = res
    assert all(r["hierarchical_allreduce"] for r in tri) and not any(r["hierarchical_allreduce"] for r in blk)
    assert len(tri) == len(blk) == 4
    for a, b in zip(tri, blk, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
