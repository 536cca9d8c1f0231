"""What the communication runtime measures: per-step counters and per-link throughput."""

from __future__ import annotations

import threading
from collections import defaultdict

from ..obs.timeline import Recorder
from ..plan.topology import Topology


class LinkEstimates:
    """Achieved throughput per link class, from completed transfers (an exponential moving
    average), reported in the metrics. Local to a rank: no launch decision reads it."""

    def __init__(self, topo: Topology, weight: float = 0.2):
        self.weight = weight
        self.bytes_per_s = {cls: topo.link(cls).bytes_per_s for cls in ("intra", "inter")}
        self._lock = threading.Lock()

    def observe(self, link: str, nbytes: float, seconds: float, rec: Recorder) -> None:
        if seconds <= 0 or nbytes < 64 * 1024:  # small transfers measure latency, not bandwidth
            return
        with self._lock:
            old = self.bytes_per_s[link]
            self.bytes_per_s[link] = old + self.weight * (nbytes / seconds - old)
            value = self.bytes_per_s[link]
        rec.counter(f"{link}-node link MB/s (achieved)", value / 1e6)


class CommStats:
    """Counters per step: the step a transfer's data belongs to, not the wall-clock window,
    so the last steps of a 2BW run (whose updates run back to back) still own their transfers.
    Written from the engine and the waiters, hence the lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self._steps: dict[int, dict] = defaultdict(self._fresh)

    @staticmethod
    def _fresh() -> dict:
        return {"exposed": defaultdict(float), "transfers": 0, "cpu_s": 0.0, "embedding_bytes": 0.0,
                "embedding_method": None}

    def add(self, step: int, *, kind: str | None = None, exposed_s: float = 0.0, transfers: int = 0,
            cpu_s: float = 0.0, embedding_bytes: float = 0.0, embedding_method: str | None = None) -> None:
        with self._lock:
            st = self._steps[step]
            if kind is not None:
                st["exposed"][kind] += exposed_s
            st["transfers"] += transfers
            st["cpu_s"] += cpu_s
            st["embedding_bytes"] += embedding_bytes
            st["embedding_method"] = embedding_method or st["embedding_method"]

    def take(self, step: int) -> dict:
        with self._lock:
            st = self._steps.pop(step, None) or self._fresh()
        return {**st, "exposed": dict(st["exposed"])}
