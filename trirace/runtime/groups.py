"""Process groups for one layout, created once, in the same order on every rank, and warmed
up before training, so no pair communicator is ever created lazily mid-run."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..plan import Layout


@dataclass
class Groups:
    layout: Layout
    rank: int
    stage: int
    replica: int
    dp: dist.ProcessGroup | None  # replicas of my stage (None when dp == 1)
    prev: dist.ProcessGroup | None  # pair group with the previous stage of my pipeline
    next: dist.ProcessGroup | None  # pair group with the next stage
    world: dist.ProcessGroup  # all ranks, for per-step metrics only
    tie: dist.ProcessGroup | None  # first and last stage of my pipeline, when their weights are tied
    prev_rank: int | None
    next_rank: int | None

    @property
    def is_reporter(self) -> bool:
        """The one rank that prints progress and writes metrics: last stage, replica 0."""
        return self.stage == self.layout.pp - 1 and self.replica == 0


def make_groups(layout: Layout, device: torch.device, tied: bool = False) -> Groups:
    rank = dist.get_rank()
    stage, replica = layout.coords(rank)
    dp_groups = [dist.new_group(layout.dp_group(s)) for s in range(layout.pp)]
    pair_groups = {pair: dist.new_group(list(pair)) for pair in layout.p2p_pairs()}
    world = dist.new_group(list(range(layout.world_size)))
    ends = [(layout.rank(0, r), layout.rank(layout.pp - 1, r)) for r in range(layout.dp)] if tied and layout.pp > 1 else []
    tie_groups = {pair: dist.new_group(list(pair)) for pair in ends}
    prev_rank, next_rank = layout.prev_rank(rank), layout.next_rank(rank)
    g = Groups(
        layout, rank, stage, replica,
        dp=dp_groups[stage] if layout.dp > 1 else None,
        prev=pair_groups[(prev_rank, rank)] if prev_rank is not None else None,
        next=pair_groups[(rank, next_rank)] if next_rank is not None else None,
        world=world,
        tie=next((grp for pair, grp in tie_groups.items() if rank in pair), None),
        prev_rank=prev_rank, next_rank=next_rank,
    )
    _warm_up(g, device)
    return g


def _warm_up(g: Groups, device: torch.device) -> None:
    # Previous link first, then next: along a pipeline this is a chain, never a cycle.
    for peer, group in ((g.prev_rank, g.prev), (g.next_rank, g.next)):
        if group is None:
            continue
        out, back = torch.ones(1, device=device), torch.empty(1, device=device)
        works = [dist.irecv(back, src=peer, group=group), dist.isend(out, dst=peer, group=group)]
        for w in works:
            w.wait()
    for group in (g.dp, g.world, g.tie):
        if group is not None:
            dist.all_reduce(torch.ones(1, device=device), group=group)
    dist.barrier()
