"""The whole plan of a training job: what every rank runs, made once (plan/planner.py) and
executed by both the runtime and the simulator. `trirace plan` prints it without running
a model.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.policies import Policy
from . import placement
from .layout import Layout
from .schedule import Schedule
from .topology import Topology


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
