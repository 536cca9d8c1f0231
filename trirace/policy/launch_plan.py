"""Where each gradient chunk of a step is launched: a pure function of the plan.

NCCL runs a device's kernels, across all its communicators, in the order they are
launched, and a collective completes only once every member launched it. So every rank
launches its collectives at points fixed by its action list, the same on every replica of
its stage: a chunk goes right after a *unit* of the stage's action list (a compute action,
or a run of adjacent transfers, as `plan.schedule.p2p_groups` splits it), never at a moment
a local clock picked. What a policy decides is which unit each chunk follows.

Slots run from the step's last backward (its chunks are final when it ends) to the unit
before the step's AR, which waits for every chunk and launches what is left. A chunk placed
after a compute unit that a transfer run follows goes after that run instead: the P2P
transfer a peer waits for leaves first.

- fifo: every chunk in the first slot, as DDP launches buckets.
- priority: at most `credit_bytes` per slot (one chunk at least), in forward order.
- trirace: fills the gaps between the P2P transfers on the chunks' link. A slot's gap is
  the predicted compute time from it to the next transfer run on that link; chunks go
  while their bytes cross within it at the agreed link rate. Once the step's remaining
  chunks need more time than the gaps left before its AR, the rest go at once (a missed
  deadline stalls the stage). The token table's sparse item is never held: its bytes on
  the wire are a fraction of its size. With no compute estimate yet, or no P2P on the
  chunks' link, every chunk goes in the first slot.
- Every policy launches the token table's sparse exchange first: it is a chain of
  collectives, one per unit from its slot on (runtime/reduction.py), so the earliest slot
  gives it the most units to finish in.

The compute estimate is a per-action time every rank of the stage agrees on (the runtime's
per-step metrics all-reduce, the simulator's own clock), so every replica places alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..plan import Action, Op
from ..plan.transfers import Chunk, Kind
from .policies import Policy


def slots(units: Sequence[Sequence[Action]], first: int, deadline: int) -> list[int]:
    """The units after which a chunk of a step may launch: from `first` (the step's last
    backward) to the unit before `deadline` (its AR), skipping a compute unit that a
    transfer run follows (its transfers go first)."""
    out = []
    for u in range(first, deadline):
        nxt = units[u + 1] if u + 1 < len(units) else None
        if not units[u][0].op.is_p2p and nxt is not None and nxt[0].op.is_p2p:
            continue
        out.append(u)
    return out or [first]


def gaps(units: Sequence[Sequence[Action]], at: list[int], deadline: int, seconds: dict[Op, float],
         crosses: Callable[[Action], bool]) -> list[float]:
    """For each slot, the predicted compute time from it to the next transfer run on the
    chunks' link (or to the deadline)."""
    out = []
    for u in at:
        gap = 0.0
        for unit in units[u + 1:deadline]:
            if unit[0].op.is_p2p:
                if any(crosses(a) for a in unit):
                    break
                continue
            gap += seconds.get(unit[0].op, 0.0)
        out.append(gap)
    return out


def place(policy: Policy, units: Sequence[Sequence[Action]], first: int, deadline: int, chunks: list[Chunk],
          chunk_s: Callable[[Chunk], float], seconds: dict[Op, float] | None,
          crosses: Callable[[Action], bool]) -> dict[int, list[Chunk]]:
    """Unit index -> the chunks launched right after it, in the agreed order. Chunks that
    no slot takes are left to the deadline (AR launches them)."""
    at = slots(units, first, deadline)
    # The token table's sparse exchange first (the module's docstring says why).
    order = sorted(chunks, key=lambda c: c.kind is not Kind.SPARSE)
    out: dict[int, list[Chunk]] = {}
    if policy.blocking or not order:
        return out
    if policy.fills_gaps:
        on_link = any(crosses(a) for unit in units[first:deadline] if unit[0].op.is_p2p for a in unit)
        if seconds is None or not on_link:
            return {at[0]: order}
        # The first half of the window: the step's norm goes out three quarters of the way
        # (driver.py), and its chunks should be done by then.
        at = at[:max(1, len(at) // 2)]
        room = gaps(units, at, deadline, seconds, crosses)
        for i, u in enumerate(at):
            if i == len(at) - 1 or sum(map(chunk_s, order)) > sum(room[i:]):
                out.setdefault(u, []).extend(order)  # the deadline wins
                return out
            used = 0.0
            while order and (order[0].kind is Kind.SPARSE or used + chunk_s(order[0]) <= room[i]):
                used += 0.0 if order[0].kind is Kind.SPARSE else chunk_s(order[0])
                out.setdefault(u, []).append(order.pop(0))
            if not order:
                return out
        return out
    if policy.credit_bytes is None:
        return {at[0]: order}
    for i, u in enumerate(at):
        if i == len(at) - 1:
            out.setdefault(u, []).extend(order)
            return out
        used = 0
        while order and (used == 0 or used + order[0].nbytes <= policy.credit_bytes):
            used += order[0].nbytes
            out.setdefault(u, []).append(order.pop(0))
        if not order:
            return out
    return out
