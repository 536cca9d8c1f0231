"""One allocator setting for every process a benchmark measures, and for the calibration
that predicts them (design.md 4: whatever one system gets, all get).

glibc gives big requests their own mmap and hands freed memory back to the kernel, so a
step that frees and re-allocates the same buffers faults their pages in afresh each time:
~0.4 CPU-s per step for the torch peer. These settings keep freed memory in the process:
no mmap per request, no trim, and a 256 MiB pad whenever the heap grows.

"No mmap" replaced an mmap threshold of 32 MiB, the largest glibc accepts. gpt-tiny's
logits (4 x 128 x 16384 fp32) are exactly 32 MiB, so the head stage still mapped and
faulted them anew whenever the heap had no free chunk to fit. At 4x1 @ 500 Mbit its ranks
took 350-600k page faults in an 8-step job (180-220k without mmap), and the asynchronous
policies, whose buffers fragment the heap more, spent 8-10% more compute CPU per step
(stop 29, 3 interleaved rounds).

The environment variables reach processes started after `use()`; `mallopt` sets the
same for the running process, which times the calibration's layers in-process.
"""

from __future__ import annotations

import ctypes
import os
import platform

TRIM_THRESHOLD = 1 << 30  # mallopt takes an int: at most 2 GiB
TOP_PAD = 256 << 20
ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD), "MALLOC_TOP_PAD_": str(TOP_PAD)}
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4  # glibc's malloc.h


def use() -> bool:
    """These settings for every process started from now on, and for this one. False where
    the C library is not glibc (the variables then mean nothing either)."""
    os.environ.update(ENV)
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return all(libc.mallopt(opt, value) == 1 for opt, value in
               ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD)))
