"""Calibration: `trirace profile` measures what the simulator needs where a job will run,
and writes it as a calibration file (trirace/sim/calibration.py) for `trirace simulate
--calibration`.

- layers.py: each layer's forward and backward and the optimizer step, on the job's device;
  the data's touched rows and the sparse exchange's passes over the token table;
- links.py: link latency and bandwidth between real processes (loopback, or two nodes of
  the emulated testbed), and how the testbed's shaped links share and queue;
- testbed_contention.py: what ranks that share one host's cores cost each other (the
  emulated testbed's model, sim/host.py), measured only where a user asks for it;
- profile.py: the command itself, its progress and its table.
The processes the probes start are modules of their own, run as `python -m
trirace.calibrate.<name>`: link_pair, uplink_share, uplink_queue, contention_worker and
transfer_worker.

Calibration may import the runtime, the simulator, the testbed, the models and the plan;
neither the runtime nor the simulator imports calibration.
"""
