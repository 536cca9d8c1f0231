"""Timing the layers for the partition, in its own process, gives its memory back."""

import os
import subprocess
import sys


_PROFILE_KEEPS = r"""
from trirace.config import make_config
from trirace.runtime import allocator
from trirace.obs.memory import peak_rss_mb as _peak_rss_mb, reset_peak_rss as _reset_peak_rss, rss_mb as _rss_mb
from trirace.runtime.trainer import measure_layers
allocator.use()  # as the launcher, before it times the layers
cfg = make_config({"model": "gpt2-small", "data": "synthetic", "micro_batch_size": 1, "seq_len": 16, "pp": 4, "dp": 1})
measure_layers(make_config({"model": "gpt-test", "data": "synthetic"}))  # imports and first-use allocations
_reset_peak_rss()
before = _rss_mb()
measure_layers(cfg)
print(_peak_rss_mb() - before, _rss_mb() - before)
"""


def test_timing_layers_for_the_partition_gives_its_memory_back():
    """The launcher (or rank 0) times every layer before training and lives on through it:
    with the ranks' malloc settings, which keep freed memory, it must still hand the
    layers' pages back. gpt2-small: its peak grows by hundreds of MB, which must not stay
    resident for the whole run: resident memory drops back to where it was."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # allocator.use() sets them
    out = subprocess.run([sys.executable, "-c", _PROFILE_KEEPS], capture_output=True, text=True, timeout=300,
                         check=True, env=env)
    peak, kept = map(float, out.stdout.split())
    assert peak > 300, (peak, kept)  # it did hold the big layers
    assert kept < 60, (peak, kept)
