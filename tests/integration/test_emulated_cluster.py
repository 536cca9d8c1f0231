"""The emulated GPU cluster's model on real processes: a 2x2 job of emulated layers runs
under every policy on loopback, obeys NCCL's rules under the strict device model, and every
policy computes the same losses; its ranks compute by sleeping, so their CPU stays small."""

import pytest

from trirace.bench.side_by_side import PEER_RUNNER
from trirace.config import make_config
from trirace.obs.commcheck import check
from trirace.policy import POLICIES
from trirace.runtime import run_local


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("emulated")
    base = dict(model="gpt-test", emulate="h100", dilation=200_000, byte_scale=4, data="synthetic",
                micro_batch_size=2, seq_len=16, micro_batches=4, steps=4, pp=2, dp=2, balance="params",
                probe=False, progress=False)
    cfgs = [make_config(base, comm_policy=policy, tie_embeddings=policy == "trirace", comm_log=tmp / policy)
            for policy in POLICIES]
    # the split backward: emulated layers take the I share at I, the stage the W share at W
    cfgs += [make_config(base, schedule=schedule, comm_log=tmp / schedule) for schedule in ("1f1b", "zb-h1")]
    # torch's executor of both schedules, on the same emulated model
    peers = [make_config(base, schedule=schedule, comm_policy="blocking") for schedule in ("1f1b", "zb-h1")]
    rows = run_local(cfgs + peers, systems=["trirace"] * len(cfgs) + [PEER_RUNNER] * len(peers), timeout_s=240)
    PEERS.extend(zip(peers, rows[len(cfgs):]))
    return list(zip(cfgs, rows[:len(cfgs)]))


PEERS: list = []  # (config, rows) of the torch peer's runs


def test_the_torch_peer_runs_the_emulated_model_with_the_same_losses(runs):
    ours = {cfg.parallel.schedule: rows for cfg, rows in runs if cfg.parallel.schedule != "2bw"}
    for cfg, rows in PEERS:
        assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in ours[cfg.parallel.schedule]], rel=1e-6)
        # it sleeps the same device time, optimizer step included: a step as long as ours, within the spread
        assert rows[-1]["step_time_s"] == pytest.approx(ours[cfg.parallel.schedule][-1]["step_time_s"], rel=0.25)


def test_every_policy_runs_the_emulated_model_clean_under_nccl_rules(runs):
    for cfg, rows in runs:
        assert len(rows) == cfg.steps
        report = check(cfg.observe.comm_log)
        assert report.ok, f"{cfg.comm.policy}: {report.summary()}"
        assert report.ops > 0


def test_the_policies_compute_the_same_losses(runs):
    untied = [[r["loss"] for r in rows] for cfg, rows in runs if not cfg.model.tie_embeddings]
    assert all(x == untied[0] for x in untied)


def test_zero_bubble_runs_emulated_with_1f1b_losses_and_its_backward_time(runs):
    (_, ofb), (zb_cfg, zb) = [(cfg, rows) for cfg, rows in runs if cfg.parallel.schedule != "2bw"]
    assert [r["loss"] for r in zb] == [r["loss"] for r in ofb]
    assert check(zb_cfg.observe.comm_log).ok
    # I and W together sleep what B does (the W share is taken where W runs): the same
    # computing per step, within the sleeps' own spread
    for a, b in zip(zb[1:], ofb[1:]):
        assert a["compute_s"] == pytest.approx(b["compute_s"], rel=0.05)


def test_a_step_takes_at_least_the_dilated_device_time_and_little_cpu(runs):
    cfg, rows = runs[0]
    em = cfg.emulation
    # the slower of two stages computes at least half of every micro-batch's sleeps
    half = em.dilation * cfg.parallel.micro_batches * (sum(em.times.forward_s) + sum(em.times.backward_s)) / 2
    steady = rows[1:]
    assert min(r["step_time_s"] for r in steady) >= half
    # computing is sleeping: the ranks' compute threads use a small part of it on the CPU
    assert max(max(r["rank_compute_cpu_s"]) for r in steady) < 0.25 * half
