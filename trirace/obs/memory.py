"""This process's resident memory, for the per-step metrics (Linux /proc; 0 elsewhere)."""

from __future__ import annotations

import os


def rss_mb() -> float:
    """Resident memory of this process (Linux /proc; 0 where it is not available)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def reset_peak_rss() -> None:
    """Restart VmHWM from the current resident size (Linux: "5" to clear_refs), so a worker
    running several jobs reports each job's own peak. Where it cannot, the peak stays the
    process's since start, an upper bound."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    """This process's peak resident memory since the run started (reset_peak_rss): VmHWM,
    the high-water mark of its own address space. (Not getrusage's ru_maxrss, which Linux
    carries across exec: a worker started from a large parent would report the parent's size.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0
