"""A calibration file: what `trirace profile` measured where it ran, for the simulator.

JSON, so it can be read, diffed and edited:
  model, micro_batch_size, seq_len   the shapes it was measured at (checked on use)
  threads                            intra-op threads per process during the measurement
  forward_s, backward_s              per layer, one micro-batch (fastest of a few whole-model passes;
                                     the median over draws spread across the profile)
  compute_draws_s                    each draw's forward + backward, for the record (the host drifts)
  copy_draws_bytes_per_s             beside each draw, bytes per second one process copies a
                                     64 MiB buffer (the host's memory bandwidth), for the record
  optimizer_s_per_param              OPT per parameter, as the runtime runs it: the optimizer's
                                     step on a real step's gradients (files before stop 44:
                                     on all-zero gradients, ~1.2x), publishing, zeroing
  cluster                            the cluster preset it describes (it applies to no other)
  links                              {"intra"|"inter": {"bits_per_s", "latency_s"}} measured
  rows_touched                       {tokens per replica step: token-table rows touched}, the
                                     largest over replicas, measured on the training data
                                     (it sets the sparse exchange's size)
  cpu_throughput                     where ranks share the host's cores: [k-1] = work-seconds
                                     done per second by k workers computing at once, in
                                     units of forward_s + backward_s summed (ideal: min(k,
                                     cores); the simulator never gives more). Files before
                                     stop 47: in units of the probe's one worker alone
  cpu_throughput_thread              the same readings, had the cores gone to the computing
                                     threads alone at the CPU each iteration took (their
                                     thread CPU): what k processes lose in CPU per iteration,
                                     not in wall beyond it (empty: not measured, older files)
  job_cpu_per_work                   {"NxR": x}: in a short run of the job on N nodes of R ranks
                                     (one rank a node across a link, one node on loopback: the
                                     run that counts comm_wakeups_hz; files of stops 46-47 hold
                                     every layout the testbed could give the job), the ranks'
                                     computation's CPU per step over that step's work alone,
                                     timed just before and after the run: what computing costs
                                     the job's own ranks on these cores (empty: not measured)
  compute_spread                     beside it: [k-1] = coefficient of variation of one
                                     iteration's time among those k workers
  transfer_cpu                       {"intra"|"inter": {"per_message_s", "per_byte_s"}}: CPU
                                     seconds a transfer costs both ends together (gloo's
                                     threads and the kernel's network stack); per byte as
                                     computation beside it loses it on the shared cores
                                     (caches, wake-ups: 1.3-7x the idle cost, kept as
                                     "per_byte_idle_s"; older files have only the idle one);
                                     "per_byte_collective_s" the same for all-reduce chunks
                                     (with the summing; absent: as per_byte_s)
  send_buffer                        {"intra"|"inter": bytes}: what a blocking send may still
                                     have to move when it returns (socket buffer and link
                                     queue take them), measured with a large send
  link_share                         {"inter": s}: two activations leaving a node together,
                                     the first to finish had s of the link while both moved
                                     (0.5: fair; TCP through the testbed's shaper is not)
  link_queue                         {"inter": bytes}: what another transfer keeps queued ahead
                                     on a node's shaped uplink: a small all-reduce's time
                                     beside activations leaving, less its time alone, at the
                                     link's rate (absent: the link shared at once)
  comm_wakeups_hz                    wake-ups per second of a rank's communication threads in a
                                     short run of the job; cpu_throughput and transfer_cpu's
                                     per_byte_s were measured beside a thread waking as often
                                     in each process (0: without one; older files)
  probe_rounds                       each round of those probes, spread over the profile
                                     ({"cpu_throughput", "compute_spread", "transfer_cpu":
                                     {link: {"per_byte_s", "per_byte_collective_s"}},
                                     "transfer_windows": {link: {kind: {"per_window",
                                     "work_per_s"}}}, "unit_s": the reading's one worker's
                                     fastest iteration alone, the unit its curves count in}):
                                     cpu_throughput (each round's in the file's unit first),
                                     compute_spread and those
                                     two per-byte figures are the rounds' medians (a round's
                                     per-byte figure: the median of its busy windows'; the
                                     work done per second in each window, quiet and busy,
                                     kept); kept for the record, with "refused": the contention
                                     reading a round measured again, and why (calibrate.refusal)
  sparse_local_s                     seconds one replica's exchange of the token table's gradient
                                     spends on its own memory (scanning the whole table for the
                                     touched rows, zeroing it, adding the replicas' rows), alone,
                                     for this model's table and rows_touched, with at least
                                     two replicas' rows; 0: not measured (older files)
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

from ..errors import UsageError
from ..models import ModelSpec
from ..plan.topology import Link

VERSION = 1


def layout_key(nodes: int, ranks_per_node: int) -> str:
    """The key `job_cpu_per_work` files a layout under: "NxR"."""
    return f"{nodes}x{ranks_per_node}"


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
    cpu_throughput_thread: list[float] = field(default_factory=list)  # empty: not measured
    job_cpu_per_work: dict[str, float] = field(default_factory=dict)  # "NxR" -> x; empty: not measured
    probe_rounds: list[dict[str, Any]] = field(default_factory=list)
    sparse_local_s: float = 0.0  # 0: not measured (older files), the exchange costs only its bytes
    host: str = ""
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
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"calibration file {p} does not exist (make one with trirace profile)") from None
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or not JSON
        raise UsageError(f"calibration file {p}: not a trirace calibration ({e})") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise UsageError(f"calibration file {p}: not a version-{VERSION} trirace calibration")
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
    if not all(math.isfinite(x) and x > 0 for x in cal.cpu_throughput + cal.cpu_throughput_thread) or \
            not all(math.isfinite(x) and x >= 0 for x in costs + cal.compute_spread
                    + [cal.comm_wakeups_hz, cal.sparse_local_s, *cal.job_cpu_per_work.values()]):
        raise UsageError(f"calibration file {p}: cpu_throughput and cpu_throughput_thread must be positive, "
                         "transfer_cpu, send_buffer, link_queue, compute_spread, comm_wakeups_hz, sparse_local_s "
                         "and job_cpu_per_work non-negative")
    return cal
