"""Builds the job plan (plan/job.py) from the configuration, the topology and per-layer
costs: a pure function, run once and executed by both the runtime and the simulator.

Every decision that shapes what a rank runs lives here and only here: the partition, the
placement (rank order), each stage's policy (with link-sized chunks for trirace), the
schedule with deferred updates, the reduction plan (what is chunked, which parameter
travels as a sparse item, which is tied across the pipeline, where a hierarchical
all-reduce pays).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from ..policy import sparse as sparse_cost
from ..policy.policies import stage_policy
from ..config import TrainConfig
from ..models import layer_param_counts
from ..models.build import layer_param_numels, table_index, tied_head_param
from . import placement
from .bounds import plan_link_bytes
from .job import JobPlan, StagePlan
from .layout import Layout
from .partition import balance, stage_ranges
from .schedule import build_schedule, schedule_for_policy
from .topology import Topology, hierarchical_pays


def stage_sizes(cfg: TrainConfig, layer_times: Callable[[], list[float]]) -> list[int]:
    """Layers per stage: the explicit override, or a balance of parameters or of per-layer
    time, which `layer_times` supplies (measured by the runtime, modelled by the simulator)."""
    par = cfg.parallel
    if par.partition is not None:
        return list(par.partition)
    if par.balance == "params":
        return balance([float(c) for c in layer_param_counts(cfg.spec)], par.pp)
    return balance(layer_times(), par.pp)


def plan_job(cfg: TrainConfig, topology: Topology, layer_times: Callable[[], list[float]] | None = None,
             steps: int | None = None, collective_factor: float = 1.0) -> JobPlan:
    """The plan every rank of `cfg`'s job executes. `layer_times` (per-layer seconds) is
    called when the partition balances measured time and when auto placement weighs
    candidates across nodes; `steps` (default cfg.steps) is what is left to run, fewer on
    a resume. `collective_factor`: what a cluster preset's bus bandwidth makes of a
    collective's bytes across nodes (sim/cluster.py; 1 on measured links), so auto
    placement weighs reductions as the simulator and the bound do."""
    topology.check(cfg.world_size)
    sizes = stage_sizes(cfg, layer_times or _no_times)
    tied = cfg.spec.tie_embeddings and cfg.parallel.pp > 1
    orders = placement.candidates(cfg.parallel.pp, cfg.parallel.dp, topology) if cfg.parallel.rank_order == "auto" else [cfg.parallel.rank_order]
    stages = {o: tuple(_stages(cfg, topology, sizes, Layout(cfg.parallel.pp, cfg.parallel.dp, o))) for o in orders}
    base = build_schedule(cfg.parallel.schedule, cfg.parallel.pp, cfg.parallel.micro_batches, steps or cfg.steps)
    schedule = schedule_for_policy(base, stages[orders[0]][0].policy.defer_updates, tied)
    plans = [JobPlan(tuple(sizes), Layout(cfg.parallel.pp, cfg.parallel.dp, o), topology, schedule, stages[o], tied,
                     cfg.comm.embedding_comm) for o in orders]
    if len(plans) == 1:
        return plans[0]
    ranked = _predict(cfg, plans, sizes, layer_times, collective_factor)
    return replace(plans[orders.index(ranked[0].order)], placements=tuple(ranked))


def _predict(cfg: TrainConfig, plans: list[JobPlan], sizes: list[int],
             layer_times: Callable[[], list[float]] | None, collective_factor: float = 1.0) -> list[placement.Candidate]:
    """Every candidate plan's predicted step, fastest first (plan/placement.py)."""
    # Compute is the same under every placement; it says how much link time hides behind it.
    per_layer = (layer_times() if layer_times is not None else None) or [0.0] * sum(sizes)
    compute = cfg.parallel.micro_batches * max(sum(per_layer[i] for i in layers) for layers in stage_ranges(sizes))
    rows = sparse_cost.expected_rows(cfg.spec.vocab_size, cfg.tokens_per_replica_step)
    flushed = plans[0].schedule.staleness == 0  # its reductions follow the step's last backward

    def load(p: JobPlan, **parts: bool) -> dict:
        return plan_link_bytes(p, cfg.parallel.micro_batches, cfg.activation_bytes, table_sent(cfg, p, rows),
                               collective_factor=collective_factor, **parts)
    return placement.rank([
        placement.score(p.layout.order, p.layout, p.topology, load(p, reductions=not flushed), compute,
                        cfg.activation_bytes, load(p, p2p=False) if flushed else None) for p in plans])


def table_sent(cfg: TrainConfig, plan: JobPlan, rows_touched: float) -> float | None:
    """Bytes one replica sends to exchange the token table's gradient by its sparse method,
    `rows_touched` rows touched per replica (None: the table travels in the dense gradient)."""
    st = plan.stages[0]
    if st.sparse_param is None:
        return None
    spec, link, rows = cfg.spec, plan.topology.link(st.reduction_link), math.ceil(rows_touched)
    method = cfg.comm.embedding_comm
    if method == "auto":  # as the runtime decides it from the rows it measures
        method = sparse_cost.choose(cfg.parallel.dp, spec.vocab_size, spec.d_model, rows, alpha_s=link.latency_s,
                                    bytes_per_s=link.bytes_per_s)
    return sparse_cost.breakdown(method, cfg.parallel.dp, spec.vocab_size, spec.d_model, rows).bytes_per_worker


def _stages(cfg: TrainConfig, topology: Topology, sizes: list[int], layout: Layout) -> list[StagePlan]:
    spec = cfg.spec
    tied = spec.tie_embeddings and cfg.parallel.pp > 1
    by_layer = layer_param_numels(spec)
    n_layers = len(by_layer)
    head_tied = sum(len(n) for n in by_layer[:-1]) + tied_head_param(spec)  # in a whole-model numbering
    stages = []
    for s, layers in enumerate(stage_ranges(sizes)):
        ranks = tuple(layout.dp_group(s))
        link_cls = topology.group_link(list(ranks))
        link = topology.link(link_cls)
        policy = stage_policy(cfg.comm.policy, cfg.comm.partition_mb, cfg.comm.credit_mb, link.bytes_per_s,
                              len(ranks), link.latency_s)
        numels = [n for i in layers for n in by_layer[i]]
        first = sum(len(n) for n in by_layer[:layers.start])  # whole-model index of my first parameter
        is_first, is_last = layers.start == 0, layers.stop == n_layers
        if spec.tie_embeddings and is_first and is_last:
            del numels[head_tied - first]  # one shared parameter: it appears once
        tied_param = None
        if tied and is_first:
            tied_param = 0
        elif tied and is_last:
            tied_param = head_tied - first
        sparse = table_index(spec) if is_first and cfg.comm.embedding_comm != "dense" and cfg.parallel.dp > 1 else None
        elem = 2 if cfg.comm.grad_comm_dtype == "bf16" else 4
        hier = policy.hierarchical and hierarchical_pays(topology, list(ranks), elem * sum(numels))
        stages.append(StagePlan(s, layers, ranks, link_cls, policy, hier, tuple(numels), sparse, tied_param, elem))
    return stages


def _no_times() -> list[float]:
    raise ValueError("this partition balances measured time: pass layer_times")
