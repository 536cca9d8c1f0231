"""Choosing the rank order by prediction: every candidate placement is planned and scored,
and the fastest predicted one wins.

Candidates: "dp-inner" (a stage's replicas adjacent), "pp-inner" (a pipeline's stages
adjacent), and where dp or pp exceeds what one node holds, the blocked mixes between them
("dp-blocks-K": K replicas of a run of stages per node; "pp-blocks-K" likewise).

The score of a placement is a step-time prediction from the same byte count as the lower
bound (plan/bounds.py: every byte that crosses a node's NIC, counted as it is sent:
hierarchical reductions among node leaders only, the token table at its sparse method's
bytes):
    predicted = max(compute, busiest NIC's bytes / its bandwidth) + pipeline P2P path
where the P2P path is the activations and gradients that cross nodes on the critical path
of one step's fill and drain (a transfer time and a latency per crossing boundary, each
way): unlike gradient traffic, which 2BW's delay hides, it adds to the step. Compute is
the same for every placement, so it only decides how much of the link time is hidden.

A flushed schedule (1f1b, zb-h1, gpipe) reduces a step's gradients after its last
backward, with no computation left to hide them behind; their bytes go in a second term:
    predicted = max(compute, busiest NIC's P2P bytes / bandwidth)
                + busiest NIC's reduction bytes / bandwidth + P2P path
so such a job keeps a stage's replicas within a node where it can (in the emulated
h100-100gbe cell of pp=4 x dp=2, 1f1b simulates 3.89 s per step with its replicas
together against 4.26 s with its pipelines together).
"""

from __future__ import annotations

from dataclasses import dataclass

from .layout import Layout
from .topology import INTER, Topology


@dataclass(frozen=True)
class Candidate:
    order: str
    predicted_s: float
    compute_s: float  # the busiest stage's compute per step (the same for every candidate)
    link_s: float  # the busiest NIC direction's bytes over its bandwidth
    p2p_path_s: float  # cross-node P2P on one step's critical path
    exposed_s: float = 0.0  # a flushed schedule's reductions on its busiest NIC direction

    def describe(self) -> str:
        exposed = f", reductions after the flush {self.exposed_s * 1e3:.1f} ms" if self.exposed_s else ""
        return (f"{self.order}: {self.predicted_s * 1e3:.1f} ms (NIC {self.link_s * 1e3:.1f} ms{exposed}, "
                f"P2P path {self.p2p_path_s * 1e3:.1f} ms, compute {self.compute_s * 1e3:.1f} ms)")


def candidates(pp: int, dp: int, topo: Topology) -> list[str]:
    """Orders worth predicting for a pp x dp job on `topo` (one order on a single node)."""
    if topo.nodes == 1:
        return ["dp-inner"]
    out = ["dp-inner", "pp-inner"]
    rpn = topo.ranks_per_node
    for axis, n in (("dp", dp), ("pp", pp)):
        # A block of K along one axis, filled out by the other: only K below the axis's size
        # (K = n is the axis-inner order itself, K = 1 the other one) and within a node.
        out += [f"{axis}-blocks-{k}" for k in range(2, min(n, rpn + 1)) if n % k == 0]
    return out


def p2p_path_s(layout: Layout, topo: Topology, activation_bytes: int) -> float:
    """Cross-node pipeline boundaries of the worst replica, each crossed once forward in the
    fill and once backward in the drain of a step."""
    worst = max(sum(topo.link_between(layout.rank(s, r), layout.rank(s + 1, r)) == INTER
                    for s in range(layout.pp - 1)) for r in range(layout.dp))
    return 2 * worst * topo.inter.time(activation_bytes)


def score(order: str, layout: Layout, topo: Topology, load: dict, compute_s: float,
          activation_bytes: int, exposed: dict | None = None) -> Candidate:
    """`load`: bytes per step on each (node, direction) NIC, from plan.bounds.link_bytes,
    that computation can hide; `exposed`: bytes that it cannot (a flushed schedule's
    reductions)."""
    link = max((b / topo.inter.bytes_per_s for b in load.values()), default=0.0)
    after = max((b / topo.inter.bytes_per_s for b in (exposed or {}).values()), default=0.0)
    path = p2p_path_s(layout, topo, activation_bytes)
    return Candidate(order, max(compute_s, link) + after + path, compute_s, link, path, after)


def rank(scored: list[Candidate]) -> list[Candidate]:
    """Fastest predicted first; among equals, the one whose P2P crosses fewer nodes, then the
    one listed first (dp-inner)."""
    order = {c.order: i for i, c in enumerate(scored)}
    return sorted(scored, key=lambda c: (round(c.predicted_s, 12), c.p2p_path_s, order[c.order]))
