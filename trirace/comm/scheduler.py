"""The queue of collective chunks of one rank, driven by events and decided by a policy.

Collectives must leave in the same order on every member of a group (design.md 3b), so
the order is fixed when a step's chunks are enqueued, from shapes and settings every
replica shares. Events (a chunk became ready, a transfer started or finished, a deadline
arrived) only decide *when* the head of that order launches. Not thread-safe by itself:
the runtime's executor calls it under its lock; the simulator calls it from its event loop.
"""

from __future__ import annotations

from collections import deque

from ..plan.transfers import Chunk
from .policies import InFlight, Policy


class CommScheduler:
    def __init__(self, policy: Policy, chunk_link: str = "intra"):
        self.policy = policy
        self.chunk_link = chunk_link  # the link class this rank's gradient chunks cross
        self.order: deque[Chunk] = deque()  # agreed launch order, not yet launched
        self.is_ready: set[Chunk] = set()
        self.in_flight: set[Chunk] = set()
        self.p2p: dict[str, int] = {}  # link class -> P2P transfers in flight on it
        self.urgent_through = -1  # steps whose deadline has arrived

    def enqueue(self, chunks: list[Chunk]) -> None:
        self.order.extend(sorted(chunks, key=lambda c: (c.step, c.seq)))

    def ready(self, chunk: Chunk) -> None:
        self.is_ready.add(chunk)

    def p2p_started(self, link: str = "intra") -> None:
        self.p2p[link] = self.p2p.get(link, 0) + 1

    def p2p_finished(self, link: str = "intra") -> None:
        self.p2p[link] -= 1

    def finished(self, chunk: Chunk) -> None:
        self.in_flight.discard(chunk)

    def deadline(self, step: int) -> None:
        """The engine now waits for step `step`'s reduction: nothing of it may be held back."""
        self.urgent_through = max(self.urgent_through, step)

    def now(self) -> InFlight:
        """In flight on the link this rank's chunks use: P2P elsewhere does not compete."""
        return InFlight(self.p2p.get(self.chunk_link, 0), sum(c.nbytes for c in self.in_flight))

    def launches(self) -> list[Chunk]:
        """Chunks to launch now, in order. Stops at the first that may not go yet: skipping
        it would let replicas disagree on the order."""
        out = []
        while self.order:
            head = self.order[0]
            if head not in self.is_ready:
                break
            if not self.policy.admit(head, self.now(), urgent=head.step <= self.urgent_through):
                break
            self.order.popleft()
            self.is_ready.discard(head)
            self.in_flight.add(head)
            out.append(head)
        return out

    def idle(self) -> bool:
        return not self.order and not self.in_flight
