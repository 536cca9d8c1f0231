"""The job plan: one pure function whose decisions both executors carry out."""

import json

import pytest
import torch

from trirace.cli import main
from trirace.policy.driver import StageDriver
from trirace.config import make_config
from trirace.plan import Action, Op
from trirace.plan.schedule import p2p_groups
from trirace.plan.planner import plan_job
from trirace.plan.topology import Link, Topology, single_node
from trirace.runtime.stage import StageModel
from trirace.sim.cluster import load_cluster
from trirace.sim.simulate import simulate

QUICK = dict(data="synthetic", micro_batch_size=2, seq_len=16, balance="params", progress=False)


@pytest.mark.parametrize("model,pp,tie", [("gpt-test", 2, False), ("gpt-test", 3, True), ("gpt-test", 1, True),
                                          ("bert-test", 2, True), ("bert-test", 1, False)])
def test_parameter_layout_matches_the_modules(model, pp, tie):
    """The plan's per-stage parameter sizes, sparse table and tied parameter are what the
    stage's real modules hold (the trainer refuses to run otherwise)."""
    cfg = make_config(QUICK, model=model, pp=pp, dp=2, tie_embeddings=tie, embedding_comm="auto")
    plan = plan_job(cfg, single_node(cfg.world_size))
    for st in plan.stages:
        m = StageModel(cfg.spec, st.layers, 0, 1, "adam", 1e-3, torch.device("cpu"))
        assert tuple(m.numels) == st.numels
        assert m.tied == st.tied_param
        assert (m.table if cfg.parallel.dp > 1 else None) == st.sparse_param


def _two_level(nodes: int, per_node: int) -> Topology:
    return Topology(nodes, per_node, Link(100e9, 2e-6), Link(1e9, 50e-6))


def test_hierarchy_and_chunks_are_the_policys_decision():
    cfg = make_config(QUICK, model="gpt-tiny", pp=2, dp=4, rank_order="dp-inner")
    topo = _two_level(4, 2)
    tri = plan_job(cfg, topo)
    assert all(s.hierarchical for s in tri.stages)  # each stage's 4 replicas span 2 nodes
    assert tri.stages[0].policy.partition_bytes == 8 << 20  # 100 ms of 1 Gbit/s is 12.5 MB: capped
    fifo = plan_job(cfg.with_(comm_policy="fifo"), topo)
    assert not any(s.hierarchical for s in fifo.stages)
    assert [a.op for a in fifo.schedule.actions[0]].count(Op.AR) == cfg.steps
    blocking = plan_job(cfg.with_(comm_policy="blocking"), topo)
    # Blocking keeps AR right after the step's last backward; the others defer it.
    first_ar = [str(a) for a in blocking.schedule.actions[0]].index("AR0")
    assert str(blocking.schedule.actions[0][first_ar - 1]).startswith("B")


def test_the_simulator_runs_the_plan():
    cfg = make_config(QUICK, model="gpt-tiny", pp=2, dp=4, steps=4, micro_batches=4)
    cluster = load_cluster("testbed", nodes=4, ranks_per_node=2, link="1gbit")
    res = simulate(cfg, cluster, "trirace")
    plan = plan_job(cfg, cluster.topology(cfg.world_size))
    assert res.partition == list(plan.partition)
    assert res.rank_order == plan.layout.order
    assert res.hierarchical == [s.hierarchical for s in plan.stages]


def test_driver_launches_chunks_at_the_units_the_plan_gives_them():
    """fifo: every chunk right after the step's last backward (and the transfer run that
    follows it), none before; AR gets nothing left; the step closes once all are done."""
    cfg = make_config(QUICK, model="gpt-test", pp=2, dp=2, steps=2, comm_policy="fifo", partition_mb=0.01)
    plan = plan_job(cfg, single_node(4))
    st = plan.stages[1]
    d = StageDriver(st.policy, list(st.numels), "intra", plan.schedule.actions[1], reduces=True)
    units = p2p_groups(plan.schedule.actions[1])
    last_b = next(u for u, g in enumerate(units) if g[0] == Action(Op.B, cfg.parallel.micro_batches - 1))
    assert all(d.launches_after(u) == [] for u in range(last_b))
    d.backward_begins(0, last_b)
    chunks = d.plan(0)
    assert len(chunks) > 2
    assert d.launches_after(last_b) == []  # the backward's send to stage 0 leaves first
    assert units[last_b + 1][0].op is Op.SB and d.launches_after(last_b + 1) == chunks
    assert d.deadline(0) == []
    for c in chunks:
        assert not d.reduced(0)
        d.chunk_done(c)
    assert d.reduced(0)
    done, kind = d.close_step(0)
    assert done == chunks and kind.value == "allreduce"


def test_plan_command_prints_the_plan(capsys):
    args = ["plan", "--model", "gpt-test", "--data", "synthetic", "--pp", "2", "--dp", "2", "--seq-len", "16",
            "--micro-batch-size", "2", "--balance", "params", "--tie-embeddings"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "partition: [3, 4]" in text and "stage 1:" in text and "tied param" in text
    assert main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["partition"] == [3, 4] and plan["tied"] and plan["tie_pairs"] == [[0, 2], [1, 3]]
    assert plan["stages"][0]["sparse_param"] == 0 and plan["actions"][1][0] == "RF0"
