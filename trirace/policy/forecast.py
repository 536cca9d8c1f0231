"""When one stage's P2P transfers will cross its links, and when its reductions are due,
predicted from the schedule and from what the last step measured.

A stage's action list repeats every step: the transfer of micro-batch k and the same op of
micro-batch k - m (one step earlier) sit at the same place of consecutive steps, and so do
AR(s) and AR(s - 1). An upcoming transfer is forecast at its counterpart's observed
interval, moved by how much later this step runs than the last one: the shift between the
latest observed transfer and its own counterpart.

What counts as observed is when the bytes crossed the link, not when a thread was waiting:
- a send from its issue, for nbytes / bandwidth (gloo reports a send complete as soon as
  the bytes sit in a socket buffer, which says nothing about the link);
- a receive for the same time before the engine saw it arrive, and only when the engine
  was waiting for it: data that was already there arrived at a time nobody saw, and a
  guess would move next step's forecast.
A receive still waiting for its upstream's compute is never forecast as busy once its time
has passed: nobody knows when the upstream will send. A late send is forecast as starting
now: this stage is computing what it will send.

Pure: times come in as arguments, so the simulator drives it with its clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..plan import Action, Op


@dataclass(frozen=True)
class Busy:
    start: float
    end: float


class P2PForecast:
    WINDOW = 8  # upcoming transfers considered: a step's worth at the micro-batch counts we run

    def __init__(self, actions: tuple[Action, ...], micro_batches: int, link_of: dict[Op, str]):
        self.m = micro_batches
        self.link_of = link_of
        self.upcoming: deque[Action] = deque(a for a in actions if a.op.is_p2p)  # in schedule order
        self.happened: set[Action] = set()  # happened out of order, still in `upcoming`
        self.seen: dict[tuple[Op, int], Busy] = {}
        self.shift: float | None = None  # how much later this step runs than the last one
        self.deadlines: dict[int, float] = {}  # step -> when the engine reached its AR

    # ------------------------------------------------------------ observations

    def observed(self, a: Action, start: float, end: float) -> None:
        """Action `a`'s bytes crossed its link in [start, end]."""
        self.seen[(a.op, a.index)] = Busy(start, end)
        self.passed(a)
        if (prev := self.seen.get((a.op, a.index - self.m))) is not None:
            self.shift = start - prev.start
        self.seen.pop((a.op, a.index - 2 * self.m), None)  # two steps back is never a counterpart again

    def passed(self, a: Action) -> None:
        """Action `a` happened (observed, or without a time worth recording: data that was
        already there). Transfers happen in schedule order almost always, so this is the
        head of `upcoming`; the set keeps it O(1) when not (a run has steps x 4m of them)."""
        self.happened.add(a)
        while self.upcoming and self.upcoming[0] in self.happened:
            self.happened.discard(self.upcoming.popleft())

    def deadline_reached(self, step: int, now: float) -> None:
        self.deadlines[step] = now
        self.deadlines.pop(step - 3, None)

    # ------------------------------------------------------------ forecasts

    def busy(self, link: str, now: float) -> list[Busy]:
        """Intervals on `link` that have not ended by `now`: transfers under way, then the
        upcoming ones, in time order."""
        out = [b for (op, _), b in self.seen.items() if self.link_of[op] == link and b.end > now]
        if self.shift is not None:
            for i, a in enumerate(self.upcoming):
                if i == self.WINDOW:
                    break
                if a in self.happened:
                    continue
                prev = self.seen.get((a.op, a.index - self.m))
                if prev is None or self.link_of[a.op] != link:
                    continue
                b = Busy(prev.start + self.shift, prev.end + self.shift)
                if b.start < now and a.op in (Op.SF, Op.SB):  # late: this stage is still computing it
                    b = Busy(now, now + (prev.end - prev.start))
                if b.end > now:
                    out.append(b)
        return sorted(out, key=lambda b: b.start)

    def deadline(self, step: int) -> float | None:
        """When the engine will reach AR(step), from the last two steps' AR times."""
        a, b = self.deadlines.get(step - 2), self.deadlines.get(step - 1)
        if a is None or b is None:
            return None
        return b + (b - a)
