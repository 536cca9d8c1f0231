"""The simulator: analytic cases with known answers, its bound, its folding, and the CLI."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trirace.policy import make_policy
from trirace.config import make_config
from trirace.plan import Layout, Op, build_schedule
from trirace.plan.schedule import schedule_for_policy
from trirace.plan.topology import Link, Topology
from trirace.sim.cluster import PRESETS, load_cluster
from trirace.sim.executor import Simulation, StageWork
from trirace.sim.fabric import Fabric
from trirace.sim.host import HostCpu
from trirace.sim.network import Network
from trirace.sim.simulate import ring, simulate


def cli(*args: str) -> SimpleNamespace:
    """The command in this process (a fresh interpreter per call costs seconds; integration/test_cli_runs.py
    runs the installed command in its own process)."""
    from trirace.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_one_link_two_equal_flows_share_it_and_finish_together():
    net = Network()
    link = net.resource("link", 100.0)
    net.start("a", 1000.0, ((link, 1.0),), 0.0)
    net.start("b", 1000.0, ((link, 1.0),), 0.0)
    assert net.rate("a") == net.rate("b") == 50.0
    assert net.next_completion() == pytest.approx(20.0)
    assert sorted(net.finished(20.0)) == ["a", "b"]


def test_a_flow_that_ends_gives_its_share_to_the_other():
    net = Network()
    link = net.resource("link", 100.0)
    net.start("short", 500.0, ((link, 1.0),), 0.0)
    net.start("long", 1500.0, ((link, 1.0),), 0.0)
    assert net.next_completion() == pytest.approx(10.0)  # 500 bytes at 50 B/s
    assert net.finished(10.0) == ["short"]
    assert net.rate("long") == 100.0
    assert net.next_completion() == pytest.approx(20.0)  # 1000 left at the full 100 B/s


def test_max_min_is_not_proportional_sharing():
    # Flow x crosses both links, y only link 1, z only link 2 (capacity 30): max-min gives
    # z what x cannot use on link 2.
    net = Network()
    l1, l2 = net.resource("l1", 10.0), net.resource("l2", 30.0)
    net.start("x", 1.0, ((l1, 1.0), (l2, 1.0)), 0.0)
    net.start("y", 1.0, ((l1, 1.0),), 0.0)
    net.start("z", 1.0, ((l2, 1.0),), 0.0)
    assert net.rate("x") == pytest.approx(5.0) and net.rate("y") == pytest.approx(5.0)
    assert net.rate("z") == pytest.approx(25.0)


def test_a_weighted_flow_counts_its_copies():
    net = Network()
    link = net.resource("uplink", 120.0)
    net.start("three copies", 1.0, ((link, 3.0),), 0.0)
    net.start("one", 1.0, ((link, 1.0),), 0.0)
    assert net.rate("three copies") == pytest.approx(30.0)  # 4 flows of 30 fill 120
    assert net.rate("one") == pytest.approx(30.0)


def test_folding_counts_copies_per_physical_link():
    # pp=2, dp=4 on 2 nodes of 4, pp-inner: each node holds two pipelines, so two copies of
    # each P2P class cross a node's ports, and the stage-0 ring crosses both uplinks once.
    topo = Topology(2, 4, Link(8e9, 1e-6), Link(8e8, 1e-5))
    fab = Fabric(Layout(2, 4, "pp-inner"), topo)
    assert max(w for _, w in fab.uses[("p2p", 0, "fwd")]) == 1.0  # each port carries one copy
    ring_uses = dict(fab.uses[("ring", 0)])
    inter = [r for r, _ in fab.uses[("ring", 0)] if fab.net.names[r].startswith("node")]
    assert inter and all(ring_uses[r] == 1.0 for r in inter)
    shared = Fabric(Layout(2, 2), Topology(4, 1, topo.intra, topo.inter), HostCpu(2))
    cpu = [(r, w) for r, w in shared.uses[("compute", 0)] if shared.net.names[r].startswith("cpu")]
    assert cpu == [(cpu[0][0], 2.0)]  # both replicas of the stage load the shared cores


def _stage(fwd: float, bwd: list[float], numels: list[int], policy: str, collective=None, opt: float = 0.0):
    return StageWork(fwd, sum(bwd), opt, numels, make_policy(policy),
                     collective or (lambda c: []), lambda c: False)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_allreduce_time_is_the_alpha_beta_formula(n):
    S, B, alpha = 40e6, 1e8, 1e-3
    topo = Topology(n, 1, Link(8e10, 0.0), Link(8 * B, alpha))
    fab = Fabric(Layout(1, n), topo)
    work = _stage(0.0, [0.0], [int(S // 4)], "blocking",
                  lambda c: ring(("ring", 0), n, c.nbytes, fab.latency[("ring", 0)]))
    sim = Simulation(build_schedule("1f1b", 1, 1, 1), fab, [work], 0)
    sim.run()
    expected = 2 * (n - 1) * alpha + 2 * (n - 1) / n * S / B
    norm = 2 * (n - 1) * alpha  # then OPT's global norm: a ring all-reduce of a few numbers, latency only
    assert sim.stats[(0, 0, 0)].end == pytest.approx(expected + norm, rel=1e-9)
    assert sim.stats[(0, 0, 0)].exposed["allreduce"] == pytest.approx(expected + norm, rel=1e-9)


def _critical_path(sched, fwd: list[float], bwd: list[float], opt: list[float]) -> float:
    """Longest path through the schedule with free transfers: each action waits for the
    previous one on its stage, a computation for the send of what it consumes (at that
    send's place in the sender's list; posting a receive waits for nothing), and an OPT for
    the step's last backward on every stage (the global norm's contributions)."""
    consumes = {Op.F: (-1, Op.SF), Op.B: (1, Op.SB)}
    done: dict[tuple[int, Op, int], float] = {}
    pos = [0] * sched.n_stages
    acts = [[a for a in acts if a.op not in (Op.AR, Op.RF, Op.RB)] for acts in sched.actions]
    clock = [0.0] * sched.n_stages
    progress = True
    while progress:
        progress = False
        for s in range(sched.n_stages):
            while pos[s] < len(acts[s]):
                a = acts[s][pos[s]]
                if a.op is Op.OPT:
                    last = (a.index + 1) * sched.micro_batches - 1
                    deps = [(t, Op.B, last) for t in range(sched.n_stages)]
                elif a.op in consumes and 0 <= s + consumes[a.op][0] < sched.n_stages:
                    deps = [(s + consumes[a.op][0], consumes[a.op][1], a.index)]
                else:
                    deps = []
                if any(dep not in done for dep in deps):
                    break
                start = max([clock[s]] + [done[dep] for dep in deps])
                dur = {Op.F: fwd[s], Op.B: bwd[s], Op.OPT: opt[s]}.get(a.op, 0.0)
                clock[s] = done[(s, a.op, a.index)] = start + dur
                pos[s] += 1
                progress = True
    return max(clock)


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["gpipe", "1f1b", "2bw"]), d=st.integers(1, 4), extra=st.integers(0, 3),
       steps=st.integers(1, 3), data=st.data())
def test_pipeline_without_communication_takes_its_compute_critical_path(kind, d, extra, steps, data):
    m = d + extra
    times = st.floats(0.01, 1.0)
    fwd = [data.draw(times) for _ in range(d)]
    bwd = [data.draw(times) for _ in range(d)]
    opt = [data.draw(st.floats(0.0, 0.2)) for _ in range(d)]
    topo = Topology(d, 1, Link(1e12, 0.0), Link(1e12, 0.0))
    sched = schedule_for_policy(build_schedule(kind, d, m, steps), True, False)
    stages = [_stage(fwd[s], [bwd[s]], [1], "fifo", opt=opt[s]) for s in range(d)]
    sim = Simulation(sched, Fabric(Layout(d, 1), topo), stages, activation_bytes=0)
    sim.run()
    assert sim.now == pytest.approx(_critical_path(sched, fwd, bwd, opt), rel=1e-9)


def test_no_stage_updates_before_every_stage_has_reduced():
    # The global norm: stage 0's gradient is large and its all-reduce slow, the head's tiny.
    # Under fifo each stage reduces asynchronously, yet no head OPT may end before stage
    # 0's reduction of the same step (runtime/gradnorm.py), and the head's wait for it is
    # exposed all-reduce time.
    topo = Topology(4, 1, Link(8e10, 0.0), Link(8e7, 1e-4))
    fab = Fabric(Layout(2, 2, "dp-inner"), topo)
    stages = [_stage(0.01, [0.01], [n], "fifo", lambda c: ring(("ring", s), 2, c.nbytes, fab.latency[("ring", s)]),
                     opt=0.001) for s, n in enumerate((2_000_000, 1000))]
    sim = Simulation(schedule_for_policy(build_schedule("2bw", 2, 2, 4), True, False), fab, stages, 4000,
                     record=True)
    sim.run()
    reduced = {int(name[2:].split(".")[0]): t1 for track, _, name, _, t1, _ in sim.rank_at[(0, 0)].rec.spans
               if track == "allreduce"}
    assert len(reduced) == 4 and min(reduced.values()) > 0.1  # 8 MB at 10 MB/s: slow
    for step, t in reduced.items():
        assert sim.stats[(1, 0, step)].end >= t
    assert sum(sim.stats[(1, 0, t)].exposed["allreduce"] for t in range(4)) > 0.5


def test_iteration_time_is_never_below_the_lower_bound():
    # Every combination (not a sample): the bound must hold for all of them.
    for pp, dp in [(1, 4), (2, 2), (4, 1), (2, 1)]:
        for link in ("50mbit", "250mbit", "2gbit"):
            for m in (4, 6):
                cfg = make_config({"model": "gpt-test", "pp": pp, "dp": dp, "micro_batches": m, "steps": 8,
                                   "data": "synthetic"})
                for policy in ("blocking", "fifo", "priority", "trirace"):
                    r = simulate(cfg, load_cluster("testbed", link=link), policy)
                    where = f"pp={pp} dp={dp} {link} m={m} {policy}"
                    assert r.iteration_time_s >= r.lower_bound_s * (1 - 1e-9), where
                    assert 0 < r.overlap_efficiency <= 1 + 1e-9, where


def test_overlap_beats_blocking_when_communication_matters():
    cfg = make_config({"model": "gpt-tiny", "pp": 2, "dp": 2, "micro_batches": 4, "steps": 8, "data": "synthetic"})
    cl = load_cluster("testbed", link="100mbit")
    times = {p: simulate(cfg, cl, p).iteration_time_s for p in ("blocking", "fifo", "trirace")}
    assert times["fifo"] < times["blocking"] and times["trirace"] < times["blocking"]


@pytest.mark.xfail(strict=True, reason="with launches fixed by the plan, trirace's gap placement is 1% slower than "
                   "fifo's single bucket in this cell: the reduction does not fit half a step of a 100 Mbit uplink")
def test_trirace_beats_fifo_on_a_shared_uplink():
    # One rank per node: the all-reduce and the P2P share every uplink. Exposed P2P alone
    # is not the measure (yielding moves a little P2P wait into the first, unforecast
    # steps); the step time and the exposed communication in all are.
    cfg = make_config({"model": "gpt-tiny", "pp": 2, "dp": 2, "micro_batches": 4, "steps": 12, "data": "synthetic",
                       "embedding_comm": "dense", "partition": [5, 2]})
    cl = load_cluster("testbed", link="100mbit")
    fifo, tri = simulate(cfg, cl, "fifo"), simulate(cfg, cl, "trirace")
    assert tri.iteration_time_s < fifo.iteration_time_s
    assert sum(tri.exposed_comm_s.values()) < sum(fifo.exposed_comm_s.values())


def test_a_1024_gpu_job_simulates_with_8_representative_ranks():
    cfg = make_config({"model": "gpt2-xl", "pp": 8, "dp": 128, "micro_batches": 16, "micro_batch_size": 1,
                       "seq_len": 1024, "steps": 6, "data": "synthetic"})
    r = simulate(cfg, load_cluster("a100-ib", nodes=128), "trirace")
    assert r.simulated_ranks == 8
    assert r.iteration_time_s >= r.lower_bound_s
    assert all(0 < m < 80 for m in r.memory_gb)
    assert r.in_flight[0] == 8 and r.in_flight[-1] == 1  # 1F1B keeps d - s micro-batches on stage s


def test_hierarchical_allreduce_is_used_where_it_pays():
    # 1f1b: each step's reduction is due right after its backward, so what it costs shows
    cfg = make_config({"model": "gpt-test", "pp": 1, "dp": 8, "micro_batches": 2, "steps": 6, "data": "synthetic",
                       "schedule": "1f1b"})
    cl = load_cluster("testbed", nodes=2, ranks_per_node=4, link="100mbit")
    tri, fifo = simulate(cfg, cl, "trirace"), simulate(cfg, cl, "fifo")
    assert tri.hierarchical == [True] and fifo.hierarchical == [False]
    assert tri.exposed_comm_s["allreduce"] < fifo.exposed_comm_s["allreduce"]


def test_sparse_chunk_is_simulated_for_the_table(tmp_path):
    """The table's gradient travels as its own sparse exchange (SP spans in the simulated
    timeline, one per step), which a dense run never has."""
    spans = {}
    for m in ("allgather", "dense"):
        cfg = make_config({"model": "gpt-tiny", "pp": 2, "dp": 2, "steps": 6, "data": "synthetic", "embedding_comm": m})
        r = simulate(cfg, load_cluster("testbed"), "trirace", trace_out=tmp_path / f"{m}.json")
        assert r.embedding_method == (m if m != "dense" else None)
        events = json.loads((tmp_path / f"{m}.json").read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        spans[m] = [e["name"] for e in events if e.get("ph") == "X" and e["name"].startswith("SP")]
    assert sorted(spans["allgather"]) == [f"SP{t}.5" for t in range(6)] and spans["dense"] == []


def test_simulate_cli_json_has_every_policy(tmp_path):
    out = tmp_path / "sim.json"
    p = cli("simulate", "--model", "gpt-test", "--data", "synthetic", "--policy", "all", "--json", str(out),
            "--trace-out", str(tmp_path / "tr"))
    assert p.returncode == 0, p.stderr
    payload = json.loads(out.read_text())
    assert [r["policy"] for r in payload["results"]] == ["blocking", "fifo", "priority", "trirace"]
    for r in payload["results"]:
        assert {"iteration_time_s", "lower_bound_s", "overlap_efficiency", "exposed_comm_s"} <= r.keys()
        assert set(r["exposed_comm_s"]) == {"p2p", "allreduce", "sparse"}
    trace = json.loads((tmp_path / "tr" / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert "F0" in names and "B0" in names


def test_sweep_ranks_layouts(tmp_path):
    out = tmp_path / "sweep.json"
    p = cli("simulate", "--model", "gpt-test", "--data", "synthetic", "--pp", "2", "--dp", "2", "--sweep",
            "--policy", "trirace", "--json", str(out))
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["sweep"]
    assert {(r["pp"], r["dp"]) for r in rows} == {(1, 4), (2, 2), (4, 1)}
    tps = [r["tokens_per_s"] for r in rows]
    assert tps == sorted(tps, reverse=True)


@pytest.mark.parametrize("args, msg", [
    (("--cluster", "nosuch"), "unknown cluster 'nosuch'"),
    (("--cluster", "a100-ib", "--nodes", "3"), "pp x dp = 4"),
    (("--calibration", "/nonexistent.json"), "does not exist"),
])
def test_simulate_bad_input_is_one_line(args, msg):
    p = cli("simulate", "--model", "gpt-test", *args)
    assert p.returncode == 2
    assert msg in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_list_clusters_and_a_cluster_file(tmp_path):
    p = cli("simulate", "--list-clusters")
    assert p.returncode == 0 and all(name in p.stdout for name in PRESETS)
    f = tmp_path / "mine.yaml"
    f.write_text("base: a100-ib\nranks_per_node: 4\ninter: {bandwidth: 100gbit, latency: 5us}\n")
    c = load_cluster(str(f))
    assert c.ranks_per_node == 4 and c.inter.bits_per_s == 1e11 and c.device.name.startswith("A100")
    f.write_text("base: a100-ib\nbogus: 1\n")
    with pytest.raises(Exception, match="unknown key 'bogus'"):
        load_cluster(str(f))
    assert math.isclose(load_cluster("testbed", link="1gbit").inter.bits_per_s, 1e9)
