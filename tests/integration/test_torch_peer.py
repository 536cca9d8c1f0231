"""The external baseline (torch.distributed.pipelining's Schedule1F1B plus a blocking
all-reduce) computes what trirace's synchronous 1F1B computes: same stages, micro-batches,
initial weights and update rule, so the same loss at every step."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from trirace.bench.side_by_side import PEER_RUNNER
from trirace.bench.torch_peer import run_peer
from trirace.config import TrainConfig, make_config
from trirace.errors import UsageError
from trirace.runtime import run_local

RTOL = 1e-5
STEPS = 6


@pytest.fixture(scope="module")
def runs() -> tuple[TrainConfig, list[dict], list[dict], list[dict]]:
    base = dict(model="gpt-test", data="synthetic", steps=STEPS, micro_batch_size=2, seq_len=32,
                micro_batches=4, progress=False, balance="params", pp=2, dp=2)
    cfg = make_config(base, schedule="1f1b", comm_policy="blocking")
    # The other placement too: the peer's pipeline groups must follow the layout, not rank order.
    pp_inner = make_config(base, schedule="1f1b", comm_policy="blocking", rank_order="pp-inner")
    zb = make_config(base, schedule="zb-h1", comm_policy="blocking")  # torch's zero bubble (ZB1P)
    peer, tri, peer_pp_inner, peer_zb = run_local([cfg, cfg, pp_inner, zb],
                                                  systems=[PEER_RUNNER, "trirace", PEER_RUNNER, PEER_RUNNER],
                                                  timeout_s=120)
    RUNS["zb"] = peer_zb
    return cfg, peer, tri, peer_pp_inner


RUNS: dict[str, list[dict]] = {}


def test_torch_zero_bubble_computes_1f1b_losses(runs):
    _, _, tri, _ = runs
    assert _max_rel(RUNS["zb"], tri) <= RTOL
    assert {r["comm_policy"] for r in RUNS["zb"]} == {"torch-zb-h1"}


def _max_rel(got: list[dict], want: list[dict]) -> float:
    assert len(got) == len(want) == STEPS
    return max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, want, strict=True))


def test_losses_match_trirace_1f1b(runs):
    _, peer, tri, _ = runs
    assert _max_rel(peer, tri) <= RTOL, [(a["loss"], b["loss"]) for a, b in zip(peer, tri)]


def test_placement_does_not_change_the_math(runs):
    _, _, tri, peer_pp_inner = runs
    assert _max_rel(peer_pp_inner, tri) <= RTOL


def test_training_progresses(runs):
    _, peer, _, _ = runs
    assert peer[-1]["loss"] < peer[0]["loss"]


def test_rows_carry_trirace_keys(runs):
    cfg, peer, _, _ = runs
    assert [r["step"] for r in peer] == list(range(STEPS))
    for r in peer:
        assert r["step_time_s"] > 0 and r["tokens_per_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(cfg.tokens_per_step / r["step_time_s"])
        assert (r["schedule"], r["pp"], r["dp"], r["comm_policy"]) == ("1f1b", 2, 2, "torch-1f1b")


def test_single_stage_is_rejected(tmp_path, quick):
    """pp=1 is no pipeline: a clear error, not a silent plain-DP measurement."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(UsageError, match="pp >= 2"):
            run_peer(make_config(quick, pp=1, dp=1))
    finally:
        dist.destroy_process_group()
