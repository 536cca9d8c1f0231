"""Ranks -> (stage, replica): who computes what, who reduces with whom, who talks to whom.

Pure arithmetic, no torch.distributed: the runtime turns these rank lists into process
groups, and the simulator into flows on a topology.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError

ORDERS = ("dp-inner", "pp-inner")
_BLOCKS = re.compile(r"(dp|pp)-blocks-([1-9][0-9]*)")


def is_order(name: str) -> bool:
    return name in ORDERS or _BLOCKS.fullmatch(name) is not None


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    # "dp-inner": replicas of a stage get adjacent ranks (data parallelism inside a node,
    # as DeepSpeed's ['pipe', 'data'] axes and Megatron's default order do);
    # "pp-inner": the stages of one pipeline get adjacent ranks;
    # "dp-blocks-K": K replicas of a stage, then the same K replicas of the next stage, ...,
    # then the next K replicas: a node holds K replicas of a run of stages, the mix that
    # pays when dp exceeds a node ("pp-blocks-K" likewise, K stages of each replica).
    order: str = "dp-inner"

    def __post_init__(self):
        if self.pp < 1 or self.dp < 1:
            raise UsageError(f"pp and dp must be at least 1 (got pp={self.pp}, dp={self.dp})")
        if not is_order(self.order):
            raise UsageError(f"unknown rank order {self.order!r}; choose from {', '.join(ORDERS)}, dp-blocks-K "
                             "or pp-blocks-K")
        axis, k = self._blocks
        if k < 1 or (self.dp if axis == "dp" else self.pp) % k:
            raise UsageError(f"rank order {self.order}: {k} does not divide {axis}={self.dp if axis == 'dp' else self.pp}")

    @property
    def _blocks(self) -> tuple[str, int]:
        """Every order as (axis whose blocks are innermost, block size)."""
        if self.order == "dp-inner":
            return "dp", self.dp
        if self.order == "pp-inner":
            return "pp", self.pp
        m = _BLOCKS.fullmatch(self.order)
        return m.group(1), int(m.group(2))

    @property
    def world_size(self) -> int:
        return self.pp * self.dp

    def rank(self, stage: int, replica: int) -> int:
        if not (0 <= stage < self.pp and 0 <= replica < self.dp):
            raise UsageError(f"no stage {stage}, replica {replica} in a {self.pp} x {self.dp} layout")
        axis, k = self._blocks
        if axis == "dp":  # K = dp: stage * dp + replica
            return ((replica // k) * self.pp + stage) * k + replica % k
        return ((stage // k) * self.dp + replica) * k + stage % k  # K = pp: replica * pp + stage

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of a rank."""
        if not 0 <= rank < self.world_size:
            raise UsageError(f"rank {rank} outside a world of {self.world_size}")
        axis, k = self._blocks
        block, inner = divmod(rank, k)
        if axis == "dp":
            outer, stage = divmod(block, self.pp)
            return stage, outer * k + inner
        outer, replica = divmod(block, self.dp)
        return outer * k + inner, replica

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
