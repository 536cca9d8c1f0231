"""The physical limit of a step: no schedule can beat the largest of
- the busiest rank's own computation (its stage's work is serial),
- all ranks' computation divided by the cores they share (here 4 ranks share 2 cores),
- for every node's uplink and downlink, the bytes it must carry over its bandwidth.
Overlap efficiency is this bound over the measured step time.

The bytes are counted from the job plan as the run sends them: a hierarchical reduction
crosses nodes only among the node leaders, and the token table, when it travels as a
sparse exchange, counts at that method's bytes, not densely. The bench, the simulator and
placement (plan/placement.py) all count with `plan_link_bytes`; a bound that counts more
than is sent is one a run can beat, which is a bug."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .topology import INTER, Topology

if TYPE_CHECKING:
    from .job import JobPlan


WARMUP_STEPS = 2  # the pipeline fills, allocators and caches warm up
DRAIN_STEPS = 2  # stages that have finished free the cores and links, so the last steps run fast


def steady_steps(steps: int, warmup: int = WARMUP_STEPS) -> range:
    """The steps a step time is measured over, where the bound holds step by step: neither
    the fill nor the drain (a drain step on shared cores can take a tenth of a steady one).
    Short runs keep what they can: at least the last step. `warmup`: the first steps left
    out (a fresh job's short run leaves out more: calibrate/testbed_contention.py)."""
    first = min(warmup, steps - 1)
    return range(first, max(first + 1, steps - DRAIN_STEPS))


def per_rank_median(rows: list[dict], key: str, per_second: bool = False) -> list[float]:
    """Each rank's median over metrics rows of a per-rank figure (its compute CPU, its
    process's CPU, its wake-ups), or of that figure per second of the row's step."""
    return [statistics.median(r[key][i] / (r["step_time_s"] if per_second else 1.0) for r in rows)
            for i in range(len(rows[0][key]))]


@dataclass(frozen=True)
class Bound:
    compute_s: float
    cpu_s: float
    link_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.cpu_s, self.link_s)

    @property
    def binding(self) -> str:
        return max((self.compute_s, "compute"), (self.cpu_s, "cpu"), (self.link_s, "link"))[1]


def plan_link_bytes(plan: JobPlan, micro_batches: int, activation_bytes: int,
                    table_sent: float | None = None, tie_bytes: float = 0.0,
                    collective_factor: float = 1.0, p2p: bool = True,
                    reductions: bool = True) -> dict[tuple[int, str], float]:
    """Bytes per step on each (node, "up"|"down") inter-node link under `plan`.

    P2P: every micro-batch's activations forward and gradients back. Reductions, per
    stage: a ring over the group (each member sends 2(n-1)/n of the gradient to the next,
    gloo's ring order being the group's), or when hierarchical a ring among one leader per
    node (the in-node reduce and broadcast cross no NIC). `table_sent`: the bytes one
    member sends to exchange the token table by its sparse method (None: it is in the dense
    gradient); it travels over the flat group, counted as a ring's edges would carry it,
    which no direct exchange beats on a node's links. `tie_bytes`: the tied weight's
    gradient, all-reduced between each pipeline's two ends. `collective_factor`: bytes a
    collective moves across nodes per payload byte at the nominal rate (the cluster's bus
    bandwidth, sim/cluster.py); P2P moves at the nominal rate. `p2p`, `reductions`: which
    of the two to count (both, by default)."""
    layout, topo = plan.layout, plan.topology
    load: dict[tuple[int, str], float] = {}

    def add(src: int, dst: int, nbytes: float) -> None:
        if nbytes > 0 and topo.link_between(src, dst) == INTER:
            load[(topo.node_of(src), "up")] = load.get((topo.node_of(src), "up"), 0.0) + nbytes
            load[(topo.node_of(dst), "down")] = load.get((topo.node_of(dst), "down"), 0.0) + nbytes

    def ring(members: list[int], per_member: float) -> None:
        for i, r in enumerate(members):
            add(r, members[(i + 1) % len(members)], collective_factor * per_member)

    for a, b in layout.p2p_pairs() if p2p else ():
        add(a, b, micro_batches * activation_bytes)
        add(b, a, micro_batches * activation_bytes)
    for st in plan.stages if reductions else ():
        if not st.reduces:
            continue
        dense = float(st.grad_bytes)
        if st.sparse_param is not None and table_sent is not None:
            dense -= st.grad_elem_size * st.numels[st.sparse_param]  # its rows go fp32, counted below
            ring(list(st.ranks), table_sent)
        members = list(st.ranks)
        if st.hierarchical:
            leaders: dict[int, int] = {}
            for r in members:
                leaders.setdefault(topo.node_of(r), r)
            members = list(leaders.values())
        n = len(members)
        if n > 1:
            ring(members, 2 * (n - 1) / n * dense)
    for a, b in plan.tie_pairs() if reductions else ():  # a two-member ring: each end sends the other the whole gradient
        ring([a, b], tie_bytes)
    return load


def lower_bound(rank_compute_s: list[float], cores: int, load: dict[tuple[int, str], float],
                topo: Topology) -> Bound:
    link = max((b / topo.inter.bytes_per_s for b in load.values()), default=0.0)
    return Bound(max(rank_compute_s), sum(rank_compute_s) / max(cores, 1), link)
