"""A calibration round's two probes back to back (diagnostic, stop 41): the loopback
per-byte probe, then the contention curve, both beside WAKE_HZ wake-ups a second; prints
the four-rank point, its spread and the slowest iteration. Run it alternating two trees
(PYTHONPATH on each) to see whether one of them leaves the contention probe stalling.
    python probe_pair.py TAG WAKE_HZ ROUNDS"""
import sys

from trirace.config import make_config
from trirace.runtime.calibrate import cpu_contention, transfer_beside_compute

cfg = make_config(dict(model="gpt-tiny", data="synthetic", pp=2, dp=2, partition=[6, 1]))
tag, wake = sys.argv[1], float(sys.argv[2])
for _ in range(int(sys.argv[3])):
    transfer_beside_compute(cfg, 1, 0.22, 2.7e-4, None, 64 * 2**20, wake_hz=wake)
    c = cpu_contention(cfg, 4, 1, seconds=4.0, wake_hz=wake)
    print(tag, wake, "k4", round(c.throughput[3], 3), "spread", round(c.spread[3], 3),
          "slowest", round(max(max(t) for t in c.times[3]), 2), "k3", round(c.throughput[2], 3), flush=True)
