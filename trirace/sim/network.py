"""A flow-level fluid network: transfers share each resource max-min fairly.

Resources have a capacity (bytes/s for links, work-seconds/s for a processor). A flow
drains its remaining amount at a rate set by weighted max-min fairness (progressive
filling): every unfrozen flow's rate rises together until some resource saturates, whose
flows then freeze. A flow crosses a resource with a weight, the number of identical copies
of it that share that resource (see sim/fabric.py), so one flow can stand for many.

A resource may have a capacity that depends on its load (the summed weight of the flows
crossing it): a host's cores do less total work with four processes than with two, as
measured (sim/host.py).

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


class Network:
    def __init__(self):
        self.capacity: list[float] = []
        self.curves: dict[int, Callable[[float], float]] = {}  # resource -> capacity at a load
        self.names: list[str] = []
        self.flows: dict[object, Flow] = {}
        self.clock = 0.0
        self._dirty = False

    def resource(self, name: str, capacity: float, curve: Callable[[float], float] | None = None) -> int:
        """A resource of `capacity`, or of `curve(load)` where given (never above `capacity`)."""
        if capacity <= 0:
            raise ValueError(f"resource {name!r}: capacity must be positive (got {capacity})")
        self.capacity.append(float(capacity))
        self.names.append(name)
        if curve is not None:
            self.curves[len(self.capacity) - 1] = curve
        return len(self.capacity) - 1

    # ------------------------------------------------------------ flows

    def start(self, key: object, amount: float, uses: Uses, now: float) -> None:
        if key in self.flows:
            raise ValueError(f"flow {key!r} already running")
        self.advance(now)
        self.flows[key] = Flow(key, max(float(amount), 0.0), tuple((r, w) for r, w in uses if w > 0))
        self._dirty = True

    def advance(self, now: float) -> None:
        """Drain every flow up to `now` at its current rate."""
        dt = now - self.clock
        if dt < -1e-9:
            raise ValueError(f"time went backwards: {now} < {self.clock}")
        if dt > 0:
            self._rates()
            for f in self.flows.values():
                f.remaining = max(f.remaining - f.rate * dt, 0.0)
            self.clock = now

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
        # Per resource: the unfrozen flows crossing it and their summed weight, kept up to
        # date as flows freeze (one pass over the uses in all, not one per bottleneck).
        crossing: dict[int, list[Flow]] = {}
        weight: dict[int, float] = {}
        for f in self.flows.values():
            f.rate = math.inf if not f.uses else -1.0  # -1: not frozen yet
            for r, w in f.uses:
                crossing.setdefault(r, []).append(f)
                weight[r] = weight.get(r, 0.0) + w
        for r, curve in self.curves.items():
            if r in weight:
                residual[r] = min(curve(weight[r]), residual[r])
        while weight:
            bottleneck = min(weight, key=lambda r: residual[r] / weight[r])
            level = max(residual[bottleneck] / weight[bottleneck], 0.0)
            for f in crossing.pop(bottleneck):
                if f.rate >= 0:
                    continue  # frozen at an earlier bottleneck
                f.rate = level
                for r, w in f.uses:
                    residual[r] -= w * level
                    if r in weight:
                        weight[r] -= w
            del weight[bottleneck]
            for r in [r for r, w in weight.items() if w <= _EPS]:  # every flow on it is frozen
                del weight[r], crossing[r]
