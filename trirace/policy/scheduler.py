"""The queue of collective chunks of one rank, driven by events and decided by a policy.

Rules, each with its reason:
1. Order is agreed, timing is local. Collectives must leave in the same order on every
   member of a group (or NCCL hangs, and gloo mixes one member's tensors with another's), so the order is fixed when a step's chunks are
   enqueued, from shapes and settings every replica shares; the head of that order is
   never skipped. Events (a chunk became ready, a transfer started or finished, a
   deadline arrived, a forecast gap opened) only decide *when* the head launches. A
   replica that waits longer only delays the collective; it cannot reorder it.
2. A link is busy only while P2P bytes cross it. A send counts from its issue until the
   sender sees it complete and, through the forecast, for the time its bytes need on the
   link. A receive that waits for its upstream's compute does not count: the link is idle
   exactly then, and that is when chunks should run.
3. Gap filling (policies with `fills_gaps`). The forecast (policy/forecast.py) says when the
   next P2P transfer will cross the chunks' link. A chunk starts only if it and the chunk
   bytes already in flight can cross before then; otherwise it waits for the end of that
   transfer and is reconsidered (`wake_at`). P2P then meets an empty link instead of
   sharing it with bulk bytes. A chunk's time here is its bytes over the link's agreed
   rate, not what chunks measured: on shared cores chunks take two to three times their
   bytes' link time, gaps measured with that time fit almost no chunk, and the chunks
   bunch up at their deadline and run into the compute they are meant to hide behind.
4. Deadlines win. Under 2BW a step's reduction is due at its AR, one step after it became
   ready. A step is urgent once the engine waits at its AR, or once its remaining chunk
   bytes plus the P2P time forecast before its deadline no longer fit in the time left:
   then nothing of it is held back, since a missed deadline stalls the whole stage. A
   step is urgent too while there are no AR times yet to forecast its deadline from (the
   first two steps; see `urgent`). Here
   the chunks' time is what chunks measured lately (`chunk_rate`), when that is slower
   than the link: the slower the chunks, the earlier a step stops waiting for gaps.
5. The token table's item (sparse) goes where backward readies it, last (the first layer
   finishes last), and is never held for a gap: on the wire it is only the touched rows,
   a fraction of the table's nbytes the gap test would see, and like every chunk of its
   step it is due at that step's OPT, right before the next forward reads the table.

Not thread-safe by itself: the runtime's executor calls it under its lock; the simulator
calls it from its event loop. Times are arguments, so both pass their own clock.
"""

from __future__ import annotations

from collections import deque

from ..plan.transfers import Chunk, Kind
from .forecast import Busy, P2PForecast
from .policies import InFlight, Policy


class CommScheduler:
    def __init__(self, policy: Policy, chunk_link: str = "intra", forecast: P2PForecast | None = None,
                 chunk_bytes_per_s: float = float("inf")):
        self.policy = policy
        self.chunk_link = chunk_link  # the link class this rank's gradient chunks cross
        self.forecast = forecast
        self.rate = chunk_bytes_per_s  # chunk bytes per second the link carries (ring traffic included)
        self.order: deque[Chunk] = deque()  # agreed launch order, not yet launched
        self.is_ready: set[Chunk] = set()
        self.in_flight: set[Chunk] = set()
        self.p2p: dict[str, int] = {}  # link class -> P2P sends in flight on it
        self.urgent_through = -1  # steps whose deadline has arrived
        self.wake: float | None = None  # when a chunk held back by the forecast is reconsidered
        self.launched: dict[Chunk, tuple[float, float]] = {}  # chunk -> (launch time, `area` then)
        self.area, self.area_t = 0.0, 0.0  # integral of chunks in flight over time, and up to when
        self.measured: float | None = None  # chunk bytes/s the link delivered lately (EWMA)

    def enqueue(self, chunks: list[Chunk]) -> None:
        self.order.extend(sorted(chunks, key=lambda c: (c.step, c.seq)))

    def ready(self, chunk: Chunk) -> None:
        self.is_ready.add(chunk)

    def p2p_started(self, link: str = "intra") -> None:
        self.p2p[link] = self.p2p.get(link, 0) + 1

    def p2p_finished(self, link: str = "intra") -> None:
        self.p2p[link] -= 1

    def _tick(self, t: float) -> None:
        self.area += len(self.in_flight) * max(0.0, t - self.area_t)
        self.area_t = max(self.area_t, t)

    def finished(self, chunk: Chunk, t: float | None = None) -> None:
        start = self.launched.pop(chunk, None)
        if t is not None:
            self._tick(t)
            if start is not None and t > start[0] and chunk.kind is Kind.ALLREDUCE:
                # It shared the link with the chunks beside it: what the link gave chunks is
                # its bytes times their mean number over its lifetime, per second.
                sharing = (self.area - start[1]) / (t - start[0])
                sample = chunk.nbytes * max(1.0, sharing) / (t - start[0])
                self.measured = sample if self.measured is None else 0.7 * self.measured + 0.3 * sample
        self.in_flight.discard(chunk)

    @property
    def chunk_rate(self) -> float:
        """What a chunk gets: the agreed link rate, or less if that is what chunks measured
        lately (shared cores, a replica that joins late). Timing only: never sizes."""
        return min(self.rate, self.measured) if self.measured else self.rate

    def deadline(self, step: int) -> None:
        """The engine now waits for step `step`'s reduction: nothing of it may be held back."""
        self.urgent_through = max(self.urgent_through, step)

    def _busy(self, t: float | None) -> list[Busy] | None:
        """The P2P forecast on the chunks' link from `t` on; None where nothing is forecast."""
        if t is None or not self.policy.fills_gaps or self.forecast is None:
            return None
        return self.forecast.busy(self.chunk_link, t)

    def now(self, t: float | None = None, busy: list[Busy] | None = None) -> InFlight:
        """In flight on the link this rank's chunks use (P2P elsewhere does not compete),
        and, given the time, the chunk bytes that fit before the next P2P forecast on it."""
        gap = float("inf")
        self.wake = None
        busy = self._busy(t) if busy is None else busy
        if busy:
            gap = max(0.0, busy[0].start - t) * self.rate
            self.wake = busy[0].end
        return InFlight(self.p2p.get(self.chunk_link, 0), sum(c.nbytes for c in self.in_flight), gap)

    def urgent(self, step: int, t: float | None, busy: list[Busy] | None = None) -> bool:
        if step <= self.urgent_through:
            return True
        busy = self._busy(t) if busy is None else busy
        if busy is None:
            return False
        due = self.forecast.deadline(step)
        if due is None:
            # No AR times to forecast from (the first steps): hold nothing for a gap. Held
            # until the engine's own AR, a step could close a cycle: another stage waiting
            # at OPT for the global norm, which needs these chunks, while this stage cannot
            # reach its AR before that stage's next send.
            return True
        left = sum(c.nbytes for c in self.order if c.step == step)
        left += sum(c.nbytes for c in self.in_flight if c.step == step)
        p2p = sum(min(b.end, due) - max(b.start, t) for b in busy if b.start < due)
        return t + left / self.chunk_rate + p2p >= due

    def launches(self, t: float | None = None) -> list[Chunk]:
        """Chunks to launch now (`t`: the caller's clock), in order. Stops at the first that
        may not go yet: skipping it would let replicas disagree on the order."""
        out = []
        self.wake = None
        busy = self._busy(t)  # launching chunks does not move the forecast: once per call
        while self.order:
            head = self.order[0]
            if head not in self.is_ready:
                break
            if not self.policy.admit(head, self.now(t, busy), urgent=self.urgent(head.step, t, busy)):
                break
            self.order.popleft()
            self.is_ready.discard(head)
            if t is not None:
                self._tick(t)
                self.launched[head] = (t, self.area)
            self.in_flight.add(head)
            out.append(head)
        return out

    def idle(self) -> bool:
        return not self.order and not self.in_flight
