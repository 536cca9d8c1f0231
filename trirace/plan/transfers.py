"""Lowering: the data a schedule moves, as first-class transfers.

A P2P transfer is one SF/SB action and its partner on the neighbour stage: its producer is
the computation that made the tensor, its consumer the computation on the other side that
needs it. A step's gradient reduction is cut into chunks of the stage's flat gradient
buffer; each chunk's producer is the backward that finalises the parameters it covers,
and its consumer (deadline) is the step's OPT. Policies order, chunk and time these; they
never see a process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .schedule import Op


class Kind(str, Enum):
    P2P = "p2p"
    ALLREDUCE = "allreduce"
    SPARSE = "sparse"


@dataclass(frozen=True)
class P2PTransfer:
    op: Op  # SF or SB, as seen from the sender
    micro_batch: int
    nbytes: int

    kind = Kind.P2P

    @property
    def name(self) -> str:
        return f"{self.op.value}{self.micro_batch}"

    @property
    def producer(self) -> str:
        return f"{'F' if self.op is Op.SF else 'B'}{self.micro_batch}"

    @property
    def consumer(self) -> str:
        """The computation on the receiving stage that waits for this tensor."""
        return self.producer


@dataclass(frozen=True)
class Chunk:
    """Elements [start, stop) of one stage's flat gradient, all-reduced across its replicas."""

    step: int
    seq: int  # position in the launch order every replica agrees on
    start: int
    stop: int
    params: tuple[int, int]  # [first, last) parameter indices it overlaps
    elem_size: int = 4
    kind: Kind = Kind.ALLREDUCE  # SPARSE: one parameter's rows, exchanged by an embedding method

    @property
    def nbytes(self) -> int:
        return (self.stop - self.start) * self.elem_size

    @property
    def name(self) -> str:
        return f"{'AR' if self.kind is Kind.ALLREDUCE else 'SP'}{self.step}.{self.seq}"

    @property
    def consumer(self) -> str:
        return f"OPT{self.step}"


def param_offsets(numels: list[int]) -> list[int]:
    out = [0]
    for n in numels:
        out.append(out[-1] + n)
    return out


def plan_reduction(step: int, numels: list[int], chunk_elems: int | None, order: str,
                   elem_size: int = 4, sparse_param: int | None = None) -> list[Chunk]:
    """Cut the flat gradient (parameters in forward order) into chunks of at most
    `chunk_elems` (None: one chunk) and number them in launch order:
    "ready" = the order backward finishes them (last parameters first), or
    "front" = forward order (what the next forward needs first, as ByteScheduler orders).
    `sparse_param` (the token table) becomes one SPARSE item of its own, in the same order.
    Depends only on shapes and settings all replicas share, so all replicas agree."""
    offsets = param_offsets(numels)
    total = offsets[-1]
    size = total if not chunk_elems else max(1, chunk_elems)
    hole = (offsets[sparse_param], offsets[sparse_param + 1]) if sparse_param is not None else (0, 0)
    spans = [(hole[0], hole[1], Kind.SPARSE)] if sparse_param is not None else []
    for lo, hi in ((0, hole[0]), (hole[1], total)):
        spans += [(a, min(a + size, hi), Kind.ALLREDUCE) for a in range(lo, hi, size)]
    spans = sorted(spans) or [(0, 0, Kind.ALLREDUCE)]
    if order == "ready":
        spans.reverse()
    elif order != "front":
        raise ValueError(f"unknown chunk order {order!r}")
    chunks = []
    for seq, (a, b, kind) in enumerate(spans):
        first = max(i for i in range(len(numels)) if offsets[i] <= a) if numels else 0
        last = min((i for i in range(len(numels)) if offsets[i + 1] >= b), default=len(numels) - 1) + 1
        chunks.append(Chunk(step, seq, a, b, (first, max(last, first + 1)), elem_size, kind))
    return chunks
