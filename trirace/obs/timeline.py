"""What happened when, on one rank: spans on tracks, and flows from a transfer to the
computation that waited for it. Written as Chrome/Perfetto trace JSON
({"traceEvents": [...]}, complete events in microseconds, one pid per rank, one tid per
track), readable in ui.perfetto.dev and chrome://tracing."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Track ids in display order. Transfers that overlap in time on one track would break
# nesting, so concurrent transfers of a kind get lanes: tid = base + lane.
TRACKS = {"compute": 0, "p2p send": 10, "p2p recv": 20, "allreduce": 30, "sparse": 40}


@dataclass
class Recorder:
    rank: int
    enabled: bool = False
    spans: list[tuple] = field(default_factory=list)  # (track, lane, name, t0, t1, args)
    flows: list[tuple] = field(default_factory=list)  # (from span name, to span name)
    counters: list[tuple] = field(default_factory=list)  # (name, t, value)
    _lanes: dict[str, list[float]] = field(default_factory=dict)  # track -> end time per lane
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def span(self, track: str, name: str, t0: float, t1: float, **args) -> None:
        if not self.enabled:
            return
        with self._lock:
            lanes = self._lanes.setdefault(track, [])
            lane = next((i for i, end in enumerate(lanes) if end <= t0), len(lanes))
            if lane == len(lanes):
                lanes.append(t1)
            else:
                lanes[lane] = t1
            self.spans.append((track, lane, name, t0, t1, args))

    def counter(self, name: str, value: float, t: float | None = None) -> None:
        if self.enabled:
            with self._lock:
                self.counters.append((name, self.now() if t is None else t, value))

    def flow(self, src: str, dst: str) -> None:
        if self.enabled:
            with self._lock:
                self.flows.append((src, dst))

    def events(self, t_origin: float) -> list[dict]:
        """Trace events with times relative to t_origin (same clock on every local rank)."""
        us = lambda t: round((t - t_origin) * 1e6, 3)  # noqa: E731
        ev: list[dict] = [{"ph": "M", "name": "process_name", "pid": self.rank, "args": {"name": f"rank {self.rank}"}}]
        seen = set()
        where: dict[str, tuple] = {}
        for track, lane, name, t0, t1, args in self.spans:
            tid = TRACKS[track] + lane
            if tid not in seen:
                seen.add(tid)
                label = track if lane == 0 else f"{track} #{lane}"
                ev.append({"ph": "M", "name": "thread_name", "pid": self.rank, "tid": tid, "args": {"name": label}})
                ev.append({"ph": "M", "name": "thread_sort_index", "pid": self.rank, "tid": tid,
                           "args": {"sort_index": tid}})
            ev.append({"ph": "X", "name": name, "pid": self.rank, "tid": tid, "ts": us(t0),
                       "dur": max(us(t1) - us(t0), 0.001), "args": args})
            where[name] = (tid, t0, t1)
        for name, t, value in self.counters:
            ev.append({"ph": "C", "name": name, "pid": self.rank, "ts": us(t), "args": {"value": value}})
        for i, (src, dst) in enumerate(self.flows, start=self.rank * 1_000_000):
            if src in where and dst in where:
                (stid, _, s1), (dtid, d0, _) = where[src], where[dst]
                ev.append({"ph": "s", "id": i, "name": "waits for", "cat": "dep", "pid": self.rank, "tid": stid,
                           "ts": us(s1) - 0.001})
                ev.append({"ph": "f", "bp": "e", "id": i, "name": "waits for", "cat": "dep", "pid": self.rank,
                           "tid": dtid, "ts": max(us(d0), us(s1))})
        return ev


def write_trace(path: Path, events: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    tmp.replace(path)
