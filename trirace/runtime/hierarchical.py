"""Hierarchical all-reduce for a data-parallel group that spans nodes: sum inside each
node, all-reduce among one leader per node over the inter-node links, broadcast inside the
node. Cross-node bytes drop from 2(n-1)/n to 2(k-1)/k of the tensor for k nodes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..plan.topology import Topology


@dataclass
class Hierarchy:
    local: dist.ProcessGroup | None  # my node's members of the group (None if alone)
    leaders: dist.ProcessGroup | None  # one member per node (None unless I lead)
    leader: int  # global rank of my node's leader

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """In-place sum over the whole group, in three blocking phases."""
        if self.local is not None:
            dist.all_reduce(tensor, group=self.local)
        if self.leaders is not None:
            dist.all_reduce(tensor, group=self.leaders)
        if self.local is not None:
            dist.broadcast(tensor, src=self.leader, group=self.local)


def make_hierarchies(groups_ranks: list[list[int]], topo: Topology, rank: int) -> dict[int, Hierarchy]:
    """Create the sub-groups of every group in `groups_ranks` (collective: every rank calls
    this with the same list, in the same order) and return mine, keyed by group index."""
    mine: dict[int, Hierarchy] = {}
    for gi, ranks in enumerate(groups_ranks):
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            by_node.setdefault(topo.node_of(r), []).append(r)
        locals_ = {node: dist.new_group(members) if len(members) > 1 else None for node, members in by_node.items()}
        leader_ranks = [members[0] for members in by_node.values()]
        leaders = dist.new_group(leader_ranks)
        if rank in ranks:
            node = topo.node_of(rank)
            mine[gi] = Hierarchy(locals_[node], leaders if rank in leader_ranks else None, by_node[node][0])
    return mine
