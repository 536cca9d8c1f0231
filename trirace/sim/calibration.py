"""A calibration file: what `trirace profile` measured where it ran, for the simulator.

JSON, so it can be read, diffed and edited. "version" names the format; a file of
another version is refused (run trirace profile again). Fields:
  model, micro_batch_size, seq_len   the shapes it was measured at (checked on use)
  threads, device                    intra-op threads per process, and the device the layers ran on
  forward_s, backward_s              per layer, one micro-batch (fastest of a few whole-model passes;
                                     the median over timings spread across the profile)
  compute_draws_s                    each timing's forward + backward, for the record (the host drifts)
  copy_draws_bytes_per_s             beside each timing, bytes per second one process copies a
                                     64 MiB buffer (the host's memory bandwidth), for the record
  optimizer_s_per_param              the optimizer phase per parameter, as the runtime runs it: the
                                     optimizer's step on a real step's gradients, publishing, zeroing
  cluster                            the cluster preset it describes (it applies to no other)
  links                              {"intra"|"inter": {"bits_per_s", "latency_s"}} measured
  rows_touched                       {tokens per replica step: token-table rows touched}, the
                                     largest over replicas, measured on the training data
                                     (it sets the sparse exchange's size)
  sparse_local_s                     seconds one replica's exchange of the token table's gradient
                                     spends on its own memory (scanning the whole table for the
                                     touched rows, zeroing it, adding the replicas' rows), alone,
                                     for this model's table and rows_touched, with at least
                                     two replicas' rows; 0: not measured
  send_buffer                        {"inter": bytes}: what a blocking send may still have to move
                                     when it returns (socket buffer and link queue take them),
                                     measured with a large send; empty: a send returns on delivery
  link_share                         {"inter": s}: two activations leaving a node together, the
                                     first to finish had s of the link while both moved (0.5:
                                     fair; TCP through the testbed's shaper is not); empty: fair
  link_queue                         {"inter": bytes}: what another transfer keeps queued ahead
                                     on a node's shaped uplink: a small all-reduce's time beside
                                     activations leaving, less its time alone, at the link's
                                     rate; empty: the link is shared at once
The testbed's shared cores (`trirace profile --contention`; empty or 0 without it, and the
simulator then takes the cores as ideal and transfers as free of CPU):
  cpu_throughput                     [k-1] = work-seconds done per second by k ranks computing at
                                     once, in units of forward_s + backward_s summed (ideal:
                                     min(k, cores); the simulator never gives more)
  compute_spread                     beside it: [k-1] = coefficient of variation of one
                                     iteration's time among those k ranks
  transfer_cpu                       {"intra"|"inter": {"per_message_s", "per_byte_s"}}: CPU
                                     seconds a transfer costs both ends together (gloo's
                                     threads and the kernel's network stack); per byte as
                                     computation beside it loses it on the shared cores
                                     (caches, wake-ups; the idle cost is kept as
                                     "per_byte_idle_s"); "per_byte_collective_s" the same for
                                     all-reduce chunks (with the summing; absent where the job
                                     has no replicas: as per_byte_s)
  comm_wakeups_hz                    wake-ups per second of a rank's communication threads in a
                                     short run of the job; cpu_throughput and transfer_cpu's
                                     per-byte costs are measured beside a thread waking as often
                                     in each process
  probe_rounds                       each round of those probes, spread over the profile, for
                                     the record: {"cpu_throughput", "compute_spread", "unit_s"
                                     (the reading's one rank's fastest iteration alone, the unit
                                     its curve counts in), "iteration_times", "transfer_cpu":
                                     {link: {"per_byte_s", "per_byte_collective_s"}},
                                     "transfer_windows": {link: {kind: {"per_window",
                                     "work_per_s"}}}, "refused": a contention reading the round
                                     measured again, and why}; cpu_throughput (each round's in
                                     the file's unit first) and compute_spread are the rounds'
                                     medians, the per-byte figures the median of every round's
                                     busy windows
  host                               where it ran
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..saved import load_versioned
from ..errors import UsageError
from ..models import ModelSpec
from ..plan.topology import Link

VERSION = 2  # the file format: a reader refuses any other


@dataclass(frozen=True)
class Calibration:
    model: str
    micro_batch_size: int
    seq_len: int
    threads: int
    forward_s: list[float]
    backward_s: list[float]
    optimizer_s_per_param: float
    cluster: str = "testbed"  # the cluster preset it describes: it applies to that one only
    links: dict[str, dict[str, float]] = field(default_factory=dict)
    rows_touched: dict[str, float] = field(default_factory=dict)  # str(tokens per replica step) -> rows touched
    cpu_throughput: list[float] = field(default_factory=list)  # empty: the ideal min(k, cores)
    compute_spread: list[float] = field(default_factory=list)  # [k-1]: CV of an iteration's time; empty: none
    transfer_cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    send_buffer: dict[str, float] = field(default_factory=dict)  # empty: a send returns on delivery
    link_share: dict[str, float] = field(default_factory=dict)  # empty: links shared fairly
    link_queue: dict[str, float] = field(default_factory=dict)  # empty: nothing waits in a link's queue
    compute_draws_s: list[float] = field(default_factory=list)
    copy_draws_bytes_per_s: list[float] = field(default_factory=list)
    comm_wakeups_hz: float = 0.0
    probe_rounds: list[dict[str, Any]] = field(default_factory=list)
    sparse_local_s: float = 0.0  # 0: not measured, the exchange costs only its bytes
    host: str = ""
    device: str = "cpu"
    version: int = VERSION

    @property
    def iteration_s(self) -> float:
        """One micro-batch's forward and backward through the whole model."""
        return sum(self.forward_s) + sum(self.backward_s)

    def check(self, spec: ModelSpec, batch: int, seq: int) -> None:
        if (self.model, self.micro_batch_size, self.seq_len) != (spec.name, batch, seq):
            raise UsageError(f"calibration is for {self.model} with micro-batches of {self.micro_batch_size} x "
                             f"{self.seq_len} tokens; this job runs {spec.name} with {batch} x {seq}: "
                             "run trirace profile with the job's flags")

    def link(self, cls: str) -> Link | None:
        got = self.links.get(cls)
        return Link(got["bits_per_s"], got["latency_s"]) if got else None

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, p)


def load_calibration(path: str | Path) -> Calibration:
    p = Path(path)
    data = load_versioned(p, f"calibration file {p}", "version", VERSION, "run trirace profile again",
                          missing=" (make one with trirace profile)")
    try:  # pydantic checks every field's type, nested ones included, against the dataclass
        cal = TypeAdapter(Calibration).validate_python(data, strict=False)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise UsageError(f"calibration file {p}: {where}: {err['msg']}") from None
    times = cal.forward_s + cal.backward_s
    if len(cal.forward_s) != len(cal.backward_s) or not all(math.isfinite(t) and t >= 0 for t in times):
        raise UsageError(f"calibration file {p}: forward_s and backward_s must be equally long, finite and "
                         "non-negative")
    costs = [v for per in cal.transfer_cpu.values() for v in per.values()] + list(cal.send_buffer.values())
    costs += list(cal.link_queue.values())
    if not all(math.isfinite(x) and 0.5 <= x <= 1 for x in cal.link_share.values()):
        raise UsageError(f"calibration file {p}: link_share must be between 0.5 and 1")
    if not all(math.isfinite(x) and x > 0 for x in cal.cpu_throughput) or \
            not all(math.isfinite(x) and x >= 0 for x in costs + cal.compute_spread
                    + [cal.comm_wakeups_hz, cal.sparse_local_s]):
        raise UsageError(f"calibration file {p}: cpu_throughput must be positive, transfer_cpu, send_buffer, "
                         "link_queue, compute_spread, comm_wakeups_hz and sparse_local_s non-negative")
    return cal
