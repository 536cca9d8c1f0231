"""A flow-level fluid network: transfers share each resource max-min fairly.

Resources have a capacity (bytes/s for links, work-seconds/s for a processor). A flow
drains its remaining amount at a rate set by weighted max-min fairness (progressive
filling): every unfrozen flow's rate rises together until some resource saturates, whose
flows then freeze. A flow crosses a resource with a weight, the number of identical copies
of it that share that resource (see sim/fabric.py), so one flow can stand for many.

A resource may have a capacity that depends on its load (the summed weight of the flows
crossing it): a host's cores do less total work with four processes than with two, as
measured (sim/host.py).

A resource may also favour its oldest flow: TCP through a shaped link is not fair between
short transfers, the first to fill the queue keeps most of it (measured by trirace
profile). Among the flows marked `senior` that cross such a resource, the one started
first counts `seniority` times in the filling: it rises that much faster than the others
(weighted max-min fairness), on every resource it crosses.

Rates change only when a flow starts or ends; between those events every flow drains
linearly, so the next completion is known exactly. Nothing here knows about time beyond
`advance(now)`; the event loop (sim/executor.py) owns the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

Uses = tuple[tuple[int, float], ...]  # (resource id, weight)

_EPS = 1e-12


@dataclass
class Flow:
    key: object
    remaining: float
    uses: Uses
    rate: float = 0.0
    senior: bool = False  # may be favoured as the oldest on a resource with seniority
    tag: str | None = None  # what its CPU time counts as (Network.cpu_at), where it crosses a curve


class Network:
    def __init__(self):
        self.capacity: list[float] = []
        self.curves: dict[int, Callable[[float], float]] = {}  # resource -> capacity at a load
        self.seniority: dict[int, float] = {}  # resource -> how much its oldest senior flow counts
        self.names: list[str] = []
        self.flows: dict[object, Flow] = {}
        self.clock = 0.0
        self._dirty = False
        # CPU seconds the flows on load-dependent resources have used up to `clock`, by tag
        # (cpu_at), and how fast each tag uses them at the current rates
        self._cpu_s: dict[str, float] = {}
        self._cpu_rate: dict[str, float] = {}

    def resource(self, name: str, capacity: float, curve: Callable[[float], float] | None = None,
                 seniority: float = 1.0) -> int:
        """A resource of `capacity`, or of `curve(load)` where given (never above `capacity`),
        whose oldest senior flow counts `seniority` times (1: fair)."""
        if capacity <= 0:
            raise ValueError(f"resource {name!r}: capacity must be positive (got {capacity})")
        self.capacity.append(float(capacity))
        self.names.append(name)
        if curve is not None:
            self.curves[len(self.capacity) - 1] = curve
        if seniority != 1.0:
            self.seniority[len(self.capacity) - 1] = seniority
        return len(self.capacity) - 1

    # ------------------------------------------------------------ flows

    def start(self, key: object, amount: float, uses: Uses, now: float, senior: bool = False,
              tag: str | None = None) -> None:
        if key in self.flows:
            raise ValueError(f"flow {key!r} already running")
        self.advance(now)
        self.flows[key] = Flow(key, max(float(amount), 0.0), tuple((r, w) for r, w in uses if w > 0), senior=senior,
                               tag=tag)
        self._dirty = True

    def advance(self, now: float) -> None:
        """Drain every flow up to `now` at its current rate."""
        dt = now - self.clock
        if dt < -1e-9:
            raise ValueError(f"time went backwards: {now} < {self.clock}")
        if dt > 0:
            self._rates()
            for tag, rate in self._cpu_rate.items():
                self._cpu_s[tag] = self._cpu_s.get(tag, 0.0) + rate * dt
            for f in self.flows.values():
                f.remaining = max(f.remaining - f.rate * dt, 0.0)
            self.clock = now

    def cpu_at(self, now: float) -> dict[str, float]:
        """CPU seconds used by `now` on the resources with a load curve, by the flows' tags,
        if no flow starts or ends before: each flow's share of the busy cores while it ran,
        min(load, cores) of them doing curve(load) work per second. (Drains nothing; may
        bring the cached rates up to date.)"""
        self._rates()
        dt = now - self.clock
        out = dict(self._cpu_s)
        for tag, rate in self._cpu_rate.items():
            out[tag] = out.get(tag, 0.0) + rate * dt
        return out

    def finished(self, now: float) -> list[object]:
        """Remove and return the flows that are done at `now`."""
        self.advance(now)
        self._rates()
        done = [k for k, f in self.flows.items()
                if f.remaining <= _EPS * max(1.0, f.rate) or (f.rate == math.inf)]
        for k in done:
            del self.flows[k]
        if done:
            self._dirty = True
        return done

    def next_completion(self) -> float | None:
        """When the first running flow will finish if nothing starts or ends before."""
        self._rates()
        best = None
        for f in self.flows.values():
            t = self.clock if f.rate == math.inf else (self.clock + f.remaining / f.rate if f.rate > 0 else None)
            if t is not None and (best is None or t < best):
                best = t
        return best

    def rate(self, key: object) -> float:
        self._rates()
        return self.flows[key].rate

    # ------------------------------------------------------------ max-min fairness

    def _rates(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        residual = list(self.capacity)
        favoured = self._favoured()  # flow key -> how much it counts (1 unless the oldest somewhere)
        # Per resource: the unfrozen flows crossing it and their summed weight, kept up to
        # date as flows freeze (one pass over the uses in all, not one per bottleneck).
        crossing: dict[int, list[Flow]] = {}
        weight: dict[int, float] = {}
        load: dict[int, float] = {}  # copies crossing, unweighted by seniority: what a curve sees
        for f in self.flows.values():
            f.rate = math.inf if not f.uses else -1.0  # -1: not frozen yet
            m = favoured.get(f.key, 1.0)
            for r, w in f.uses:
                crossing.setdefault(r, []).append(f)
                weight[r] = weight.get(r, 0.0) + w * m
                load[r] = load.get(r, 0.0) + w
        cpu_per_work: dict[int, float] = {}  # resource -> CPU seconds a unit of work costs now
        for r, curve in self.curves.items():
            if r in load:
                residual[r] = min(curve(load[r]), residual[r])
                if residual[r] > 0:  # as the curve counts it, a sliver of load is one worker's
                    cpu_per_work[r] = min(max(load[r], 1.0), self.capacity[r]) / residual[r]
        while weight:
            bottleneck = min(weight, key=lambda r: residual[r] / weight[r])
            level = max(residual[bottleneck] / weight[bottleneck], 0.0)
            for f in crossing.pop(bottleneck):
                if f.rate >= 0:
                    continue  # frozen at an earlier bottleneck
                m = favoured.get(f.key, 1.0)
                f.rate = level * m
                for r, w in f.uses:
                    residual[r] -= w * m * level
                    if r in weight:
                        weight[r] -= w * m
            del weight[bottleneck]
            for r in [r for r, w in weight.items() if w <= _EPS]:  # every flow on it is frozen
                del weight[r], crossing[r]
        self._cpu_rate = {}
        if cpu_per_work:
            for f in self.flows.values():
                if f.tag is not None and f.rate < math.inf:
                    for r, w in f.uses:
                        if r in cpu_per_work:
                            self._cpu_rate[f.tag] = self._cpu_rate.get(f.tag, 0.0) + f.rate * w * cpu_per_work[r]

    def _favoured(self) -> dict[object, float]:
        """The oldest senior flow on each resource with seniority, and how much it counts."""
        out: dict[object, float] = {}
        if not self.seniority:
            return out
        oldest: dict[int, Flow] = {}
        for f in self.flows.values():  # in the order they started
            if f.senior:
                for r, _ in f.uses:
                    if r in self.seniority and r not in oldest:
                        oldest[r] = f
        for r, f in oldest.items():
            out[f.key] = max(out.get(f.key, 1.0), self.seniority[r])
        return out
