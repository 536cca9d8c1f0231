"""What ranks that share one host's cores cost each other: the emulated testbed's model
(sim/host.py), measured for `trirace profile --contention`.

On the testbed every rank runs on this machine's few cores, so two costs that a real
cluster does not have dominate a step:
- k processes computing at once get less work done than k times one alone (the cores,
  caches and memory are shared): the contention curve, read for k = 1..the job's ranks;
- a transfer costs CPU at both ends (gloo's threads, the kernel's network stack), a fixed
  cost per message and a cost per byte, the byte's as the computation beside it loses it
  (its caches and cores taken), for P2P messages and for all-reduce chunks apart.
Both are measured beside a thread in each process that wakes as often as the job's
communication threads do, counted in a short real run of the job (`short_run`): on
saturated cores each wake-up preempts computation.

The host's speed drifts over minutes, and one reading can be disturbed by whatever else
runs, so the probes are read in several rounds spread over the profile and each figure is
the median; a contention reading that no host could give, or with a stalled iteration, is
read once more (`refusal`). The processes are `python -m trirace.calibrate.contention_worker`
and `python -m trirace.calibrate.transfer_worker`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import testbed
from ..config import TrainConfig
from ..errors import UsageError
from ..models.build import layer_param_numels
from ..plan.layout import Layout
from .links import run_ranks


@dataclass(frozen=True)
class Contention:
    """What k processes computing the model at once on this host's cores get, k = 1..n."""

    throughput: list[float]  # [k-1]: work per second, in units of one process's fastest iteration alone (`best_s`)
    spread: list[float]  # [k-1]: coefficient of variation of one iteration's time among them
    wake_hz: list[float] = field(default_factory=list)  # [k-1]: the wake-ups each process's waker achieved
    # [k-1][process]: its iteration times in order, kept for the file: whether one process
    # stays slower than the others for a whole step, or each iteration draws afresh, is in them
    times: list[list[list[float]]] = field(default_factory=list)
    best_s: float = 0.0  # the unit: one process's fastest iteration alone (k=1); 0 where not read

    def in_unit(self, unit_s: float) -> "Contention":
        """The curve in units of an iteration of `unit_s` (the calibration's per-layer sum):
        k processes' iterations a second times `unit_s`. The simulator multiplies the curve
        by its per-layer times, so the curve must count in them; the probe's lone process
        and the layer timings need not run equally fast, and a curve in the probe's own unit
        would carry that difference into every step where the cores bind."""
        return replace(self, throughput=in_unit(self.throughput, self.best_s, unit_s), best_s=unit_s)


def in_unit(curve: list[float], unit_s: float, to_s: float) -> list[float]:
    """A contention curve counted in iterations of `unit_s` seconds, counted in ones of `to_s`."""
    return [x * to_s / unit_s for x in curve]


CONTENTION_WINDOW_S = 6.0  # one contention reading's window per k, unless a caller says otherwise
# Steps each contention process takes before it says it is ready. A young process still
# touches memory for the first time, and on a VM whose balloon hands freed pages back to
# the host a first touch costs several times a second one; a running job's ranks have
# touched theirs by their steady steps, and the window should read them as they are then.
WARM_STEPS = 3


def cpu_contention(cfg: TrainConfig, workers: int, threads: int, seconds: float = CONTENTION_WINDOW_S,
                   timeout_s: float = 300, wake_hz: float = 0.0, warm_steps: int = WARM_STEPS) -> Contention:
    """Run k processes computing the model at once (each with `threads` threads), for
    k = 1..workers. Throughput: the sum over the k of best / mean iteration time, where best
    is one process's fastest alone. The per-layer times are fastest-of-a-few too, so the
    curve turns them into what k processes really get done (k=1 included). Spread: how much
    an iteration's time varies, over all k processes' iterations (the OS hands the cores
    out unevenly; the simulator draws compute times with it). The window opens once every
    process is computing (a ready file each, then a go file). Beside each process's
    computation a thread wakes `wake_hz` times a second, as the job's communication threads
    do (short_run)."""
    out, spread, woke, series = [], [], [], []
    best = 0.0
    with tempfile.TemporaryDirectory(prefix="trirace-contend-") as tmp:
        job = Path(tmp) / "cfg.json"
        job.write_text(json.dumps(cfg.model_dump(mode="json")))
        for k in range(1, workers + 1):
            files = [Path(tmp) / f"k{k}-{i}.json" for i in range(k)]
            go = Path(tmp) / f"go{k}"
            procs = [subprocess.Popen(["timeout", "-k", "5", str(timeout_s), sys.executable, "-m",
                                       "trirace.calibrate.contention_worker", str(job), str(threads), str(go),
                                       str(seconds), str(f), str(wake_hz), str(warm_steps)])
                     for f in files]
            deadline = time.time() + timeout_s
            while not all(Path(f"{f}.ready").exists() for f in files):
                if time.time() > deadline or any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.05)
            tmp_go = go.with_suffix(".tmp")
            tmp_go.write_text(str(time.time() + 0.5))  # a warm half second with all k computing
            os.replace(tmp_go, go)
            if any(p.wait() for p in procs) or not all(f.exists() for f in files):
                raise UsageError(f"CPU contention measurement failed with {k} processes")
            got = [json.loads(f.read_text()) for f in files]
            if k == 1:
                best = got[0]["best"]
            out.append(sum(best / g["mean"] for g in got))
            times = [t for g in got for t in g["times"]]
            spread.append(statistics.pstdev(times) / statistics.fmean(times))
            woke.append(statistics.fmean(g["wake_hz"] for g in got))
            series.append([g["times"] for g in got])
    return Contention(out, spread, woke, series, best)


def plausible(throughput: list[float], cores: int, slack: float = 1.1) -> bool:
    """Whether a contention curve could be this host's: k processes never do more than
    min(k, cores) times one's best alone (with `slack` for one best iteration's luck). A
    reading past it means the host was busy while the one process ran alone, which sets
    the unit."""
    return all(x <= slack * min(k, cores) for k, x in enumerate(throughput, start=1))


def stalled(reading: Contention, ratio: float = 1.75) -> list[int]:
    """The k whose slowest iteration took over `ratio` times the median of their iterations.
    Undisturbed readings stay well under it (three ranks on two cores alternate between one
    core and half of one: at most twice the time, and rarely); an iteration past it is the
    host stalling (another process, the hypervisor), which the job beside it does not see
    in every step, and a reading that includes it charges the job too much."""
    return [k for k, procs in enumerate(reading.times, start=1)
            if (its := [t for p in procs for t in p]) and max(its) > ratio * statistics.median(its)]


def refusal(reading: Contention, cores: int) -> str:
    """Why a contention reading cannot stand for this host (empty when it can): a curve no
    host of `cores` cores could give (`plausible`), or an iteration stalled (`stalled`)."""
    if not plausible(reading.throughput, cores):
        return (f"k ranks did more than k cores can ({' '.join(f'{x:.2f}' for x in reading.throughput)}): "
                "the host was busy while one rank ran alone")
    if ks := stalled(reading):
        return (f"an iteration stalled at k={','.join(map(str, ks))} "
                f"(curve {' '.join(f'{x:.2f}' for x in reading.throughput)})")
    return ""


def steady_contention(cfg: TrainConfig, threads: int, seconds: float = CONTENTION_WINDOW_S,
                      wake_hz: float = 0.0, say: Callable[[str], None] = lambda what: None
                      ) -> tuple[Contention, list[dict]]:
    """cpu_contention for the job's ranks; a reading `refusal` turns down is read once more,
    and that one stands. Returns the reading and the refused ones, with why, for the file."""
    reading, refused = cpu_contention(cfg, cfg.world_size, threads, seconds=seconds, wake_hz=wake_hz), []
    if why := refusal(reading, os.cpu_count() or 1):
        say(f"{why}; measuring again")
        refused.append({"why": why, "cpu_throughput": reading.throughput, "iteration_times": reading.times})
        reading = cpu_contention(cfg, cfg.world_size, threads, seconds=seconds, wake_hz=wake_hz)
    return reading, refused


def _median_curve(curves: list[list[float]]) -> list[float]:
    """Each point's median over the readings (every reading has the same points)."""
    return [statistics.median(c[i] for c in curves) for i in range(len(curves[0]))]


def median_contention(readings: list[Contention], unit_s: float) -> Contention:
    """The rounds' readings as one: each in units of an iteration of `unit_s` (`in_unit`), then
    each point's median over them; the wakers' rate is each k's lowest."""
    got = [c.in_unit(unit_s) for c in readings]
    return Contention(_median_curve([c.throughput for c in got]), _median_curve([c.spread for c in got]),
                      [min(c.wake_hz[i] for c in got) for i in range(len(got[0].wake_hz))], best_s=unit_s)


@dataclass(frozen=True)
class Beside:
    """What transfer_beside_compute read: the figure (CPU seconds per byte), each busy
    window's, and the work all ranks did per second in each window (quiet, busy, ..., quiet)."""
    per_byte_s: float
    per_window: list[float]
    work_per_s: list[float]


def beside_windows(got: dict, iteration_s: float) -> list[list[dict]]:
    """transfer_worker's result as per_byte_beside reads it: per rank, each window's work
    done per second (units of `iteration_s`; None without a whole iteration), bytes and
    messages sent per second."""
    return [[{"work_per_s": iteration_s / p["mean"] if p["mean"] else None,
              "bytes_per_s": p["ops"] * got["op_bytes"] / p["window"],
              "messages_per_s": p["ops"] * got["op_messages"] / p["window"]} for p in r] for r in got["ranks"]]


def per_byte_beside(windows: list[list[dict]], per_message_s: float) -> list[float]:
    """Each busy window's CPU seconds per byte: the work the ranks did per second in it, less
    the mean of the quiet windows on either side (so a host speeding up or slowing down
    across the three does not read as the transfer's cost), less the messages' fixed cost,
    over the bytes sent per second. `windows[rank]` alternates quiet and busy, quiet first
    and last, each {"work_per_s", "bytes_per_s", "messages_per_s"}; a busy window where any
    of the three has no whole iteration (work_per_s None) is skipped. A window's lost work
    below the messages' cost reads 0, not a negative cost."""
    out = []
    for b in range(1, len(windows[0]) - 1, 2):
        around = [windows[r][i] for r in range(len(windows)) for i in (b - 1, b, b + 1)]
        if any(w["work_per_s"] is None for w in around):
            continue
        quiet = sum(w[b - 1]["work_per_s"] + w[b + 1]["work_per_s"] for w in windows) / 2
        busy = sum(w[b]["work_per_s"] for w in windows)
        sent = sum(w[b]["bytes_per_s"] for w in windows)
        messages = sum(w[b]["messages_per_s"] for w in windows)
        out.append(max(quiet - busy - messages * per_message_s, 0.0) / sent)
    return out


COLLECTIVE_PROBE_BYTES = 4 << 20  # the priority policy's default chunk, between trirace's and fifo's


def transfer_beside_compute(cfg: TrainConfig, threads: int, iteration_s: float, per_message_s: float,
                            link: str | None = None, bytes_per_s: float = 64 * 2**20, mtu: int = 9000,
                            collective: bool = False, busy_windows: int = 2, timeout_s: float = 300,
                            wake_hz: float = 0.0) -> Beside:
    """CPU seconds per byte sent that a transfer takes from computation beside it, where
    every rank shares this host's cores: the job's ranks all compute the model, and in
    alternate windows each also sends, paced at `bytes_per_s` (on the testbed's nodes at
    `link`, else over loopback): activation-sized messages round a ring, or, `collective`,
    all-reduces of reduction-sized chunks (COLLECTIVE_PROBE_BYTES) in the job's own
    data-parallel groups, whose bytes also pass through the summing. Work lost per second
    (the contention probe's units: one micro-batch's calibrated compute per iteration)
    over bytes sent per second, less the messages' fixed cost (`per_message_s`, measured
    on an idle host): `per_byte_beside` on `busy_windows` busy windows, each between two
    quiet ones, after an unread settling window. Beside saturated cores a byte costs
    several times what it costs an idle host: the bytes stream through caches the
    computation was using, and every wake-up of gloo's threads takes a core from it. So the
    operations walk through a buffer as large as the model's gradients (up to 64 MiB), as a
    reduction's chunks do, rather than reusing one that stays in cache; the buffers are
    allocated and written once, before the windows, as a job's are. Each rank has a thread
    waking `wake_hz` times a second in both windows, as cpu_contention's processes do: the
    byte's cost is what it adds to those."""
    world = cfg.world_size
    seconds = max(0.5, 8 * iteration_s * world / (os.cpu_count() or 1))  # eight iterations per window
    grads = 4 * sum(sum(n) for n in layer_param_numels(cfg.spec))
    # the replicas' groups; which ranks they hold does not matter, since every rank is on its
    # own node (across nodes) or all share one (loopback)
    groups = [Layout(cfg.parallel.pp, cfg.parallel.dp).dp_group(s) for s in range(cfg.parallel.pp)] if collective else []
    if collective and cfg.parallel.dp < 2:
        raise UsageError("the collective transfer probe needs data-parallel groups (dp >= 2)")
    nbytes = min(COLLECTIVE_PROBE_BYTES, grads // cfg.parallel.pp) // 4 * 4 if collective else cfg.activation_bytes
    span = max(1, min(grads, 64 << 20) // nbytes)
    held = testbed.held(world, 1, link, mtu) if link else nullcontext(None)
    with held as tb, tempfile.TemporaryDirectory(prefix="trirace-beside-") as tmp:
        job, out = Path(tmp) / "cfg.json", Path(tmp) / "beside.json"
        job.write_text(json.dumps(cfg.model_dump(mode="json")))
        run_ranks("transfer-beside-compute probe", "transfer_worker", world, tb,
                  [str(world), str(Path(tmp) / "store"), str(out), str(job), str(threads), str(bytes_per_s), str(seconds),
                   str(busy_windows), str(span), str(nbytes), json.dumps(groups), str(wake_hz)], out, timeout_s)
        got = json.loads(out.read_text())
    windows = beside_windows(got, iteration_s)
    per_byte = per_byte_beside(windows, per_message_s)
    if not per_byte:
        raise UsageError("transfer-beside-compute probe: no window held a whole iteration")
    work = [sum(w[i]["work_per_s"] or 0.0 for w in windows) for i in range(len(windows[0]))]
    return Beside(statistics.median(per_byte), per_byte, work)


# A fresh rank's first steps are not its steady ones (pages touched the first time, caches
# cold): a short run skips more of them than a long one does.
SHORT_RUN_STEPS, SHORT_RUN_SKIP = 14, 4


def short_run(cfg: TrainConfig, link: str | None = None, mtu: int = 9000, timeout_s: float = 600) -> float:
    """Wake-ups per second of a rank's other threads (communication: gloo's loops, the
    launcher, the waiters; with one intra-op thread per rank, as where ranks share cores,
    nothing else) while the job trains: a short real run of `cfg`, one rank on each testbed
    node at `link` (else every rank on this host's loopback), each rank's median over its
    steady steps, the mean over ranks. Its bytes and messages are the job's, so it wakes as
    the job does: gloo's loop wakes per message received, more often for a job's mixed
    traffic than for a probe's steady stream of large messages."""
    from ..plan.bounds import per_rank_median, steady_steps
    from ..runtime.launch import run_local

    nodes = cfg.world_size if link else 1
    held = testbed.held_job(nodes, cfg.world_size // nodes, link, mtu) if link else nullcontext((None, None))
    with held as (tb, topo):
        job = cfg.with_(steps=SHORT_RUN_STEPS, topology=topo, progress=False, metrics_out=None, trace_out=None,
                        tensorboard=None, checkpoint_dir=None)
        rows = run_local([job], timeout_s=timeout_s, rank_command=tb.rank_command if tb else None,
                         rank_env=tb.rank_env if tb else None, quiet=True)[0]  # not the profile's output
    steady = steady_steps(len(rows), warmup=SHORT_RUN_SKIP)
    return statistics.fmean(per_rank_median(rows[steady.start:steady.stop], "rank_wakeups", per_second=True))


@dataclass(frozen=True)
class SharedCores:
    """What the shared-core probes read, for the calibration file (sim/calibration.py)."""

    readings: list[Contention]  # each round's contention reading, in its own unit (`median_contention` joins them)
    transfer_cpu: dict[str, dict[str, float]]  # by link class: per_message_s, per_byte_idle_s, per_byte[_collective]_s
    wake_hz: float  # the job's communication threads' wake-ups per rank per second
    rounds: list[dict]  # each round's readings, for the record


def measure(cfg: TrainConfig, threads: int, probes: dict[str, dict], link: str | None, mtu: int, rounds: int,
            probe_s: float, time_layers: Callable[[], float], say: Callable[[str], None],
            note: Callable[[str], None]) -> SharedCores:
    """The shared-core probes, `rounds` times: each round reads the contention curve, calls
    `time_layers` (which times the layers once more and returns one micro-batch's forward
    and backward, the median over every timing so far: the unit the per-byte probe counts
    work in), then reads each link's per-byte cost beside computation. `probes`: each link
    class's figures from links.probe_pair with transfer CPU ("cpu_per_message_s",
    "cpu_per_byte_s", "bits_per_s"); `link`: the testbed rate the inter-node link runs at.
    `say` names each phase as it starts, `note` what happened within one.
    Each per-byte figure is the median over every round's busy windows pooled, so one
    window's outlier does not decide a round."""
    say(f"a short run of the job ({SHORT_RUN_STEPS} steps, {'one node per rank' if link else 'on loopback'}): "
        "how often its communication threads wake")
    wake_hz = short_run(cfg, link, mtu)
    # a byte's cost where it matters, beside computation on saturated cores: as P2P
    # messages, and as the replicas' all-reduce chunks
    rates = {k: min(v["bits_per_s"] / 8, 64 * 2**20) for k, v in probes.items()}
    kinds = (("per_byte_s", False), ("per_byte_collective_s", True))[:1 + (cfg.parallel.dp > 1)]
    readings, record = [], []
    for r in range(rounds):
        say(f"round {r + 1} of {rounds}: {cfg.world_size} ranks' contention (k = 1..{cfg.world_size}), "
            "transfer CPU beside computation")
        reading, refused = steady_contention(cfg, threads, probe_s, wake_hz, lambda w: note(f"round {r + 1}: {w}"))
        readings.append(reading)
        iteration_s = time_layers()
        per_byte: dict[str, dict[str, float]] = {}
        seen: dict[str, dict[str, dict]] = {}
        for k, v in probes.items():
            per_byte[k], seen[k] = {}, {}
            for name, collective in kinds:
                try:
                    got = transfer_beside_compute(cfg, threads, iteration_s, v["cpu_per_message_s"],
                                                  link if k == "inter" else None, rates[k], mtu,
                                                  collective=collective, wake_hz=wake_hz)
                except UsageError as e:  # a window without a whole iteration: the other rounds' stand
                    note(f"round {r + 1}: {e}")
                    continue
                per_byte[k][name] = got.per_byte_s
                seen[k][name] = {"per_window": got.per_window, "work_per_s": got.work_per_s}
        record.append({"cpu_throughput": reading.throughput, "compute_spread": reading.spread, "unit_s": reading.best_s,
                       "iteration_times": reading.times, "transfer_cpu": per_byte, "transfer_windows": seen,
                       "refused": refused})
    woke = min(w for c in readings for w in c.wake_hz)
    if wake_hz and woke < 0.8 * wake_hz:  # a Python thread needs the GIL to wake
        note(f"warning: the contention probe's wakers woke {woke:.0f} times a second, short of the job's {wake_hz:.0f}")
    cost = {}
    for k, v in probes.items():
        cost[k] = {"per_message_s": v["cpu_per_message_s"], "per_byte_idle_s": v["cpu_per_byte_s"]}
        for name, _ in kinds:
            got = [x for rec in record for x in rec["transfer_windows"][k].get(name, {}).get("per_window", [])]
            if not got:
                raise UsageError(f"transfer-beside-compute probe ({k}): no round held a whole iteration")
            cost[k][name] = statistics.median(got)
    return SharedCores(readings, cost, wake_hz, record)
