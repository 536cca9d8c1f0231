"""One stage's communication decisions, as both executors drive them.

The runtime (runtime/stage_comm.py, threads and process groups) and the simulator
(sim/executor.py, an event loop) call exactly these methods at the same points of a stage's
action list, so what the stage decides cannot drift between them:

- receives: which are posted ahead of need (`recvs_to_post` / `received`);
- P2P on a link: `p2p_sent` / `p2p_send_done` and `p2p_arrived`, what the policy yields
  to and what the forecast (forecast.py) learns the step's timing from;
- gradient reduction of a step: `backward_begins` (the step's last backward enqueues its
  chunks in the agreed order), `params_ready` (backward finished parameters; a chunk whose
  parameters are all final becomes ready), `backward_ends`, `deadline` (AR: hold nothing
  back any more), `launches` (what goes now), `wake_at` (when a chunk held back for a
  forecast P2P transfer is reconsidered), `chunk_done`, and `reduced` / `close_step`.

Pure and not thread-safe: the runtime calls it under its lock, the simulator from its loop.
"""

from __future__ import annotations

from collections import deque

from ..plan import Action, Op
from ..plan.transfers import Chunk, Kind, plan_reduction
from .forecast import P2PForecast
from .policies import Policy
from .scheduler import CommScheduler

RECV_AHEAD = 2  # receives kept posted before their data can arrive (receive before send)


class StageDriver:
    def __init__(self, policy: Policy, numels: list[int], chunk_link: str, actions: tuple[Action, ...],
                 reduces: bool, sparse_param: int | None = None, tuner=None, micro_batches: int = 1,
                 p2p_links: dict[Op, str] | None = None, link_bytes_per_s: dict[str, float] | None = None,
                 group_size: int = 2, elem_size: int = 4):
        """`p2p_links`: the link class each P2P op of this stage crosses; `link_bytes_per_s`:
        each link class's rate as every rank agrees on it (the probe's broadcast figures);
        `elem_size`: bytes per gradient value on the wire (chunks are sized in bytes)."""
        self.elem_size = elem_size
        self.policy, self.numels, self.sparse_param, self.tuner = policy, numels, sparse_param, tuner
        self.rates = link_bytes_per_s or {}
        self.forecast = P2PForecast(actions, micro_batches, p2p_links or {})
        ring = 2 * (group_size - 1) / group_size if group_size > 1 else 1.0  # bytes on the wire per chunk byte
        self.scheduler = CommScheduler(policy, chunk_link, self.forecast,
                                       self.rates.get(chunk_link, float("inf")) / ring)
        # Chunks go asynchronously only where there are replicas and the policy overlaps.
        self.reduces = reduces and not policy.blocking
        self.unposted = deque(a for a in actions if a.op in (Op.RF, Op.RB))
        self.posted: set[Action] = set()
        self.chunks: dict[int, list[Chunk]] = {}
        self.pending: dict[int, dict[int, int]] = {}  # step -> chunk seq -> parameters not final
        self.done: set[Chunk] = set()
        self.last_kind: dict[int, Kind] = {}  # step -> kind of its last chunk to finish

    # ------------------------------------------------------------ P2P

    def recvs_to_post(self, group: list[Action] | None = None) -> list[Action]:
        """Receives to post now. Asynchronous policies keep RECV_AHEAD posted in schedule
        order; blocking posts a group's receives when the engine reaches the group."""
        out = []
        if self.policy.blocking:
            for a in group or ():
                if a.op in (Op.RF, Op.RB):
                    self.unposted.remove(a)
                    out.append(a)
        else:
            while self.unposted and len(self.posted) + len(out) < RECV_AHEAD:
                out.append(self.unposted.popleft())
        self.posted.update(out)
        return out

    def received(self, a: Action) -> None:
        self.posted.discard(a)

    def _seconds(self, link: str, nbytes: float) -> float:
        rate = self.rates.get(link)
        return nbytes / rate if rate else 0.0

    def p2p_sent(self, a: Action, link: str, nbytes: float, t: float) -> None:
        """Send `a` was issued at `t`: its bytes cross `link` from now on."""
        self.forecast.observed(a, t, t + self._seconds(link, nbytes))
        if not self.policy.blocking:
            self.scheduler.p2p_started(link)

    def p2p_send_done(self, link: str) -> None:
        if not self.policy.blocking:
            self.scheduler.p2p_finished(link)

    def p2p_arrived(self, a: Action, link: str, nbytes: float, t: float, waited: bool) -> None:
        """Receive `a` was seen complete at `t`; `waited`: the engine was blocked on it, so
        `t` is when its last bytes crossed (otherwise nobody saw when they did)."""
        if waited:
            self.forecast.observed(a, t - self._seconds(link, nbytes), t)
        else:
            self.forecast.passed(a)

    # ------------------------------------------------------------ gradient reduction

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

    def backward_begins(self, step: int) -> None:
        """The step's last backward starts: its chunks join the agreed order."""
        chunks = self.plan(step)
        self.pending[step] = {c.seq: c.params[1] - c.params[0] for c in chunks}
        self.scheduler.policy = self.policy_for(step)
        self.scheduler.enqueue(chunks)

    def params_ready(self, step: int, lo: int, hi: int) -> bool:
        """Parameters [lo, hi) have their final gradient. True if a chunk became ready."""
        pending, any_ready = self.pending[step], False
        for c in self.chunks[step]:
            if c.seq in pending:
                overlap = min(hi, c.params[1]) - max(lo, c.params[0])
                if overlap > 0:
                    pending[c.seq] -= overlap
                    if pending[c.seq] <= 0:
                        del pending[c.seq]
                        self.scheduler.ready(c)
                        any_ready = True
        return any_ready

    def backward_ends(self, step: int) -> None:
        """Parameters that got no gradient are final too."""
        for c in self.chunks[step]:
            if self.pending[step].pop(c.seq, None) is not None:
                self.scheduler.ready(c)

    def deadline(self, step: int, t: float | None = None) -> None:
        if t is not None:
            self.forecast.deadline_reached(step, t)
        self.scheduler.deadline(step)

    def launches(self, t: float | None = None) -> list[Chunk]:
        return self.scheduler.launches(t) if self.reduces else []

    def wake_at(self) -> float | None:
        """When chunks held back for a forecast P2P transfer should be reconsidered."""
        return self.scheduler.wake if self.reduces else None

    def chunk_done(self, c: Chunk, t: float | None = None) -> None:
        self.scheduler.finished(c, t)
        self.done.add(c)
        self.last_kind[c.step] = c.kind

    def reduced(self, step: int) -> bool:
        return all(c in self.done for c in self.plan(step))

    def summed(self, step: int) -> bool:
        """`step`'s asynchronous reduction is open and every chunk of it is done: its
        gradient is summed over the replicas, so its norm contribution goes now, before
        any further chunk launches (runtime/gradnorm.py)."""
        return step in self.pending and self.reduced(step)

    def close_step(self, step: int) -> tuple[list[Chunk], Kind]:
        """Forget a reduced step; returns its chunks and the kind whose wait was exposed last."""
        chunks = self.chunks.pop(step)
        self.done.difference_update(chunks)
        self.pending.pop(step, None)
        return chunks, self.last_kind.pop(step, Kind.ALLREDUCE)
