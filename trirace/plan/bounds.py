"""The physical limit of a step: no schedule can beat the largest of
- the busiest rank's own computation (its stage's work is serial),
- all ranks' computation divided by the cores they share (here 4 ranks share 2 cores),
- for every node's uplink and downlink, the bytes it must carry over its bandwidth.
Overlap efficiency is this bound over the measured step time (design.md 4)."""

from __future__ import annotations

from dataclasses import dataclass

from .layout import Layout
from .topology import INTER, Topology


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


def link_bytes(layout: Layout, topo: Topology, micro_batches: int, activation_bytes: int,
               stage_grad_bytes: list[int]) -> dict[tuple[int, str], float]:
    """Bytes per step on each (node, "up"|"down") inter-node link: activations forward and
    their gradients back for every micro-batch, and a ring all-reduce (2(n-1)/n of the
    gradient sent and received by each member) for groups that cross nodes."""
    load: dict[tuple[int, str], float] = {}

    def add(src: int, dst: int, nbytes: float) -> None:
        if topo.link_between(src, dst) == INTER:
            load[(topo.node_of(src), "up")] = load.get((topo.node_of(src), "up"), 0.0) + nbytes
            load[(topo.node_of(dst), "down")] = load.get((topo.node_of(dst), "down"), 0.0) + nbytes

    for a, b in layout.p2p_pairs():
        add(a, b, micro_batches * activation_bytes)
        add(b, a, micro_batches * activation_bytes)
    for s in range(layout.pp):
        ranks = layout.dp_group(s)
        n = len(ranks)
        for i, r in enumerate(ranks):  # ring order: each member sends to the next
            if n > 1:
                add(r, ranks[(i + 1) % n], 2 * (n - 1) / n * stage_grad_bytes[s])
    return load


def lower_bound(rank_compute_s: list[float], cores: int, load: dict[tuple[int, str], float],
                topo: Topology) -> Bound:
    link = max((b / topo.inter.bytes_per_s for b in load.values()), default=0.0)
    return Bound(max(rank_compute_s), sum(rank_compute_s) / max(cores, 1), link)
