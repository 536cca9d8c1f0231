"""Where the host's core time goes, from Linux's /proc/stat.

A rank's own CPU (time.process_time) misses what no rank is charged for: cores left idle
while every rank waits, and the kernel's interrupt work (softirq: a shaped link's packets),
which Linux accounts to no process. On the testbed, where ranks share cores, those decide
whether the simulation may fill the cores, and how much of them the ranks actually got
varies from one run to the next. None where there is no /proc/stat.
"""

from __future__ import annotations

import os
from pathlib import Path

_STAT = Path("/proc/stat")
KINDS = ("user", "system", "idle", "irq", "steal")  # user+nice, system, idle+iowait, irq+softirq, steal


def host_cpu_s() -> dict[str, float] | None:
    """Seconds of every core so far in each of KINDS (the aggregate "cpu" line)."""
    try:
        line = _STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not line or line[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in (line[1:9] + ["0"] * 8)[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return {k: v / tick for k, v in zip(KINDS, (user + nice, system, idle + iowait, irq + softirq, steal))}


def shares(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Each kind's share of the core time between two readings (None if either is missing
    or no tick passed)."""
    if before is None or after is None:
        return None
    spent = {k: max(after[k] - before[k], 0.0) for k in KINDS}
    total = sum(spent.values())
    return {k: v / total for k, v in spent.items()} if total > 0 else None
