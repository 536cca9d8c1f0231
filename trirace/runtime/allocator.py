"""glibc malloc settings for every trirace rank process (local workers, torchrun's ranks),
the calibration's measurements and a benchmark's processes: whatever one system in a
benchmark gets, all get, and the calibration times what the runs run.

glibc gives big requests their own mmap and hands freed memory back to the kernel, so a
step that frees and re-allocates the same buffers faults their pages in afresh each time
(~0.4 CPU-s per step for the torch peer). These settings keep freed memory in the
process: no mmap per request (in the main arena), no trim below 1 GiB, a 256 MiB pad
whenever the heap grows.

"No mmap" rather than the largest mmap threshold glibc accepts (32 MiB): a buffer of
exactly that size, such as gpt-tiny's logits (4 x 128 x 16384 fp32), is still mapped and
faulted in anew whenever the heap has no free chunk to fit it, and those page faults cost
compute CPU on every micro-batch. The price is more peak resident memory per rank (the
memory pre-check allows for it: plan/memory.py).

The environment variables reach processes started after `use()`; `mallopt` sets the
same for the running process. A setting the user made is left alone, as a variable or
in GLIBC_TUNABLES: glibc read it when the process started. `TRIRACE_MALLOC=off` leaves
the allocator as glibc set it up. (Only the main arena never maps: a request over 64 MiB
from another thread still gets its own mapping, glibc's arenas being at most that large.)
"""

from __future__ import annotations

import ctypes
import os
import platform

# variable: (mallopt option in glibc's malloc.h, value); mallopt takes an int: at most 2 GiB
_SETTINGS = {"MALLOC_MMAP_MAX_": (-4, 0), "MALLOC_TRIM_THRESHOLD_": (-1, 1 << 30), "MALLOC_TOP_PAD_": (-2, 256 << 20)}
ENV = {k: str(value) for k, (_, value) in _SETTINGS.items()}
# the same settings under glibc's tunables (GLIBC_TUNABLES=glibc.malloc.mmap_max=...:...)
_TUNABLES = {"glibc.malloc.mmap_max": "MALLOC_MMAP_MAX_", "glibc.malloc.trim_threshold": "MALLOC_TRIM_THRESHOLD_",
             "glibc.malloc.top_pad": "MALLOC_TOP_PAD_"}


def _user_set() -> set[str]:
    """The settings the environment already makes, by either name."""
    tuned = (item.split("=", 1)[0] for item in os.environ.get("GLIBC_TUNABLES", "").split(":"))
    return {k for k in ENV if k in os.environ} | {_TUNABLES[t] for t in tuned if t in _TUNABLES}


def use() -> bool:
    """These settings for this process and every process it starts from now on, except
    those the environment already sets. False where TRIRACE_MALLOC=off, where the C
    library is not glibc (the variables then mean nothing either) or an option was refused."""
    if os.environ.get("TRIRACE_MALLOC") == "off":
        return False
    users = _user_set()
    mine = {k: v for k, v in ENV.items() if k not in users}
    os.environ.update(mine)
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return all(libc.mallopt(*_SETTINGS[k]) == 1 for k in mine)


def release() -> None:
    """Hand the heap's free pages back to the kernel now (glibc's malloc_trim), where a
    process has just freed a large object it will not allocate again in that shape: these
    settings keep them otherwise, and fragmentation can make them unusable for the next
    large request (rank 0's per-layer timing, runtime/layer_timing.py)."""
    if platform.libc_ver()[0] == "glibc":
        ctypes.CDLL(None).malloc_trim(0)
