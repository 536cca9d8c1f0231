"""Ranks -> (stage, replica): who computes what, who reduces with whom, who talks to whom.

Pure arithmetic, no torch.distributed: the runtime turns these rank lists into process
groups, and the simulator into flows on a topology.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

ORDERS = ("dp-inner", "pp-inner")


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    # "dp-inner": replicas of a stage get adjacent ranks (data parallelism inside a node,
    # as DeepSpeed's ['pipe', 'data'] axes and Megatron's default order do);
    # "pp-inner": the stages of one pipeline get adjacent ranks.
    order: str = "dp-inner"

    def __post_init__(self):
        if self.pp < 1 or self.dp < 1:
            raise UsageError(f"pp and dp must be at least 1 (got pp={self.pp}, dp={self.dp})")
        if self.order not in ORDERS:
            raise UsageError(f"unknown rank order {self.order!r}; choose from {', '.join(ORDERS)}")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp

    def rank(self, stage: int, replica: int) -> int:
        if not (0 <= stage < self.pp and 0 <= replica < self.dp):
            raise UsageError(f"no stage {stage}, replica {replica} in a {self.pp} x {self.dp} layout")
        if self.order == "dp-inner":
            return stage * self.dp + replica
        return replica * self.pp + stage

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a rank."""
        if not 0 <= rank < self.world_size:
            raise UsageError(f"rank {rank} outside a world of {self.world_size}")
        if self.order == "dp-inner":
            return divmod(rank, self.dp)
        replica, stage = divmod(rank, self.pp)
        return stage, replica

    def dp_group(self, stage: int) -> list[int]:
        """The replicas of one stage: they average their gradients."""
        return [self.rank(stage, r) for r in range(self.dp)]

    def p2p_pairs(self) -> list[tuple[int, int]]:
        """(sender of activations, receiver) for every pipeline link, in one fixed order
        that every rank uses to create and warm up its pair groups."""
        return [(self.rank(s, r), self.rank(s + 1, r)) for r in range(self.dp) for s in range(self.pp - 1)]

    def prev_rank(self, rank: int) -> int | None:
        s, r = self.coords(rank)
        return self.rank(s - 1, r) if s > 0 else None

    def next_rank(self, rank: int) -> int | None:
        s, r = self.coords(rank)
        return self.rank(s + 1, r) if s < self.pp - 1 else None
