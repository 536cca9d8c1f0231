"""How often a process's threads other than the one that computes wake up.

On cores that computation saturates, each wake-up of a communication thread (gloo's TCP
loop, the waiters) preempts a computing thread, which then refills its
caches. A rank's communication threads wake hundreds to over a thousand times a second, so
the cost is several percent of the work where ranks share cores. The ranks count them per
step, and the calibration measures computation beside a thread waking as often.

Counted from Linux's /proc (voluntary context switches: a thread that blocked and was
woken); None where there is no /proc. A thread that has exited drops out of the sum, so a
difference of two readings is clamped at zero by its users. Every thread but the engine's
counts: where a rank has more than one intra-op thread, torch's pool is in it too. Where
ranks share cores (the testbed, as many ranks as cores or more) each has one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

_TASKS = Path("/proc/self/task")


def others_wakeups(main_tid: int) -> int | None:
    """Voluntary context switches so far of this process's live threads, `main_tid` excepted."""
    if not _TASKS.is_dir():
        return None
    total = 0
    for task in _TASKS.iterdir():
        if task.name == str(main_tid):
            continue
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
                    break
        except OSError:  # it exited while we looked
            continue
    return total


class Waker:
    """A daemon thread that blocks and wakes `hz` times a second until the `with` ends:
    stands in for a job's communication threads beside computation that is timed. A fixed
    timetable, so it does not drift; a whole period behind (the cores are busy), it starts
    again from now rather than waking back to back, since a wake-up that does not block
    costs the computation nothing."""

    def __init__(self, hz: float):
        self.hz, self.wakeups, self._stop = hz, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, name="trirace-waker", daemon=True)

    def __enter__(self) -> Waker:
        if self.hz > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        period, due = 1.0 / self.hz, time.perf_counter()
        while not self._stop.is_set():
            due += period
            delay = due - time.perf_counter()
            if delay <= 0:
                due, delay = time.perf_counter() + period, period
            while delay > 0:  # one sleep per period at the rates used; a slow one checks for `stop` often
                if self._stop.is_set():
                    return
                time.sleep(min(delay, 0.05))
                delay = due - time.perf_counter()
            self.wakeups += 1
