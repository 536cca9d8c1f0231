"""The whole plan of a training job, from the configuration, the topology and per-layer
costs: a pure function, made once and executed by both the runtime and the simulator.

Every decision that shapes what a rank runs lives here and only here: the partition, the
placement (rank order), each stage's policy (with link-sized chunks for trirace), the
schedule with deferred updates, the reduction plan (what is chunked, which parameter
travels as a sparse item, which is tied across the pipeline, where a hierarchical
all-reduce pays). `trirace plan` prints it without running a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..comm import sparse as sparse_cost
from ..comm.policies import Policy, stage_policy
from ..config import TrainConfig
from ..models.build import layer_param_numels, table_index, tied_head_param
from . import placement
from .bounds import plan_link_bytes
from .layout import Layout
from .partition import stage_ranges
from .schedule import Schedule, build_schedule, schedule_for_policy
from .topology import Topology, hierarchical_pays


@dataclass(frozen=True)
class StagePlan:
    stage: int
    layers: range
    ranks: tuple[int, ...]  # its replicas, by replica index: the data-parallel group
    reduction_link: str  # the slowest link class the group's reduction crosses
    policy: Policy
    hierarchical: bool  # reduce in node, across nodes among leaders, broadcast in node
    numels: tuple[int, ...]  # parameter sizes in forward order: the flat gradient's layout
    sparse_param: int | None  # the token table, exchanged as one SPARSE item (touched rows)
    tied_param: int | None  # tied to the other end of the pipeline (table here, head there)
    grad_elem_size: int = 4  # bytes per gradient value on the data-parallel links (2: bf16)

    @property
    def grad_bytes(self) -> int:
        """What the stage's dense reduction carries (the sparse table's rows aside)."""
        return self.grad_elem_size * sum(self.numels)

    @property
    def reduces(self) -> bool:
        return len(self.ranks) > 1


@dataclass(frozen=True)
class JobPlan:
    partition: tuple[int, ...]
    layout: Layout
    topology: Topology
    schedule: Schedule  # the action lists as the policy runs them
    stages: tuple[StagePlan, ...]
    tied: bool  # token table and output head are one weight, on different stages
    embedding_comm: str
    placements: tuple[placement.Candidate, ...] = ()  # what auto placement predicted, chosen first

    @property
    def policy(self) -> Policy:
        return self.stages[0].policy

    def tie_pairs(self) -> list[tuple[int, int]]:
        """(first-stage rank, last-stage rank) of every pipeline whose ends share a weight."""
        L = self.layout
        return [(L.rank(0, r), L.rank(L.pp - 1, r)) for r in range(L.dp)] if self.tied else []

    def describe(self) -> str:
        L, sched = self.layout, self.schedule
        lines = [f"job: {sched.kind} pp={L.pp} dp={L.dp} micro-batches={sched.micro_batches} steps={sched.steps}; "
                 f"policy {self.policy.name}; rank order {L.order}",
                 self.topology.describe()]
        if self.placements:
            lines.append(f"placement: {self.why_placed()}")
        lines.append(f"partition: {list(self.partition)} layers per stage")
        for s in self.stages:
            p = s.policy
            chunk = "one piece" if p.partition_bytes is None else f"{p.partition_bytes / 2**20:g} MiB chunks"
            credit = "no credit bound" if p.credit_bytes is None else f"credit {p.credit_bytes / 2**20:g} MiB"
            extra = [f"sparse table (param {s.sparse_param}, {self.embedding_comm})"] if s.sparse_param is not None else []
            extra += [f"tied param {s.tied_param}"] if s.tied_param is not None else []
            extra += ["hierarchical"] if s.hierarchical else []
            how = (f"{chunk}, {credit}, {p.chunk_order} order over {s.reduction_link}-node links"
                   if s.reduces else "no replicas: nothing to reduce")
            lines.append(f"stage {s.stage}: layers {s.layers.start}-{s.layers.stop - 1}, ranks {list(s.ranks)}, "
                         f"{s.grad_bytes / 2**20:.2f} MiB of gradient; {how}"
                         + (f"; {', '.join(extra)}" if extra else ""))
        lines += [f"stage {s} actions (steps 0-1): {' '.join(map(str, _first_steps(sched, s, 2)))}"
                  for s in range(L.pp)]
        return "\n".join(lines)

    def why_placed(self) -> str:
        """Auto placement's candidates, fastest predicted first, and why the first wins."""
        if not self.placements:
            why = "one node: every order is the same" if self.topology.nodes == 1 else "as configured"
            return f"{self.layout.order} ({why})"
        won, *rest = self.placements
        why = "fewer bytes on the busiest NIC" if rest and won.link_s < rest[0].link_s else (
            "less cross-node P2P on the critical path" if rest and won.p2p_path_s < rest[0].p2p_path_s else
            "no candidate is predicted faster")
        return f"{won.order} by prediction ({why}); " + "; ".join(c.describe() for c in self.placements)

    def to_dict(self) -> dict:
        L = self.layout
        return {
            "schedule": self.schedule.kind, "pp": L.pp, "dp": L.dp, "micro_batches": self.schedule.micro_batches,
            "steps": self.schedule.steps, "rank_order": L.order, "partition": list(self.partition),
            "topology": {"nodes": self.topology.nodes, "ranks_per_node": self.topology.ranks_per_node,
                         "intra_bits_per_s": self.topology.intra.bits_per_s,
                         "inter_bits_per_s": self.topology.inter.bits_per_s},
            "policy": self.policy.name, "tied": self.tied, "embedding_comm": self.embedding_comm,
            "tie_pairs": self.tie_pairs(),
            "stages": [{"stage": s.stage, "layers": [s.layers.start, s.layers.stop], "ranks": list(s.ranks),
                        "reduction_link": s.reduction_link, "partition_bytes": s.policy.partition_bytes,
                        "credit_bytes": s.policy.credit_bytes, "chunk_order": s.policy.chunk_order,
                        "hierarchical": s.hierarchical, "grad_bytes": s.grad_bytes, "params": len(s.numels),
                        "sparse_param": s.sparse_param, "tied_param": s.tied_param} for s in self.stages],
            "actions": [[str(a) for a in acts] for acts in self.schedule.actions],
            "placements": [vars(c) for c in self.placements],
        }


def _first_steps(sched: Schedule, stage: int, steps: int) -> list:
    return [a for a in sched.actions[stage] if sched.step_of_action(a) < steps]


def plan_job(cfg: TrainConfig, topology: Topology, layer_times: Callable[[], list[float]] | None = None,
             steps: int | None = None, collective_factor: float = 1.0) -> JobPlan:
    """The plan every rank of `cfg`'s job executes. `layer_times` (per-layer seconds) is
    called when the partition balances measured time and when auto placement weighs
    candidates across nodes; `steps` (default cfg.steps) is what is left to run, fewer on
    a resume. `collective_factor`: what a cluster preset's bus bandwidth makes of a
    collective's bytes across nodes (sim/cluster.py; 1 on measured links), so auto
    placement weighs reductions as the simulator and the bound do."""
    topology.check(cfg.world_size)
    sizes = cfg.stage_sizes(layer_times or _no_times)
    tied = cfg.spec.tie_embeddings and cfg.pp > 1
    orders = placement.candidates(cfg.pp, cfg.dp, topology) if cfg.rank_order == "auto" else [cfg.rank_order]
    stages = {o: tuple(_stages(cfg, topology, sizes, Layout(cfg.pp, cfg.dp, o))) for o in orders}
    base = build_schedule(cfg.schedule, cfg.pp, cfg.micro_batches, steps or cfg.steps)
    schedule = schedule_for_policy(base, stages[orders[0]][0].policy.defer_updates, tied)
    plans = [JobPlan(tuple(sizes), Layout(cfg.pp, cfg.dp, o), topology, schedule, stages[o], tied,
                     cfg.embedding_comm) for o in orders]
    if len(plans) == 1:
        return plans[0]
    ranked = _predict(cfg, plans, sizes, layer_times, collective_factor)
    return replace(plans[orders.index(ranked[0].order)], placements=tuple(ranked))


def _predict(cfg: TrainConfig, plans: list[JobPlan], sizes: list[int],
             layer_times: Callable[[], list[float]] | None, collective_factor: float = 1.0) -> list[placement.Candidate]:
    """Every candidate plan's predicted step, fastest first (plan/placement.py)."""
    # Compute is the same under every placement; it says how much link time hides behind it.
    per_layer = (layer_times() if layer_times is not None else None) or [0.0] * sum(sizes)
    compute = cfg.micro_batches * max(sum(per_layer[i] for i in layers) for layers in stage_ranges(sizes))
    rows = sparse_cost.expected_rows(cfg.spec.vocab_size, cfg.tokens_per_replica_step)
    return placement.rank([
        placement.score(p.layout.order, p.layout, p.topology,
                        plan_link_bytes(p, cfg.micro_batches, cfg.activation_bytes, table_sent(cfg, p, rows),
                                        collective_factor=collective_factor),
                        compute, cfg.activation_bytes) for p in plans])


def table_sent(cfg: TrainConfig, plan: JobPlan, rows_touched: float) -> float | None:
    """Bytes one replica sends to exchange the token table's gradient by its sparse method,
    `rows_touched` rows touched per replica (None: the table travels in the dense gradient)."""
    st = plan.stages[0]
    if st.sparse_param is None:
        return None
    spec, link, rows = cfg.spec, plan.topology.link(st.reduction_link), math.ceil(rows_touched)
    method = cfg.embedding_comm
    if method == "auto":  # as the runtime decides it from the rows it measures
        method = sparse_cost.choose(cfg.dp, spec.vocab_size, spec.d_model, rows, alpha_s=link.latency_s,
                                    bytes_per_s=link.bytes_per_s)
    return sparse_cost.breakdown(method, cfg.dp, spec.vocab_size, spec.d_model, rows).bytes_per_worker


def _stages(cfg: TrainConfig, topology: Topology, sizes: list[int], layout: Layout) -> list[StagePlan]:
    spec = cfg.spec
    tied = spec.tie_embeddings and cfg.pp > 1
    by_layer = layer_param_numels(spec)
    n_layers = len(by_layer)
    head_tied = sum(len(n) for n in by_layer[:-1]) + tied_head_param(spec)  # in a whole-model numbering
    stages = []
    for s, layers in enumerate(stage_ranges(sizes)):
        ranks = tuple(layout.dp_group(s))
        link_cls = topology.group_link(list(ranks))
        policy = stage_policy(cfg.comm_policy, cfg.partition_mb, cfg.credit_mb, topology.link(link_cls).bytes_per_s)
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
        sparse = table_index(spec) if is_first and cfg.embedding_comm != "dense" and cfg.dp > 1 else None
        elem = 2 if cfg.grad_comm_dtype == "bf16" else 4
        hier = policy.hierarchical and hierarchical_pays(topology, list(ranks), elem * sum(numels))
        stages.append(StagePlan(s, layers, ranks, link_cls, policy, hier, tuple(numels), sparse, tied_param, elem))
    return stages


def _no_times() -> list[float]:
    raise ValueError("this partition balances measured time: pass layer_times")
