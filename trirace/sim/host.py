"""The host CPU that emulated ranks share (the testbed: every namespace on one machine's
cores), as the simulator sees it.

Two things that cost step time there are not per-layer compute:
- Cores do less total work as more processes compete for them (caches, memory bandwidth,
  the scheduler). `trirace profile` measures k copies of the model computing at once;
  `capacity(k)` interpolates that curve, never above the ideal min(k, cores), so a
  simulated run cannot beat the lower bound that assumes ideal cores.
- A transfer costs CPU at both ends (gloo's threads, the kernel's network stack): a fixed
  cost per message and a cost per byte, measured per link class by the same profile, the
  byte's cost as the work computation loses beside it (its caches and cores taken: several
  times what the transfer alone uses), for P2P messages and for all-reduce chunks (which
  also sum what they receive) apart. Computation shares the cores with it, so it
  slows while communication runs.
Without a calibration the curve is ideal and transfers cost no CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .calibration import Calibration


@dataclass(frozen=True)
class HostCpu:
    cores: int
    throughput: tuple[float, ...] = ()  # [k-1]: work-seconds per second of k workers at once
    per_message_s: dict[str, float] = field(default_factory=dict)  # by link class (intra, inter)
    per_byte_s: dict[str, float] = field(default_factory=dict)  # P2P messages
    per_byte_collective_s: dict[str, float] = field(default_factory=dict)  # all-reduce chunks (else per_byte_s)

    @classmethod
    def of(cls, cores: int | None, calibration: Calibration | None) -> "HostCpu | None":
        if not cores:
            return None
        if calibration is None:
            return cls(cores)
        cost = calibration.transfer_cpu
        return cls(cores, tuple(calibration.cpu_throughput),
                   {k: v.get("per_message_s", 0.0) for k, v in cost.items()},
                   {k: v.get("per_byte_s", 0.0) for k, v in cost.items()},
                   {k: v["per_byte_collective_s"] for k, v in cost.items() if "per_byte_collective_s" in v})

    def byte_cost(self, link_class: str, collective: bool) -> float:
        """CPU seconds a byte sent costs on `link_class`; a collective's as a message's where
        it was not measured apart (a profiled job without replicas has no all-reduce groups)."""
        if collective and link_class in self.per_byte_collective_s:
            return self.per_byte_collective_s[link_class]
        return self.per_byte_s.get(link_class, 0.0)

    def capacity(self, load: float) -> float:
        """Work-seconds per second the cores give `load` workers computing at once. A
        transfer's per-byte CPU weight is a small fraction of a worker, so the load is
        counted as at least one worker: transfers alone are never CPU-bound."""
        k = max(load, 1.0)
        ideal = min(k, float(self.cores))
        t = self.throughput
        if not t:
            return ideal
        k = min(k, float(len(t)))
        lo = int(k)  # linear between the measured points; flat past the last
        got = t[lo - 1] if lo >= len(t) else t[lo - 1] + (k - lo) * (t[lo] - t[lo - 1])
        return max(min(got, ideal), 1e-9)
