"""One stage's communication decisions, as both executors drive them.

The runtime (runtime/stage_comm.py, one engine thread and process groups) and the
simulator (sim/executor.py, an event loop) walk the same units of a stage's action list
(`plan.schedule.p2p_groups`) and call exactly these methods at the same units, so what the
stage launches, and when, cannot drift between them:

- P2P: a run of adjacent transfers is one batch, its receives posted with its sends when
  the engine reaches it (nothing is posted ahead: on a device a receive posted early
  blocks every kernel behind it until its peer sends).
- gradient reduction of a step: `backward_begins` at the step's last backward places its
  chunks (launch_plan.py); `launches_after(u)` after every unit says what goes now;
  `deadline` at AR returns what is left; `chunk_done`, `reduced`, `close_step`.
- `summed_at(u)`: the steps whose chunks the engine waits for after unit `u`, to issue
  their norm contribution (gradnorm.py) early: three quarters of the way to AR, after the
  step's last chunk and, by the compute estimate, after its chunks can have crossed the
  link; or else at its AR. Issued at AR, every stage would wait at OPT for the slowest to
  reach its AR, a barrier between the stages of a pipeline that never flushes.
- `observe_compute`: the per-action compute time every rank of the stage agrees on, which
  places later steps' chunks.

Pure. The runtime calls it under its lock (chunk completions arrive on a waiter thread);
the simulator from its loop.
"""

from __future__ import annotations

from ..plan import Action, Op
from ..plan.schedule import p2p_groups
from ..plan.transfers import Chunk, Kind, plan_reduction
from . import launch_plan
from .policies import Policy

ESTIMATE_LAG = 4  # a step's chunks are placed with the compute figures of a step this much older
TIMED_OPS = (Op.F, Op.B, Op.I, Op.W, Op.OPT)  # the actions whose mean time observe_compute learns


class StageDriver:
    def __init__(self, policy: Policy, numels: list[int], chunk_link: str, actions: tuple[Action, ...],
                 reduces: bool, sparse_param: int | None = None, tuner=None,
                 p2p_links: dict[Op, str] | None = None, link_bytes_per_s: dict[str, float] | None = None,
                 group_size: int = 2, elem_size: int = 4):
        """`p2p_links`: the link class each P2P op of this stage crosses; `link_bytes_per_s`:
        each link class's rate as every rank agrees on it (the probe's broadcast figures);
        `elem_size`: bytes per gradient value on the wire (chunks are sized in bytes)."""
        self.policy, self.numels, self.sparse_param, self.tuner = policy, numels, sparse_param, tuner
        self.elem_size, self.chunk_link = elem_size, chunk_link
        self.units = p2p_groups(actions)
        self.deadline_unit = {u[0].index: i for i, u in enumerate(self.units) if u[0].op is Op.AR}
        self.p2p_links = p2p_links or {}
        ring = 2 * (group_size - 1) / group_size if group_size > 1 else 1.0  # bytes on the wire per chunk byte
        self.chunk_bytes_per_s = (link_bytes_per_s or {}).get(chunk_link, float("inf")) / ring
        # Chunks go asynchronously only where there are replicas and the policy overlaps.
        self.reduces = reduces and not policy.blocking
        self.chunks: dict[int, list[Chunk]] = {}
        self.placed: dict[int, list[Chunk]] = {}  # unit -> chunks launched after it
        self.unlaunched: dict[int, list[Chunk]] = {}  # step -> chunks placed but not launched yet
        self.sum_points: dict[int, list[int]] = {}  # unit -> steps summed (waited for) after it
        self.done: set[Chunk] = set()
        self.last_kind: dict[int, Kind] = {}  # step -> kind of its last chunk to finish
        self.estimates: dict[int, dict[Op, float]] = {}  # step -> agreed seconds per action

    def policy_for(self, step: int) -> Policy:
        """The chunk and credit sizes step `step` uses (tuned, or fixed)."""
        return self.tuner.policy_for(step) if self.tuner else self.policy

    def plan(self, step: int) -> list[Chunk]:
        if step not in self.chunks:
            p = self.policy_for(step)
            elems = None if p.partition_bytes is None else p.partition_bytes // self.elem_size
            self.chunks[step] = plan_reduction(step, self.numels, elems, p.chunk_order, self.elem_size,
                                               sparse_param=self.sparse_param)
        return self.chunks[step]

    def observe_compute(self, step: int, seconds: dict[Op, float]) -> None:
        """Step `step`'s compute per action (of TIMED_OPS), the same figures on every rank
        of the stage."""
        self.estimates[step] = dict(seconds)

    def _estimate(self, step: int) -> dict[Op, float] | None:
        known = [s for s in self.estimates if s <= step - ESTIMATE_LAG]
        return self.estimates[max(known)] if known else None

    def _crosses(self, a: Action) -> bool:
        return self.p2p_links.get(a.op) == self.chunk_link

    def chunk_seconds(self, c: Chunk) -> float:
        return c.nbytes / self.chunk_bytes_per_s

    def backward_begins(self, step: int, unit: int) -> None:
        """The step's last backward is unit `unit`: its chunks get their slots."""
        chunks = self.plan(step)
        if not self.reduces:
            return
        deadline = self.deadline_unit.get(step, len(self.units))
        placed = launch_plan.place(self.policy_for(step), self.units, unit, deadline, chunks, self.chunk_seconds,
                                   self._estimate(step), self._crosses)
        for u, cs in placed.items():
            self.placed.setdefault(u, []).extend(cs)
        self.unlaunched[step] = list(chunks)
        at = launch_plan.slots(self.units, unit, deadline)
        # Three quarters of the way to AR at the earliest and after the last chunk, and
        # where the compute estimate says the chunks, back to back at the agreed rate from
        # their first slot, have crossed the link (else at AR): early enough that no stage
        # waits at OPT for the slowest to reach its AR, late enough that the engine seldom
        # waits for the chunks (on a link-bound reduction, an early wait only exposes it).
        later = [u for u in at[3 * len(at) // 4:] if placed and u > max(placed)]
        est = self._estimate(step)
        if later and est is not None:
            need = sum(self.chunk_seconds(c) for c in chunks if c.kind is Kind.ALLREDUCE)
            start = min(placed)
            later = [u for u in later if self._compute_between(start, u, est) >= need]
        if later and sum(map(len, placed.values())) == len(chunks):  # nothing left to the deadline
            self.sum_points.setdefault(later[0], []).append(step)
        for old in [s for s in self.estimates if s < step - 2 * ESTIMATE_LAG]:
            del self.estimates[old]

    def _compute_between(self, start: int, end: int, est: dict[Op, float]) -> float:
        """Predicted seconds of computation in the units after `start`, up to `end`."""
        return sum(est.get(a.op, 0.0) for u in self.units[start + 1:end + 1] for a in u if not a.op.is_p2p)

    def launches_after(self, unit: int) -> list[Chunk]:
        """The chunks to launch now that unit `unit` is done, in the agreed order."""
        out = self.placed.pop(unit, [])
        for c in out:
            self.unlaunched[c.step].remove(c)
        return out

    def summed_at(self, unit: int) -> list[int]:
        """Steps whose reduction the engine waits for right after unit `unit` (after its
        launches), to issue their norm contribution there rather than at their AR."""
        return self.sum_points.pop(unit, [])

    def deadline(self, step: int) -> list[Chunk]:
        """AR: the step's chunks no slot launched, to launch now; AR then waits for all."""
        return self.unlaunched.pop(step, [])

    def chunk_done(self, c: Chunk) -> None:
        self.done.add(c)
        self.last_kind[c.step] = c.kind

    def reduced(self, step: int) -> bool:
        return all(c in self.done for c in self.plan(step))

    def close_step(self, step: int) -> tuple[list[Chunk], Kind]:
        """Forget a reduced step; returns its chunks and the kind whose wait was exposed last."""
        chunks = self.chunks.pop(step)
        self.done.difference_update(chunks)
        return chunks, self.last_kind.pop(step, Kind.ALLREDUCE)
