"""`trirace profile`: measure what the simulator needs where the job will run, write it as a
calibration file (sim/calibration.py), and print what was measured as a short table.

Always, in about a minute for a small model:
- each layer's forward and backward on one micro-batch, and the optimizer step per
  parameter, on the job's device with as many intra-op threads as one of the job's ranks
  gets here (layers.py), timed at the start, between the probes and at the end, since the
  host's speed drifts: each layer's median over the timings;
- the loopback link (the intra-node one) between two real processes (links.py);
- the token-table rows one replica's step touches, on the job's own data, and the sparse
  exchange's passes over the table.
With `link` (root): the testbed's inter-node link at that rate, between two emulated
nodes, and how its shaper shares and queues.
With `contention` (a cluster whose ranks share this host's cores, the testbed): what they
cost each other (testbed_contention.py). Several minutes: the probes run in rounds.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import sys
import time

import torch

from ..config import TrainConfig
from ..errors import UsageError
from ..models import layer_names
from ..models.build import layer_param_numels
from ..runtime import allocator
from ..sim.calibration import Calibration
from ..sim.cluster import PRESETS
from . import testbed_contention
from ..runtime.device import job_device
from .layers import copy_rate, layer_times, rows_touched, sparse_local_s
from .links import link_queue, link_share, probe_pair


def check_probe_settings(rounds: int, probe_s: float) -> None:
    """profile's rounds and window length, refused in one line (the CLI asks before it starts)."""
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if not 0 < probe_s <= 60:  # (NaN too) each probe process has 300 s in all
        raise UsageError("--probe-seconds must be above 0 and at most 60")


def check_contention(cluster: str) -> None:
    """--contention measures cores that the ranks share: only a cluster whose ranks do."""
    if not (cluster in PRESETS and PRESETS[cluster].shared_cores):
        shared = ", ".join(name for name, c in PRESETS.items() if c.shared_cores)
        raise UsageError(f"--contention measures cores that every rank shares; cluster {cluster!r} has none "
                         f"(one that does: {shared})")


class Progress:
    """One line per phase on stderr: its number of all, the seconds so far, and what runs."""

    def __init__(self, total: int, out=None):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.out = out or sys.stderr

    def phase(self, what: str) -> None:
        self.done += 1
        self.note(f"[{self.done}/{self.total}] {what}")

    def note(self, what: str) -> None:
        print(f"profile {time.perf_counter() - self.t0:5.0f}s {what}", file=self.out, flush=True)


def profile(cfg: TrainConfig, cluster: str = "testbed", link: str | None = None, mtu: int = 9000,
            intra: bool = True, contention: bool = False, rounds: int = 3, probe_s: float = 4.0,
            progress: Progress | None = None) -> Calibration:
    """Measure what the simulator needs (the module's docstring). With `contention`, the
    shared-core probes run `rounds` times, each with `probe_s` seconds per contention window."""
    check_probe_settings(rounds, probe_s)
    if contention:
        check_contention(cluster)
    phases = 3 + intra + 3 * (link is not None) + contention * (1 + rounds)
    progress = progress or Progress(phases)
    progress.total = phases
    device = job_device(cfg)
    threads = max(1, (os.cpu_count() or 1) // cfg.world_size)  # as runtime/worker.py gives each rank
    torch.set_num_threads(threads)
    allocator.use()  # as the ranks allocate, here and in the probes' processes
    draws, copies = [], []

    def time_layers() -> float:
        """The layers and the optimizer once more; one micro-batch's median forward and backward so far."""
        draws.append(layer_times(cfg, device=device))
        copies.append(copy_rate())
        return statistics.median(sum(f) + sum(b) for f, b, _ in draws)

    progress.phase(f"timing each layer's forward and backward and the optimizer step ({device}, {threads} thread(s))")
    time_layers()
    probes = {}
    if intra:
        progress.phase("probing the loopback link between two processes")
        probes["intra"] = probe_pair(False, transfer_cpu=contention)
    share, queue = {}, {}
    if link is not None:
        progress.phase(f"probing a {link} link between two testbed nodes")
        probes["inter"] = probe_pair(True, link, mtu, transfer_cpu=contention)
        progress.phase("two activations leaving one testbed node together: how the uplink shares them")
        share = {"inter": link_share(link, cfg.activation_bytes, mtu)}
        progress.phase("a collective's message behind activations: what the uplink's queue holds")
        queue = {"inter": link_queue(link, cfg.activation_bytes, probes["inter"]["bits_per_s"] / 8, mtu)}
    shared = None
    if contention:
        shared = testbed_contention.measure(cfg, threads, probes, link, mtu, rounds, probe_s, time_layers,
                                            progress.phase, progress.note)
    progress.phase("timing the layers again (the host's speed drifts)")
    time_layers()
    progress.phase("the token-table rows the job's data touches, and the sparse exchange's passes over the table")
    rows = rows_touched(cfg)
    fwd, bwd = ([statistics.median(d[j][i] for d in draws) for i in range(len(draws[0][j]))] for j in (0, 1))
    curve = testbed_contention.median_contention(shared.readings, sum(fwd) + sum(bwd)) if shared else None
    return Calibration(cfg.model.name, cfg.parallel.micro_batch_size, cfg.tokens_seq, threads, fwd, bwd,
                       statistics.median(d[2] for d in draws), cluster,
                       {k: {"bits_per_s": v["bits_per_s"], "latency_s": v["latency_s"]} for k, v in probes.items()},
                       {str(cfg.tokens_per_replica_step): rows}, host=socket.gethostname(), device=str(device),
                       sparse_local_s=sparse_local_s(cfg, rows),
                       cpu_throughput=curve.throughput if curve else [],
                       compute_spread=curve.spread if curve else [],
                       transfer_cpu=shared.transfer_cpu if shared else {},
                       send_buffer={k: v["send_buffer_bytes"] for k, v in probes.items() if "send_buffer_bytes" in v},
                       link_share=share, link_queue=queue, compute_draws_s=[sum(f) + sum(b) for f, b, _ in draws],
                       copy_draws_bytes_per_s=copies, comm_wakeups_hz=shared.wake_hz if shared else 0.0,
                       probe_rounds=shared.rounds if shared else [])


def _layer_rows(names: list[str], fwd: list[float], bwd: list[float]) -> list[tuple[str, float, float]]:
    """(name, forward s, backward s) per row: each layer, except that a run of more than four
    numbered blocks becomes one row of their mean (a deep model's table stays short)."""
    rows, i = [], 0
    while i < len(names):
        j = i
        while j < len(names) and re.fullmatch(r"block\d+", names[j]):
            j += 1
        if j - i > 4:
            rows.append((f"{names[i]}-{names[j - 1].removeprefix('block')} (each)",
                         statistics.fmean(fwd[i:j]), statistics.fmean(bwd[i:j])))
            i = j
        else:
            rows.append((names[i], fwd[i], bwd[i]))
            i += 1
    return rows


def _rate(bits_per_s: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:.1f} {unit}"
    return f"{bits_per_s / 1e3:.0f} kbit/s"


def table(cal: Calibration, cfg: TrainConfig) -> str:
    """What a calibration holds, as a user reads it: a few lines, the layers first."""
    names = layer_names(cfg.spec)
    rows = _layer_rows(names, cal.forward_s, cal.backward_s)
    width = max(len("whole model"), *(len(r[0]) for r in rows))
    lines = [f"{cal.model}, micro-batches of {cal.micro_batch_size} x {cal.seq_len} tokens, on {cal.device} with "
             f"{cal.threads} thread(s) ({cal.host}, for cluster {cal.cluster})", "",
             f"{'layer':<{width}}  forward (ms)  backward (ms)"]
    lines += [f"{name:<{width}}  {f * 1e3:12.2f}  {b * 1e3:13.2f}" for name, f, b in rows]
    draws = " ".join(f"{x * 1e3:.3g}" for x in cal.compute_draws_s)
    lines += [f"{'whole model':<{width}}  {sum(cal.forward_s) * 1e3:12.2f}  {sum(cal.backward_s) * 1e3:13.2f}"
              f"   (each timing's sum: {draws} ms)", ""]
    params = sum(sum(n) for n in layer_param_numels(cfg.spec))
    facts = [("optimizer", f"{cal.optimizer_s_per_param * 1e9:.2f} ns per parameter ({cfg.optim.optimizer}; "
                           f"{cal.optimizer_s_per_param * params * 1e3:.1f} ms for the model's {params:,})")]
    for k, v in cal.links.items():
        extra = []
        if k in cal.send_buffer:
            extra.append(f"a blocking send returns with {cal.send_buffer[k] / 2**20:.2f} MiB still to cross")
        if k in cal.link_share:
            extra.append(f"the first of two activations leaving a node gets {cal.link_share[k]:.0%} of it")
        if k in cal.link_queue:
            extra.append(f"{cal.link_queue[k] / 1024:.0f} KiB queued ahead when busy")
        where = {"intra": "intra (loopback)", "inter": "inter (testbed)"}.get(k, k)
        facts.append((f"link {where}", f"{_rate(v['bits_per_s'])}, {v['latency_s'] * 1e6:.0f} us latency"
                      + "".join(f"; {e}" for e in extra)))
    for tokens, rows_ in cal.rows_touched.items():
        facts.append(("data", f"{rows_:.0f} of {cfg.spec.vocab_size:,} token-table rows touched per replica step "
                              f"({tokens} tokens); the sparse exchange's passes over the table "
                              f"{cal.sparse_local_s * 1e3:.1f} ms"))
    if cal.cpu_throughput:
        facts.append(("shared cores", f"work done by 1..{len(cal.cpu_throughput)} ranks at once: "
                      + " ".join(f"{x:.2f}" for x in cal.cpu_throughput) + " x one rank's; an iteration varies by "
                      + " ".join(f"{x:.0%}" for x in cal.compute_spread)
                      + f"; beside {cal.comm_wakeups_hz:.0f} wake-ups a second per rank"))
    for k, v in cal.transfer_cpu.items():
        collective = f", {v['per_byte_collective_s'] * 1e9:.2f} in all-reduces" if "per_byte_collective_s" in v else ""
        facts.append((f"transfer CPU {k}", f"{v['per_message_s'] * 1e6:.0f} us a message; {v['per_byte_s'] * 1e9:.2f} ns "
                                           f"a byte beside computation{collective} "
                                           f"({v['per_byte_idle_s'] * 1e9:.2f} idle)"))
    key = max(len(k) for k, _ in facts)
    return "\n".join(lines + [f"{k:<{key}}  {v}" for k, v in facts])


def run(cfg: TrainConfig, out: str, cluster: str, link: str | None, mtu: int, contention: bool, rounds: int,
        probe_s: float) -> Calibration:
    """The command: what runs, up front; the measurements; the file; the table on stdout."""
    progress = Progress(0)
    progress.note(f"{cfg.model.name}, micro-batches of {cfg.parallel.micro_batch_size} x {cfg.tokens_seq} tokens, as one of "
                  f"{cfg.world_size} ranks here" + (f"; links at {link}" if link else ""))
    if contention:
        progress.note(f"--contention: the shared-core probes run {rounds} round(s) of {cfg.world_size} ranks' "
                      "contention and transfer CPU; this may take several minutes")
    cal = profile(cfg, cluster, link, mtu, contention=contention, rounds=rounds, probe_s=probe_s, progress=progress)
    cal.save(out)
    print(table(cal, cfg))
    print(f"\nwrote {out} (trirace simulate --calibration {out})", flush=True)
    return cal
