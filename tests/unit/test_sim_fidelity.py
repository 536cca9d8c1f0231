"""What the simulator models beyond links and layers: a host whose cores several ranks
share (measured throughput, the CPU cost of transfers, the spread that lets replicas
drift apart, simulated unfolded), tied embeddings across stages,
NCCL's measured collective bandwidth in the presets, autotune's choice, the sweep over
chunk sizes and the planner's explanation. Analytic cases where there is an answer."""

from __future__ import annotations

import heapq
from dataclasses import replace
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trirace.policy import make_policy
from trirace.config import make_config
from trirace.errors import UsageError
from trirace.models.build import layer_param_numels
from trirace.plan import Layout, build_schedule
from trirace.plan.bounds import steady_steps
from trirace.plan.topology import Link, Topology
from trirace.sim import report
from trirace.sim.calibration import Calibration
from trirace.sim.cluster import PRESET_FILE, PRESETS, load_cluster
from trirace.sim.compute import ComputeNoise
from trirace.sim.executor import Simulation, StageWork
from trirace.sim.fabric import Fabric
from trirace.sim.host import HostCpu
from trirace.sim.network import Network
from trirace.sim.simulate import chunk_choices, ring, simulate


# ------------------------------------------------------------------ the shared host


def test_host_capacity_follows_the_measured_curve_and_never_beats_the_ideal():
    ideal = HostCpu(2)
    assert [ideal.capacity(k) for k in (0.001, 1, 2, 3, 8)] == [1, 1, 2, 2, 2]
    got = HostCpu(2, (0.95, 1.8, 1.7, 1.6))
    assert got.capacity(1) == pytest.approx(0.95)
    assert got.capacity(1.5) == pytest.approx((0.95 + 1.8) / 2)  # linear between measured points
    assert got.capacity(4) == got.capacity(9) == pytest.approx(1.6)  # flat past the last
    assert got.capacity(1e-6) == pytest.approx(0.95)  # a transfer's sliver of CPU is one worker's share
    noisy = HostCpu(2, (1.05, 2.3, 2.2))  # superlinear noise in a measurement is clipped
    assert noisy.capacity(1) == 1.0 and noisy.capacity(2) == 2.0 and noisy.capacity(3) == 2.0


def test_a_resource_with_a_load_curve_slows_every_flow_on_it():
    net = Network()
    cpu = net.resource("cpu", 2.0, HostCpu(2, (1.0, 1.5)).capacity)
    net.start("a", 1.0, ((cpu, 1.0),), 0.0)
    assert net.rate("a") == pytest.approx(1.0)  # alone, never above the curve's one worker
    net.start("b", 1.0, ((cpu, 1.0),), 0.0)
    assert net.rate("a") == net.rate("b") == pytest.approx(0.75)  # two workers get 1.5 between them
    assert net.next_completion() == pytest.approx(1 / 0.75)


def test_the_shared_cores_cpu_is_counted_by_what_each_flow_got_of_the_busy_cores():
    # Two cores that do 1.5 work-seconds per second with two workers on them: each worker
    # has a whole core and gets 0.75 work done per second, so 1 work-second costs 4/3 CPU
    # seconds. A transfer's CPU flow alongside makes three loads on the two cores.
    net = Network()
    cpu = net.resource("cpu", 2.0, HostCpu(2, (1.0, 1.5, 1.2)).capacity)
    net.start("a", 1.0, ((cpu, 1.0),), 0.0, tag="compute")
    net.start("b", 1.0, ((cpu, 1.0),), 0.0, tag="compute")
    assert net.cpu_at(0.4) == pytest.approx({"compute": 0.8})  # two busy cores for 0.4 s
    assert net.cpu_at(0.0) == {"compute": 0.0}  # asking drains nothing
    net.start("t", 0.2, ((cpu, 1.0),), 0.4, tag="transfer")  # three loads: 1.2 work/s, 0.4 each, all of 2 cores
    assert net.rate("t") == pytest.approx(0.4)
    t = 0.4 + 0.2 / 0.4
    assert net.finished(t) == ["t"]
    used = net.cpu_at(t)
    assert used == pytest.approx({"compute": 0.8 + 2 * 0.5 * 2 / 3, "transfer": 0.5 * 2 / 3})
    net.start("idle", 1.0, ((net.resource("link", 1.0), 1.0),), t, tag="compute")  # no curve: not the cores'
    assert sum(net.cpu_at(t + 0.1).values()) == pytest.approx(sum(used.values()) + 0.2)


def test_simulated_cpu_per_step_is_the_work_done_at_the_curve_and_fits_in_the_cores():
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batches": 4, "micro_batch_size": 2,
                       "seq_len": 64, "steps": 7, "data": "synthetic"})
    numels = layer_param_numels(cfg.spec)
    work = cfg.parallel.dp * (cfg.parallel.micro_batches * sum(f + b for f, b in zip(_HOST.forward_s, _HOST.backward_s))
                     + _HOST.optimizer_s_per_param * sum(map(sum, numels)))
    for policy in ("blocking", "fifo"):
        r = simulate(cfg, load_cluster("testbed", nodes=4, ranks_per_node=1, link="250mbit"), policy, _HOST)
        got = r.cpu_s_per_step
        # a work-second costs min(k, 2) / curve(k) CPU seconds with k loads: 1/0.95 to 2/1.6
        assert work / 0.95 * (1 - 1e-9) <= got["compute"] <= work * 2 / 1.6 * (1 + 1e-9), (policy, got, work)
        assert got["transfer"] > 0  # the calibration prices every message and byte
        steady = [r.step_times_s[t] for t in steady_steps(cfg.steps)]  # one simulated run (no spread measured)
        assert sum(got.values()) <= 2 * sum(steady) / len(steady) * (1 + 1e-9)
        # every replica simulated charges what the fold's copies were charged
        unfolded = simulate(cfg, load_cluster("testbed", nodes=4, ranks_per_node=1, link="250mbit"), policy, _HOST,
                            unfold=True).cpu_s_per_step
        assert unfolded == pytest.approx(got, rel=1e-9)


def test_a_transfer_costs_the_shared_cores_and_ends_with_its_cpu_work():
    # A blocking 2-member ring all-reduce of S bytes: each half moves S/2 per member, 1 s
    # of wire at 1 GB/s. At 2 ns/byte and 0.5 s per message on cores enough for both
    # copies, each half's CPU work is 0.5 + 2 = 2.5 s: the half ends with it, not the wire.
    # An all-reduce's bytes are priced as a collective's where the calibration measured one
    # apart: free collective bytes leave 0.5 s of CPU per half, under the wire's 1 s.
    S = 2e9
    topo = Topology(2, 1, Link(8e10, 0.0), Link(8e9, 0.0))
    host = HostCpu(2, per_message_s={"inter": 0.5}, per_byte_s={"inter": 2e-9})
    apart = HostCpu(2, per_message_s={"inter": 0.5}, per_byte_s={"inter": 2e-9}, per_byte_collective_s={"inter": 0.0})
    times = {}
    for name, h in (("costly", host), ("free", HostCpu(2)), ("collective bytes free", apart)):
        fab = Fabric(Layout(1, 2), topo, h)
        work = StageWork(0.0, 0.0, 0.0, [int(S // 4)], make_policy("blocking"),
                         lambda c, fab=fab: ring(("ring", 0), 2, c.nbytes, 0.0), lambda c: False)
        sim = Simulation(build_schedule("1f1b", 1, 1, 1), fab, [work], 0)
        sim.run()
        times[name] = sim.stats[(0, 0, 0)].end
    assert times == {"costly": pytest.approx(5.0), "free": pytest.approx(2.0), "collective bytes free": pytest.approx(2.0)}


def test_a_collective_message_waits_behind_what_a_busy_shaped_link_has_queued():
    # 4 nodes, stage 0's replicas on nodes 0 and 1 (dp-inner): their all-reduce crosses
    # node 0's uplink, which stage 0's activations to node 2 also cross, at 1e8 bytes/s
    topo = Topology(4, 1, Link(8e10, 0.0), Link(8e8, 0.0))
    fab = Fabric(Layout(2, 2), topo, link_queue=2e6)
    assert fab.queue_wait(("ring", 0)) == 0.0  # an idle link: nothing ahead
    fab.net.start("activation", 5e6, fab.uses[("p2p", 0, "fwd")], 0.0)
    assert fab.queue_wait(("ring", 0)) == pytest.approx(0.02)  # a full queue: 2e6 bytes ahead
    fab.net.advance(0.045)  # 0.5e6 bytes left: no more than that can be ahead
    assert fab.queue_wait(("ring", 0)) == pytest.approx(0.005)
    # stage 1's replicas on nodes 2 and 3: the activations arrive through their downlinks' queues
    assert fab.queue_wait(("ring", 1)) == pytest.approx(0.005)
    assert fab.net.finished(0.05) == ["activation"] and fab.queue_wait(("ring", 0)) == 0.0
    assert Fabric(Layout(2, 2), topo).queue_wait(("ring", 0)) == 0.0  # no queue measured: shared at once


def test_a_measured_link_queue_slows_collectives_and_keeps_the_bound():
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic"})
    # computation short beside the wire: the reductions bind
    base = Calibration("gpt-test", 2, 64, 1, [0.0005] * 7, [0.001] * 7, 1e-9, "testbed")
    cl = load_cluster("testbed", 4, 1, "50mbit")
    for policy in ("fifo", "priority"):
        free = simulate(cfg, cl, policy, base)
        # 2 MB: more than gpt-test's 32 KiB activations, so the other chunks in flight are what waits ahead
        queued = simulate(cfg, cl, policy, replace(base, link_queue={"inter": 2e6}))
        # A step's chunks leave one after another from the slot the plan gives them, so a
        # queue slows only what starts while other bytes are on the link: never faster.
        assert queued.iteration_time_s >= free.iteration_time_s
        assert queued.iteration_time_s >= queued.lower_bound_s


def test_measured_host_figures_slow_the_simulated_testbed():
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic"})
    base = Calibration("gpt-test", 2, 64, 1, [0.01] * 7, [0.02] * 7, 1e-9, "testbed")
    busy = Calibration("gpt-test", 2, 64, 1, [0.01] * 7, [0.02] * 7, 1e-9, "testbed",
                       cpu_throughput=[0.95, 1.8, 1.75, 1.7],
                       transfer_cpu={"inter": {"per_message_s": 2e-4, "per_byte_s": 1e-9}})
    cl = load_cluster("testbed")
    for policy in ("blocking", "trirace"):
        ideal, real = simulate(cfg, cl, policy, base), simulate(cfg, cl, policy, busy)
        assert real.iteration_time_s > ideal.iteration_time_s
        assert real.iteration_time_s >= real.lower_bound_s  # the bound assumes ideal cores


def test_the_sparse_exchange_pays_its_passes_over_the_table_on_the_shared_cores(tmp_path):
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic"})
    base = Calibration("gpt-test", 2, 64, 1, [0.01] * 7, [0.02] * 7, 1e-9, "testbed",
                       cpu_throughput=[0.95, 1.8, 1.75, 1.7],
                       transfer_cpu={"inter": {"per_message_s": 2e-4, "per_byte_s": 1e-9}})
    cl, local = load_cluster("testbed"), 0.05
    spans, got = {}, {}
    for name, cal in (("free", base), ("passes", replace(base, sparse_local_s=local))):
        # priority: the token table's exchange goes first, on the launcher, and holds the step's chunks behind it
        got[name] = simulate(cfg, cl, "priority", cal, trace_out=tmp_path / name / "trace.json")
        events = json.loads((tmp_path / name / "trace.json").read_text())["traceEvents"]
        spans[name] = [e["dur"] / 1e6 for e in events if e.get("ph") == "X" and e["name"].startswith("SP")]
    assert spans["free"] and max(spans["free"]) < local  # gpt-test's few rows cross a 250 Mbit link in far less
    assert len(spans["passes"]) == len(spans["free"]) and min(spans["passes"]) >= local  # at most a core each
    # each replica's passes are CPU the shared cores give every step: their work, counted at
    # what the busy cores gave (between the curve's 1.7 of 2 and the ideal)
    more = got["passes"].cpu_s_per_step["transfer"] - got["free"].cpu_s_per_step["transfer"]
    assert cfg.parallel.dp * local * (1 - 1e-9) <= more <= cfg.parallel.dp * local * 2 / 1.7 * (1 + 1e-9)
    assert got["passes"].iteration_time_s > got["free"].iteration_time_s
    assert got["passes"].iteration_time_s >= got["passes"].lower_bound_s
    # the dense method sums the table in place and only counts rows: it makes no such passes
    dense = cfg.with_(embedding_comm="dense")
    assert simulate(dense, cl, "priority", base).iteration_time_s == \
        simulate(dense, cl, "priority", replace(base, sparse_local_s=local)).iteration_time_s


def test_on_ideal_cores_a_step_costs_its_work_alone_whatever_the_partition():
    # on ideal cores the simulator charges a step's work alone: every micro-batch of every
    # replica through the whole model and every replica's optimizer over the whole model,
    # whatever the layout and partition, and with the tied table in two stages
    for tie, (nodes, rpn), partition in ((False, (4, 1), [4, 3]), (True, (2, 2), [5, 2])):
        cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batches": 3, "data": "synthetic",
                           "tie_embeddings": tie, "partition": partition})
        n = len(layer_param_numels(cfg.spec))
        cal = Calibration(cfg.model.name, cfg.parallel.micro_batch_size, cfg.tokens_seq, 1, [0.01 * (i + 1) for i in range(n)],
                          [0.02] * n, 3e-9, "testbed")
        got = simulate(cfg, load_cluster("testbed", nodes, rpn, "100mbit"), "fifo", cal).cpu_s_per_step["compute"]
        params = sum(sum(x) for x in layer_param_numels(cfg.spec))
        work = cfg.parallel.dp * (cfg.parallel.micro_batches * cal.iteration_s + params * cal.optimizer_s_per_param)
        assert got == pytest.approx(work, rel=1e-9)


# ------------------------------------------------------------------ replicas unfolded


_SPREAD = Calibration("gpt-test", 2, 64, 1, [0.002, 0.01, 0.01, 0.01, 0.01, 0.0005, 0.004],
                      [0.004, 0.02, 0.02, 0.02, 0.02, 0.001, 0.008], 1e-9, "testbed",
                      cpu_throughput=[0.95, 1.8, 1.75, 1.7], compute_spread=[0.02, 0.1, 0.1, 0.08],
                      transfer_cpu={"inter": {"per_message_s": 2e-4, "per_byte_s": 1e-9}})


def _run_clock(sim: Simulation) -> None:
    """Run the simulation's events alone, without the ranks' schedules (Simulation.run
    starts those)."""
    while sim.events:
        sim.now, _, fn = heapq.heappop(sim.events)
        fn()


@pytest.mark.parametrize("where,layout,tie,policy", [
    ("testbed", (2, 2), False, "fifo"), ("testbed", (2, 2), True, "trirace"), ("testbed", (1, 4), False, "blocking"),
    ("h100-100gbe", (2, 4), True, "priority"), ("testbed-2x2", (1, 4), False, "trirace")])
def test_unfolded_replicas_without_noise_predict_exactly_what_the_fold_does(where, layout, tie, policy):
    # With every computation at its mean the replicas stay in lockstep, which is what the
    # fold assumes: simulating each must give the same times (hierarchical, sparse and tied
    # reductions included).
    pp, dp = layout
    cfg = make_config({"model": "gpt-test", "pp": pp, "dp": dp, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic", "tie_embeddings": tie})
    if where == "testbed-2x2":
        cluster = load_cluster("testbed", nodes=2, ranks_per_node=2, link="50mbit")
    else:
        cluster = load_cluster(where, nodes=pp * dp if where == "testbed" else None, link="100mbit")
    folded = simulate(cfg, cluster, policy, unfold=False)
    unfolded = simulate(cfg, cluster, policy, unfold=True)
    assert (folded.simulated_ranks, unfolded.simulated_ranks) == (pp, pp * dp)
    assert unfolded.step_times_s == pytest.approx(folded.step_times_s, rel=1e-9, abs=1e-12)
    for kind, s in folded.exposed_comm_s.items():
        assert unfolded.exposed_comm_s[kind] == pytest.approx(s, rel=1e-9, abs=1e-12)


def test_a_collective_moves_when_its_last_member_issues_it_and_members_must_agree_on_the_order():
    topo = Topology(2, 1, Link(8e9, 0.0), Link(8e8, 0.0))
    work = StageWork(0.0, 0.0, 0.0, [1], make_policy("fifo"), lambda c: [], lambda c: False)
    sim = Simulation(build_schedule("1f1b", 1, 1, 1), Fabric(Layout(1, 2), topo, unfold=True), [work], 0)
    done = []
    group = sim.groups[0]
    group.submit(0, "chunk0", [], lambda: done.append(0))
    sim.at(1.0, lambda: group.submit(1, "chunk0", [], lambda: done.append(1)))
    sim.at(0.5, lambda: done.append("half"))
    _run_clock(sim)
    assert done == ["half", 0, 1]  # nothing moved before the second member issued it
    group.submit(0, "chunk1", [], lambda: None)
    with pytest.raises(RuntimeError, match="disagree on the order"):
        group.submit(1, "chunk2", [], lambda: None)


def test_measured_spread_unfolds_a_small_job_and_its_prediction_is_repeatable():
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic"})
    cluster = load_cluster("testbed", link="100mbit")
    first, again = simulate(cfg, cluster, "fifo", _SPREAD), simulate(cfg, cluster, "fifo", _SPREAD)
    assert first.simulated_ranks == 4 and first.step_times_s == again.step_times_s
    other = simulate(cfg.with_(seed=1), cluster, "fifo", _SPREAD)
    assert other.step_times_s != first.step_times_s  # the seed draws other durations
    folded = simulate(cfg, cluster, "fifo", _SPREAD, unfold=False)  # no noise where folded: lockstep
    assert folded.simulated_ranks == 2 and folded.step_times_s != first.step_times_s
    big = cfg.with_(dp=40)  # 80 ranks: past what is unfolded
    assert simulate(big, load_cluster("testbed", nodes=80, link="1gbit"), "fifo", _SPREAD).simulated_ranks == 2


def test_noisy_replicas_drift_apart_and_each_draw_sees_the_load_it_starts_under(tmp_path):
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic"})
    simulate(cfg, load_cluster("testbed", link="100mbit"), "fifo", _SPREAD, tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    # Every OPT starts when the step's global norm arrives, the same moment everywhere; each
    # rank's draw of its duration then ends it at its own time.
    ends = {(e["pid"], e["name"]): e["ts"] + e["dur"] for e in events if e.get("ph") == "X" and e["name"] == "OPT4"}
    assert len(ends) == 4  # every rank simulated
    assert len(set(ends.values())) == 4  # no two ranks finish step 4 at one moment
    topo = Topology(2, 1, Link(8e9, 0.0), Link(8e8, 0.0))
    work = StageWork(0.0, 0.0, 0.0, [1], make_policy("fifo"), lambda c: [], lambda c: False)
    sim = Simulation(build_schedule("1f1b", 1, 1, 1), Fabric(Layout(1, 2), topo, unfold=True), [work], 0)
    loads = []

    def duration(seconds, load):
        loads.append(load)
        return seconds
    for r in range(2):
        sim.run_compute(("compute", 0, r), 1.0, lambda: None, duration)
    sim.at(1.5, lambda: sim.run_compute(("compute", 0, 0), 1.0, lambda: None, duration))
    _run_clock(sim)
    assert loads == [1, 2, 1] and sim.computing == 0


def test_compute_noise_has_the_mean_time_and_varies_as_measured_at_its_load():
    noise = ComputeNoise(spread=(0.05, 0.1), iteration_s=1.0, seed=3)
    # cv = spread at the load (the last measured past it) * sqrt(iteration / seconds), at most 1
    for seconds, load, cv in ((1.0, 2, 0.1), (0.25, 2, 0.2), (0.25, 1, 0.1), (1.0, 7, 0.1), (1e-4, 1, 1.0)):
        draw = noise.sampler(rank=5)
        got = [draw(seconds, load) for _ in range(20000)]
        mean = sum(got) / len(got)
        sd = (sum((x - mean) ** 2 for x in got) / len(got)) ** 0.5
        assert mean == pytest.approx(seconds, rel=0.03) and sd / mean == pytest.approx(cv, rel=0.1)
    a, b = noise.sampler(rank=0), noise.sampler(rank=0)
    assert [a(0.5, 2) for _ in range(5)] == [b(0.5, 2) for _ in range(5)]  # seeded per rank
    assert noise.sampler(rank=0, draw=1)(0.5, 2) != noise.sampler(rank=0)(0.5, 2)
    assert ComputeNoise.of(None, 0) is None and ComputeNoise.of(_HOST, 0) is None  # nothing measured
    assert ComputeNoise.of(_SPREAD, 0).spread == (0.02, 0.1, 0.1, 0.08)


# ------------------------------------------------------------------ tied embeddings


def test_tied_embeddings_cost_an_allreduce_between_the_pipeline_ends():
    kw = {"model": "gpt-test", "pp": 2, "dp": 1, "steps": 6, "data": "synthetic", "micro_batches": 2}
    cl = load_cluster("testbed", nodes=2, link="20mbit")
    tied = simulate(make_config({**kw, "tie_embeddings": True}), cl, "blocking")
    untied = simulate(make_config({**kw, "tie_embeddings": False}), cl, "blocking")
    assert tied.exposed_comm_s["allreduce"] > 0 == untied.exposed_comm_s["allreduce"]
    assert tied.iteration_time_s > untied.iteration_time_s
    assert tied.iteration_time_s >= tied.lower_bound_s
    assert tied.bound_parts["link"] > untied.bound_parts["link"]  # the bound counts the tie's bytes too


# ------------------------------------------------------------------ presets


def test_presets_carry_collective_bandwidth_with_their_sources():
    text = PRESET_FILE.read_text()
    for name in ("a100-ib", "h100-ib", "h100-100gbe", "a100-25gbe"):
        c = PRESETS[name]
        assert set(c.collective) == {"intra", "inter"}
        assert c.collective_factor("intra") >= 1 and c.collective_factor("inter") >= 1
    assert PRESETS["h100-100gbe"].collective_factor("inter") == pytest.approx(12.5 / 6)  # 100 Gbit/s, 6 GB/s bus
    assert PRESETS["a100-25gbe"].collective_factor("inter") == pytest.approx(3.125 / 1.7)
    assert text.count("github.com/NVIDIA/") >= 5  # every figure says where it is from
    assert PRESETS["testbed"].collective == {} and PRESETS["testbed"].shared_cores == 2
    # another inter-node rate: the preset's measured figure for it no longer applies
    assert "inter" not in load_cluster("a100-ib", link="25gbit").collective


def test_bus_bandwidth_slows_a_reduction_bound_job(tmp_path):
    cfg = make_config({"model": "gpt2-medium", "pp": 1, "dp": 16, "micro_batches": 1, "micro_batch_size": 1,
                       "seq_len": 256, "steps": 6, "data": "synthetic"})
    poor = load_cluster("h100-100gbe")
    nominal = load_cluster(str(_yaml(poor, tmp_path)))
    slow, fast = simulate(cfg, poor, "blocking"), simulate(cfg, nominal, "blocking")
    assert slow.iteration_time_s > 1.5 * fast.iteration_time_s  # 6 GB/s achieved of 12.5 nominal
    # the bound counts the same bytes: with no P2P (pp=1) its link term scales by the factor
    assert slow.bound_parts["link"] == pytest.approx(poor.collective_factor("inter") * fast.bound_parts["link"])
    assert slow.bound_binding == "link" and slow.iteration_time_s >= slow.lower_bound_s


def _yaml(c, where):
    f = where / "nominal.yaml"
    f.write_text(f"base: {c.name}\ninter: {{bandwidth: {c.inter.bits_per_s}, latency: {c.inter.latency_s}}}\n"
                 f"intra: {{bandwidth: {c.intra.bits_per_s}, latency: {c.intra.latency_s}}}\n")
    return f


def test_a_cluster_file_may_give_its_own_bus_bandwidth(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("base: a100-ib\ninter: {bandwidth: 100gbit}\ncollective: {inter: 8GB/s}\n")
    c = load_cluster(str(f))
    assert c.collective["inter"] == 8e9 and c.collective["intra"] == PRESETS["a100-ib"].collective["intra"]
    f.write_text("base: a100-ib\ncollective: {nvlink: 8GB/s}\n")
    with pytest.raises(UsageError, match="collective: expected"):
        load_cluster(str(f))
    f.write_text("base: a100-ib\ncollective: {inter: 190}\n")  # bits or bytes? refused
    with pytest.raises(UsageError, match="give a unit"):
        load_cluster(str(f))
    f.write_text("base: a100-ib\ninter: {latency: 3us, bandwidth: 1.6e+12}\nintra: {latency: 2e-06}\n")
    c = load_cluster(str(f))  # the same bandwidth in YAML's float, latency alone changed: figures kept for intra
    assert c.intra.latency_s == 2e-6 and c.collective["intra"] == PRESETS["a100-ib"].collective["intra"]
    assert "inter" not in c.collective


# ------------------------------------------------------------------ autotune, sweep, why


def test_autotune_is_simulated_as_the_fastest_of_its_trials():
    cfg = make_config({"model": "gpt-tiny", "pp": 2, "dp": 2, "steps": 6, "data": "synthetic"})
    cl = load_cluster("testbed", link="100mbit")
    trials = [simulate(cfg.with_(partition_mb=p, credit_mb=c), cl, "trirace")
              for p, c in chunk_choices("trirace")[1:]]
    tuned = simulate(cfg.with_(autotune=True), cl, "trirace")
    assert tuned.iteration_time_s == min(t.iteration_time_s for t in trials)
    assert chunk_choices("blocking") == [(None, None)]
    fifo = chunk_choices("fifo")
    assert all(c is None for _, c in fifo) and len(set(fifo)) == len(fifo)  # no cap in flight; no trial twice


def test_sweep_tries_chunk_sizes_and_says_why():
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "steps": 6, "data": "synthetic"})
    payload = report.sweep(cfg, load_cluster("testbed", link="100mbit"), ("blocking", "trirace"))
    rows = payload["sweep"]
    tri = [r for r in rows if r["policy"] == "trirace" and (r["pp"], r["dp"]) == (rows[0]["pp"], rows[0]["dp"])]
    assert len({r["chunk_mb"] for r in tri}) > 2  # the default and autotune's sizes
    why = payload["why"]
    assert why["binding"] == max(why["bound_parts"], key=why["bound_parts"].get)
    assert why["bound_s"] <= why["iteration_s"]
    text = report.why_text(why)
    assert "Bound:" in text and "To move the bound:" in text
    table = report.sweep_table(payload)
    assert "| in flight (MiB) |" in table and "| trirace | 2 | 4 |" in table  # trirace's own: 2 MiB chunks, 4 in flight


# ------------------------------------------------------------------ the bound holds everywhere


_HOST = Calibration("gpt-test", 2, 64, 1, [0.002, 0.01, 0.01, 0.01, 0.01, 0.0005, 0.004],
                    [0.004, 0.02, 0.02, 0.02, 0.02, 0.001, 0.008], 1e-9, "testbed",
                    cpu_throughput=[0.95, 1.8, 1.75, 1.7, 1.7, 1.65, 1.6, 1.6],
                    transfer_cpu={"inter": {"per_message_s": 2e-4, "per_byte_s": 1e-9},
                                  "intra": {"per_message_s": 1e-4, "per_byte_s": 4e-10}})


_SPREAD_8 = Calibration(**{**_HOST.__dict__, "compute_spread": [0.02] + [0.1] * 7, "link_share": {"inter": 0.8}})


@settings(max_examples=30, deadline=None)
@given(layout=st.sampled_from([(1, 4), (2, 2), (4, 1), (2, 4), (4, 2)]),
       where=st.sampled_from(["testbed", "testbed-calibrated", "testbed-spread", "a100-25gbe", "h100-100gbe",
                              "h100-ib"]),
       rate=st.sampled_from(["50mbit", "250mbit", "1gbit", None]),
       policy=st.sampled_from(["blocking", "fifo", "priority", "trirace"]),
       tie=st.booleans(), m=st.sampled_from([4, 6]))
def test_no_simulated_run_beats_the_lower_bound(layout, where, rate, policy, tie, m):
    # a policy that alternates long and short steps (1x4 @ 50 Mbit trirace, tied, m=4) has
    # a median step, or an odd window's mean, under the bound: whole pairs must not (sim/simulate.py)
    pp, dp = layout
    cfg = make_config({"model": "gpt-test", "pp": pp, "dp": dp, "micro_batches": m, "micro_batch_size": 2,
                       "seq_len": 64, "steps": 7, "data": "synthetic", "tie_embeddings": tie})
    preset = where.removesuffix("-calibrated").removesuffix("-spread")
    nodes = {"testbed": pp * dp}.get(preset)
    cluster = load_cluster(preset, nodes=nodes, ranks_per_node=1 if preset == "testbed" else 4, link=rate)
    cal = {"testbed-calibrated": _HOST, "testbed-spread": _SPREAD_8}.get(where)
    r = simulate(cfg, cluster, policy, cal)
    # (a millionth: a window's edges cut work in flight by nanoseconds)
    assert r.iteration_time_s >= r.lower_bound_s * (1 - 1e-6), (r.iteration_time_s, r.bound_parts)
    assert 0 < r.overlap_efficiency <= 1 + 1e-6
    if r.runs == 1 and cluster.shared_cores:  # nor does a step use more CPU than the cores have
        steady = [r.step_times_s[t] for t in steady_steps(cfg.steps)]
        assert sum(r.cpu_s_per_step.values()) <= cluster.shared_cores * sum(steady) / len(steady) * (1 + 1e-9)


# ------------------------------------------------------------------ a send returns before its bytes arrive


def test_a_buffered_send_frees_the_blocking_sender_but_its_bytes_still_cross():
    # gpipe: its forwards' sends go alone (under 1F1B a send shares its batch with a
    # receive, and the batch ends when both do)
    kw = {"model": "gpt-test", "pp": 2, "dp": 1, "steps": 6, "data": "synthetic", "micro_batches": 2,
          "micro_batch_size": 2, "seq_len": 64, "schedule": "gpipe"}
    cfg = make_config(kw)
    times = ([0.001] * 7, [0.002] * 7)
    plain = Calibration("gpt-test", 2, 64, 1, *times, 1e-9, "testbed")
    buffered = Calibration("gpt-test", 2, 64, 1, *times, 1e-9, "testbed", send_buffer={"inter": 4 << 20})
    cl = load_cluster("testbed", nodes=2, link="10mbit")  # P2P dominates: 64 KiB takes 52 ms
    a, b = simulate(cfg, cl, "blocking", plain), simulate(cfg, cl, "blocking", buffered)
    assert b.iteration_time_s < a.iteration_time_s  # the sender computes on while its bytes cross
    assert b.iteration_time_s >= b.lower_bound_s == a.lower_bound_s  # the link still carries every byte
    # the receiver waits as long for each activation: at least the wire time of what it gets
    wire = 2 * cfg.activation_bytes * 8 / 10e6
    assert b.exposed_comm_s["p2p"] >= wire / 2


# ------------------------------------------------------------------ a shaped link favours its oldest flow


def test_the_oldest_senior_flow_gets_its_measured_share_and_others_stay_fair():
    net = Network()
    link = net.resource("node-up", 100.0, seniority=4.0)  # a share of 0.8 for the first of two
    other = net.resource("node-up", 100.0)
    net.start("first", 100.0, ((link, 1.0),), 0.0, senior=True)
    net.start("second", 100.0, ((link, 1.0),), 0.0, senior=True)
    assert (net.rate("first"), net.rate("second")) == (pytest.approx(80.0), pytest.approx(20.0))
    net.start("bulk", 100.0, ((link, 1.0),), 0.0)  # not senior (a ring chunk): counts once, as the second
    assert net.rate("first") == pytest.approx(400 / 6) and net.rate("bulk") == pytest.approx(100 / 6)
    net.start("a", 100.0, ((other, 1.0),), 0.0, senior=True)
    net.start("b", 100.0, ((other, 1.0),), 0.0, senior=True)
    assert net.rate("a") == pytest.approx(50.0)  # no seniority there: fair
    assert net.finished(1.5) == ["first"]  # 100 bytes at 200/3 per s
    assert net.rate("second") == pytest.approx(80.0)  # now the oldest


def test_measured_link_share_makes_the_fabric_favour_the_oldest_activation():
    topo = Topology(2, 2, Link(8e9, 0.0), Link(8e8, 0.0))
    fair, unfair = Fabric(Layout(2, 2), topo, unfold=True), Fabric(Layout(2, 2), topo, unfold=True, link_share=0.8)
    assert fair.net.seniority == {}
    favoured = {unfair.net.names[r].split("x")[0] for r in unfair.net.seniority}
    assert favoured == {"node-up", "node-down"}
    assert all(w == pytest.approx(4.0) for w in unfair.net.seniority.values())  # 0.8 / (1 - 0.8)
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic"})
    cluster = load_cluster("testbed", nodes=2, ranks_per_node=2, link="20mbit")
    cal = Calibration(**{**_SPREAD.__dict__, "compute_spread": []})
    shared = Calibration(**{**cal.__dict__, "link_share": {"inter": 0.9}})
    for policy in ("blocking", "fifo"):
        a, b = simulate(cfg, cluster, policy, cal, unfold=True), simulate(cfg, cluster, policy, shared, unfold=True)
        # the two replicas' activations leave node 0 together: taking turns, the first is early
        assert b.iteration_time_s < a.iteration_time_s and b.iteration_time_s >= b.lower_bound_s


def test_steady_steps_are_measured_over_whole_pairs():
    # 2bw's one-step delay can make a policy alternate long and short steps (a reduction
    # deferred every other step); seven steps keep three steady ones, and the iteration
    # time is the mean of the last whole pair, which meets the link bound
    cfg = make_config({"model": "gpt-test", "pp": 1, "dp": 4, "micro_batches": 4, "micro_batch_size": 2, "seq_len": 64,
                       "steps": 7, "data": "synthetic", "tie_embeddings": True})
    r = simulate(cfg, load_cluster("testbed", nodes=4, ranks_per_node=1, link="50mbit"), "trirace")
    steady = [r.step_times_s[t] for t in steady_steps(cfg.steps)]
    assert len(steady) == 3
    assert r.iteration_time_s == pytest.approx(sum(steady[1:]) / 2)
    assert r.iteration_time_s >= r.lower_bound_s * (1 - 1e-6)
