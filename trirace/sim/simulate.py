"""Predict a training job: plan it exactly as the runtime would, then run the simulated
executor and summarise what it saw.

The plan is the runtime's own (plan/job.py: partition balanced on the compute model's
per-layer times as the runtime balances measured ones, placement, per-stage policies,
schedule, hierarchy, sparse and tied parameters); the simulated executor drives the same
StageDriver as the runtime. Only the embedding method for "auto" is estimated here, from
the rows the job's data touches, where the runtime decides it step by step.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..policy import sparse as sparse_cost
from ..policy.autotune import TRIALS
from ..policy.policies import POLICIES, make_policy
from ..config import TrainConfig
from ..errors import UsageError
from ..obs.timeline import write_trace
from ..plan import stage_ranges
from ..plan.bounds import Bound, lower_bound, plan_link_bytes, steady_steps
from ..plan.job import JobPlan
from ..plan.planner import plan_job, table_sent
from ..plan.topology import INTER, INTRA, Topology
from ..plan.transfers import Chunk, Kind
from .calibration import Calibration
from .cluster import Cluster
from ..plan.memory import stage_memory
from .compute import ComputeModel, ComputeNoise
from .executor import Phase, Simulation, StageWork
from .fabric import Fabric
from .host import HostCpu


# Past this many ranks, one representative per stage: ten runs of every rank get slow (a
# 64-rank testbed job, four policies: 58 s; 4 ranks, --sweep: 14 s).
UNFOLD_MAX_RANKS = 16
NOISE_DRAWS = 10  # simulated runs of a job with noise: with 3, one prediction moved 5 points between seeds


@dataclass
class SimResult:
    policy: str
    iteration_time_s: float  # mean step time over the steady steps (the median over noisy runs)
    tokens_per_s: float
    lower_bound_s: float
    bound_binding: str
    bound_parts: dict[str, float]  # the bound's terms: slowest rank's compute, shared cores, busiest link
    overlap_efficiency: float
    exposed_comm_s: dict[str, float]  # per kind, mean per rank and step
    step_times_s: list[float]  # the first simulated run's
    memory_gb: list[float]  # peak per stage
    in_flight: list[int]  # peak micro-batches kept for backward, per stage
    hierarchical: list[bool]
    partition: list[int]
    rank_order: str
    chunk_mb: float | None
    embedding_method: str | None
    compute_source: str
    simulated_ranks: int
    runs: int  # simulated runs the prediction is the median of (more than one with compute noise)
    events: int
    wall_s: float
    # the shared cores' CPU seconds per steady step, all ranks: computation's, transfers'
    # (where the cluster shares a host's cores; sim_accuracy sets what a run's processes
    # used beside it). A computation's drawn duration is charged whole, so with compute
    # noise this moves with the draws a little (pp2 dp2 trirace: 1.311 s without, 1.344 with).
    cpu_s_per_step: dict[str, float] = field(default_factory=dict)


def ring(cls: tuple, n: int, nbytes: float, alpha: float) -> list[Phase]:
    """A ring all-reduce of `nbytes` over n members: n-1 reduce-scatter steps, then n-1
    all-gather steps, each moving nbytes/n per member. Consecutive steps cross the same
    links with the same bytes, so each half is one phase (exact in the fluid model while
    contention holds still during it)."""
    if n <= 1:
        return []
    half = Phase(cls, (n - 1) / n * nbytes, (n - 1) * alpha, n - 1)
    return [half, half]


def apply_calibration(cluster: Cluster, topo: Topology, cal: Calibration | None) -> Topology:
    """Measured links replace nominal ones (only for the cluster the calibration was taken on)."""
    if cal is None:
        return topo
    if cal.cluster != cluster.name:
        raise UsageError(f"calibration was taken on cluster {cal.cluster!r}, not {cluster.name!r}")
    intra, inter = cal.link("intra"), cal.link("inter")
    return Topology(topo.nodes, topo.ranks_per_node, intra or topo.intra, inter or topo.inter)


def check(cfg: TrainConfig, cluster: Cluster, policy: str, calibration: Calibration | None = None) -> Topology:
    """What would stop `simulate` on this job, found before anything runs (a sweep checks
    every job first, so a bad one ends in one line, not after a progress bar)."""
    if policy not in POLICIES:
        raise UsageError(f"unknown communication policy {policy!r}; choose from {', '.join(POLICIES)}")
    if calibration is not None:
        calibration.check(cfg.spec, cfg.parallel.micro_batch_size, cfg.tokens_seq)
    return apply_calibration(cluster, cluster.topology(cfg.world_size), calibration)


def chunk_choices(policy: str) -> list[tuple[float | None, float | None]]:
    """(partition MiB, credit MiB) pairs to try for a policy: its own default (None, None),
    then autotune's trials (policy/autotune.py; a policy without a credit bound keeps none)."""
    if policy == "blocking":
        return [(None, None)]
    unbounded = make_policy(policy).credit_bytes is None
    return list(dict.fromkeys([(None, None)] + [(p, None if unbounded else c) for p, c in TRIALS]))


def simulate(cfg: TrainConfig, cluster: Cluster, policy: str, calibration: Calibration | None = None,
             trace_out: Path | None = None, unfold: bool | None = None) -> SimResult:
    """Predict `cfg` on `cluster` under `policy`. `unfold`: simulate every replica (True),
    one per stage (False), or decide (None: every replica where compute noise is measured
    and the job is small)."""
    if cfg.comm.autotune and policy != "blocking":
        return _autotuned(cfg, cluster, policy, calibration, trace_out)
    wall0 = time.perf_counter()
    spec = cfg.spec
    topo = check(cfg, cluster, policy, calibration)
    cfg = cfg.with_(comm_policy=policy)
    compute = ComputeModel.build(spec, cfg.parallel.micro_batch_size, cfg.tokens_seq, cluster.device, cfg.optim.optimizer,
                                 calibration)
    if cfg.model.recompute:
        compute = compute.recomputing(spec)
    plan = plan_job(cfg, topo, lambda: [f + b for f, b in zip(compute.forward_s, compute.backward_s)],
                    collective_factor=cluster.collective_factor(INTER))
    sizes, layout = list(plan.partition), plan.layout
    # Where ranks share cores and the calibration measured how unevenly, replicas drift
    # apart: simulate each (sim/fabric.py), while the job is small enough to.
    noise = ComputeNoise.of(calibration, cfg.seed) if cluster.shared_cores else None
    if unfold is None:
        unfold = noise is not None and layout.world_size <= UNFOLD_MAX_RANKS
    noise = noise if unfold else None  # folded replicas would all draw the same: lockstep again
    host = HostCpu.of(cluster.shared_cores, calibration)
    share = calibration.link_share.get("inter", 0.5) if calibration is not None else 0.5
    queue = calibration.link_queue.get("inter", 0.0) if calibration is not None else 0.0

    def new_fabric() -> Fabric:  # each simulated run's network holds its own flows
        return Fabric(layout, topo, host, plan.tied, unfold=unfold, link_share=share, link_queue=queue)
    fabric = new_fabric()
    tokens = cfg.tokens_per_replica_step
    if calibration is not None and calibration.rows_touched.get(str(tokens)):
        rows = calibration.rows_touched[str(tokens)]
    else:
        rows = sparse_cost.expected_rows(spec.vocab_size, tokens)
    stages, methods = [], []
    for st in plan.stages:
        link = topo.link(st.reduction_link)
        fwd_s, bwd_s = compute.stage(st.layers)
        method = None
        if st.sparse_param is not None:
            method = cfg.comm.embedding_comm
            if method == "auto":
                method = sparse_cost.choose(cfg.parallel.dp, spec.vocab_size, spec.d_model, math.ceil(rows),
                                            alpha_s=link.latency_s, bytes_per_s=link.bytes_per_s)
            methods.append(method)
        stages.append(StageWork(fwd_s, bwd_s, compute.optimizer_s_per_param * sum(st.numels),
                                list(st.numels), st.policy,
                                _collective(st.stage, fabric, topo, st.hierarchical, method, rows, spec.vocab_size,
                                            spec.d_model, cluster.collective_factor,
                                            calibration.sparse_local_s if calibration is not None else 0.0),
                                lambda c, h=st.hierarchical: h and c.kind is Kind.ALLREDUCE, st.sparse_param,
                                st.grad_elem_size))
    hier = [st.hierarchical for st in plan.stages]
    sched = plan.schedule
    first = plan.stages[0]
    tie_bytes = 4.0 * first.numels[first.tied_param] if plan.tied else 0.0  # fp32, as runtime/reduction.py sends it
    # NCCL's all-reduce between the ends moves at the bus bandwidth of the link they share
    tie_factor = cluster.collective_factor(topo.link_between(*plan.tie_pairs()[0])) if plan.tied else 1.0
    sims = []
    for draw in range(NOISE_DRAWS if noise else 1):  # with noise, the median over several runs
        sim = Simulation(sched, fabric if draw == 0 else new_fabric(), stages, cfg.activation_bytes,
                         cluster.collective_streams, record=trace_out is not None and draw == 0, tie_bytes=tie_factor * tie_bytes,
                         send_buffer=calibration.send_buffer if calibration is not None else None,
                         noise=noise, draw=draw)
        sim.run()
        sims.append(sim)

    def step_times(sim: Simulation) -> list[float]:
        ends = [sim.stats[(cfg.parallel.pp - 1, 0, t)].end for t in range(cfg.steps)]  # as the runtime's reporter sees them
        return [b - a for a, b in zip([0.0, *ends[:-1]], ends)]
    kept = steady_steps(cfg.steps)  # the steps trirace bench measures
    # Each run's mean over whole pairs of them (its throughput there), and the median over
    # noisy runs. Not the median step, as the bench reports measured runs: steps are not
    # barriers, and under 2bw's one-step delay a policy that defers work alternates long and
    # short steps (trirace on a slow link defers a reduction every other step). The median
    # step, or the mean of an odd count, can then beat the bound that the run's throughput
    # obeys; an even count of steps holds whole pairs. Exposed time and
    # CPU per step are taken over the same steps, so they describe the step time beside them.
    pairs = range(kept.start + len(kept) % 2, kept.stop) if len(kept) > 1 else kept
    it = statistics.median(statistics.fmean(step_times(sim)[t] for t in pairs) for sim in sims)
    exposed = {k: statistics.fmean(sim.stats[(r.stage, r.replica, t)].exposed[k]
                                   for sim in sims for r in sim.ranks for t in pairs)
               for k in ("p2p", "allreduce", "sparse")}
    bound = _bound(cfg, plan, cluster, stages, table_sent(cfg, plan, rows), tie_bytes)
    versions = sched.staleness + 1
    in_flight = [max(r.peak_in_flight for sim in sims for r in sim.ranks if r.stage == s) for s in range(cfg.parallel.pp)]
    mem = [stage_memory(spec, layers, cfg.parallel.micro_batch_size, cfg.tokens_seq, peak, versions,
                        cfg.optim.optimizer, cfg.model.precision, cfg.model.recompute)["total"] / 1e9
           for layers, peak in zip(stage_ranges(sizes), in_flight)]
    if trace_out is not None:
        _trace(sims[0], trace_out, cfg)
    chunk = stages[0].policy.partition_bytes
    parts = {"compute": bound.compute_s, "cpu": bound.cpu_s, "link": bound.link_s}
    if not cluster.shared_cores:  # a device per rank: the mean rank's compute never binds, nothing to explain
        del parts["cpu"]
    return SimResult(policy, it, cfg.tokens_per_step / it, bound.seconds, bound.binding, parts, bound.seconds / it,
                     exposed, step_times(sims[0]), mem, in_flight, hier, sizes, layout.order,
                     chunk / 2**20 if chunk else None, methods[0] if methods else None, compute.source,
                     len(sims[0].ranks), len(sims), sum(sim.events_run for sim in sims), time.perf_counter() - wall0,
                     _cpu_per_step(sims, cfg.parallel.pp - 1, pairs))


def _cpu_per_step(sims: list[Simulation], last: int, steps: range) -> dict[str, float]:
    """CPU seconds per step over `steps`, by kind, the mean over the simulated runs:
    the shared cores' use between the ends of the steps before and at the window's edges
    (none where no cores are shared: the network counts only resources with a load curve)."""
    def at(sim: Simulation, step: int) -> dict[str, float]:
        return sim.stats[(last, 0, step)].cpu_total_s if step >= 0 else {}
    n = len(steps)
    kinds = {k for sim in sims for k in at(sim, steps[-1])}
    return {k: statistics.fmean((at(sim, steps[-1]).get(k, 0.0) - at(sim, steps[0] - 1).get(k, 0.0)) / n
                                for sim in sims) for k in sorted(kinds)}


def _autotuned(cfg: TrainConfig, cluster: Cluster, policy: str, calibration: Calibration | None,
               trace_out: Path | None) -> SimResult:
    """What --autotune settles on. The runtime's Tuner runs each trial for a few steps and
    keeps the fastest; here each trial is simulated as its own job and the fastest one's
    steady state is the prediction (the trial steps themselves are not)."""
    wall0 = time.perf_counter()
    trials = [cfg.with_(autotune=False, partition_mb=p, credit_mb=c)
              for p, c in chunk_choices(policy)[1:]]
    results = [simulate(t, cluster, policy, calibration) for t in trials]
    best = min(range(len(trials)), key=lambda i: results[i].iteration_time_s)
    got = simulate(trials[best], cluster, policy, calibration, trace_out) if trace_out else results[best]
    got.wall_s = time.perf_counter() - wall0
    got.events = sum(r.events for r in results)
    return got


def _collective(stage: int, fabric: Fabric, topo: Topology, hierarchical: bool, method: str | None, rows: float,
                vocab: int, dim: int, factor: Callable[[str], float] = lambda cls: 1.0, sparse_local_s: float = 0.0):
    """How a chunk crosses the network. `factor(link class)`: bytes a collective moves per
    payload byte at the nominal rate, from the cluster's measured bus bandwidth.
    `sparse_local_s`: a sparse exchange's passes over its own table (calibrated), on the
    shared cores. The scan for touched rows precedes its collectives and the summing follows
    them; both are charged before the bytes, the same time on the exchange's path."""
    n = fabric.layout.dp
    local, k = fabric.local_sizes(stage)
    a_ring = fabric.latency.get(("ring", stage), 0.0)
    flat = factor(topo.group_link(fabric.layout.dp_group(stage)))
    intra, inter = factor(INTRA), factor(INTER)

    def phases(c: Chunk) -> list[Phase]:
        if c.kind is Kind.SPARSE:  # the table's rows, by the method the cost model picks
            cost = sparse_cost.breakdown(method, n, vocab, dim, math.ceil(rows))
            # the passes measured are the sparse methods'; dense only counts rows and sums in place
            passes = 0.0 if method == "dense" else sparse_local_s
            return [Phase(("ring", stage), 0.0, 0.0, 0, passes),
                    Phase(("ring", stage), flat * cost.bytes_per_worker, cost.latency_steps * a_ring,
                          cost.latency_steps)]
        if not hierarchical:
            return ring(("ring", stage), n, flat * c.nbytes, a_ring)
        # runtime/groups.py and runtime/reduction.py: all-reduce in each node, among one leader per node, then broadcast
        a_local = fabric.latency.get(("local", stage), 0.0)
        return (ring(("local", stage), local, intra * c.nbytes, a_local)
                + ring(("leaders", stage), k, inter * c.nbytes, fabric.latency.get(("leaders", stage), 0.0))
                + [Phase(("bcast", stage), intra * c.nbytes, fabric.latency.get(("bcast", stage), 0.0))])
    return phases


def _bound(cfg: TrainConfig, plan: JobPlan, cluster: Cluster, stages: list[StageWork],
           table_sent: float | None, tie_bytes: float) -> Bound:
    m, layout = cfg.parallel.micro_batches, plan.layout
    per_stage = [m * (w.forward_s + w.backward_s) + w.optimizer_s for w in stages]
    per_rank = [per_stage[layout.coords(r)[0]] for r in range(layout.world_size)]
    load = plan_link_bytes(plan, m, cfg.activation_bytes, table_sent, tie_bytes, cluster.collective_factor(INTER))
    return lower_bound(per_rank, cluster.shared_cores or layout.world_size, load, plan.topology)


def _trace(sim: Simulation, out: Path, cfg: TrainConfig) -> None:
    events = []
    for r in sim.ranks:
        evs = r.rec.events(0.0)
        stands = "" if sim.fabric.unfold else f", stands for {cfg.parallel.dp} replicas"
        evs[0]["args"]["name"] = f"stage {r.stage} (rank {r.rank}{stands})"
        events += evs
    write_trace(Path(out), events)

