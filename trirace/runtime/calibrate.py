"""`trirace profile`: measure what the simulator needs, where the job will run.

- per-layer forward and backward seconds of one micro-batch, timed in whole-model passes
  as a pipeline runs them (runtime/profile.py), with as many intra-op
  threads as a worker of a pp x dp job gets here (runtime/worker.py's rule);
- the optimizer step's seconds per parameter;
- token-table rows a replica's step touches, on the job's own data;
- link latency and bandwidth, by the same ping-pong as the start-up probe, between two
  real processes: across two emulated nodes of the testbed (root) when `link` is given,
  and on this host's loopback for the intra-node link;
- where the ranks share this host's cores (the testbed), what they cost each other
  (sim/host.py): the work k processes computing at once get done, for k up to the
  job's ranks, and the CPU seconds a transfer costs both ends, per message (on the same
  pairs as the link probe) and per byte (as the work computation beside it loses:
  transfer_beside_compute); both measured beside a thread in each process that wakes as
  often as the job's communication threads do in a short real run (short_run);
- the sparse exchange's passes over the token table on this host (sparse_local_s).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch

from ..config import TrainConfig
from ..errors import UsageError
from ..models import build_layers
from ..models.build import layer_param_numels, loss_of
from ..optim import make_optimizer, muon_matrices
from ..sim.calibration import Calibration, layout_key
from . import allocator
from .profile import pass_times
from ..data.batches import batch_fn, sampler_for


def _best(fn, reps: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def layer_times(cfg: TrainConfig, reps: int = 5) -> tuple[list[float], list[float], float]:
    """(forward_s per layer, backward_s per layer, optimizer seconds per parameter)."""
    return (*_passes(cfg, reps), optimizer_time(cfg))


def _passes(cfg: TrainConfig, reps: int) -> tuple[list[float], list[float]]:
    inputs, targets = batch_fn(cfg, sampler_for(cfg))(0, 0)
    return pass_times(cfg.spec, inputs, targets, cfg.seed, reps)


def _forward_backward(layers: list[torch.nn.Module], loss, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    """`inputs` through every layer and the loss, and back: each gradient accumulates."""
    h = inputs
    for layer in layers:
        h = layer(h)
    loss(h, targets).backward()


def step_gradients(cfg: TrainConfig, most: int = 4) -> tuple[list[torch.nn.Module], list[torch.Tensor]]:
    """The model's layers and each parameter's gradient after one replica's first step
    (its m micro-batches, at most `most`: a profile's time stays bounded, and where m is
    larger OPT is a smaller share of the step), as the runtime accumulates them."""
    layers = build_layers(cfg.spec, cfg.seed)
    sample, loss = batch_fn(cfg, sampler_for(cfg)), loss_of(cfg.spec)
    for i in range(min(cfg.micro_batches, most)):
        _forward_backward(layers, loss, *sample(0, i))
    return layers, [p.grad for layer in layers for p in layer.parameters()]


def optimizer_time(cfg: TrainConfig, reps: int = 3) -> float:
    """Seconds per parameter of OPT as the runtime runs it (runtime/stage.py `step`): the
    optimizer's step, publishing the new weights into the other buffer, and zeroing a
    gradient buffer, fastest of `reps` after a warm-up. On a real step's gradients:
    gpt-tiny's Adam took 8-9 ns a parameter here on all-zero gradients against 5-6 on a
    step's (whose token table is zero outside the rows touched); a 2x2 run's OPT used
    6.0 and 4.9 ns of CPU a parameter on its two stages (stop 44)."""
    layers, grads = step_gradients(cfg)
    originals = [p for layer in layers for p in layer.parameters()]
    params = [torch.nn.Parameter(p.detach().clone()) for p in originals]
    for p, g in zip(params, grads):
        p.grad = g if g is not None else torch.zeros_like(p)  # a parameter the loss never reached
    hidden = muon_matrices(layers, 0, len(layers))  # muon: its split, so its Newton-Schulz cost is timed
    opt = make_optimizer(params, cfg.optimizer, cfg.learning_rate, cfg.decay,
                         {id(c) for c, p in zip(params, originals) if id(p) in hidden})
    copies = [p.detach().clone() for p in params]
    n = sum(p.numel() for p in params)
    flat_grad = torch.empty(n)  # the buffer that the runtime zeroes for the next version's gradients

    def step():
        opt.step()
        with torch.no_grad():  # publishing the new version is part of OPT
            for c, p in zip(copies, params):
                c.copy_(p)
        flat_grad.zero_()
    return _best(step, reps) / n


def compute_now(cfg: TrainConfig, threads: int) -> float:
    """One micro-batch's forward and backward through the whole model, in seconds, measured
    as the calibration measures it (with its thread count): this host's speed right now,
    to set beside what the calibration saw."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fwd, bwd = _passes(cfg, 5)  # the optimizer is not the host's speed
    finally:
        torch.set_num_threads(before)
    return sum(fwd) + sum(bwd)


def copy_rate(nbytes: int = 64 << 20, reps: int = 5) -> float:
    """Bytes per second one thread copies a buffer far larger than the caches: the host's
    memory speed right now, fastest of `reps`. Taken beside each compute draw, and before
    and after each sim-accuracy cell, for the record: a transfer's per-byte cost is memory
    traffic that computation mostly is not (gpt-tiny's layers sit in cache). Always one
    intra-op thread, whatever the caller's: torch splits a copy this large over its
    threads (on this host 6.7-7.8 GB/s with one, 17-20 with two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        return nbytes / _best(lambda: dst.copy_(src), reps)
    finally:
        torch.set_num_threads(before)


def rows_touched(cfg: TrainConfig, steps: int = 4) -> float:
    """Distinct token ids in one replica's step (its m micro-batches), the largest over the
    replicas, averaged over a few steps: what the sparse exchange ships."""
    sample = batch_fn(cfg, sampler_for(cfg))
    m = cfg.micro_batches
    per_step = []
    for t in range(steps):
        per_step.append(max(
            int(torch.unique(torch.cat([sample(t, r * m + i)[0].reshape(-1) for i in range(m)])).numel())
            for r in range(cfg.dp)))
    return sum(per_step) / len(per_step)


def sparse_local_s(cfg: TrainConfig, rows: float, reps: int = 5) -> float:
    """Seconds one replica's sparse exchange of the token table's gradient spends on its own
    memory (runtime/sparse_exchange.py `local_passes`: a scan of the whole [V, d] table for
    the `rows` touched, zeroing it and adding the replicas' rows), fastest of `reps`, as
    layers are timed. With at least two replicas' rows even where the profiled job has
    none: a sweep prices other layouts from the same file. In the 4x1 job at 100 Mbit
    these passes took 11-35 ms of a 0.1-0.3 s exchange that the simulator had put at 0.06 s,
    and under priority the exchange goes first and holds the step's chunks behind it."""
    from .sparse_exchange import local_passes

    spec = cfg.spec
    k = min(max(int(round(rows)), 1), spec.vocab_size)
    gen = torch.Generator().manual_seed(cfg.seed)
    grad = torch.zeros(spec.vocab_size, spec.d_model)
    grad[torch.randperm(spec.vocab_size, generator=gen)[:k]] = torch.randn(k, spec.d_model, generator=gen)
    out = torch.empty_like(grad)
    return _best(lambda: local_passes(grad, out, max(cfg.dp, 2)), reps)


def send_buffer(rank: int, bytes_per_s: float, nbytes: int = 8 << 20, reps: int = 3) -> float:
    """Bytes a blocking send of `nbytes` (more than the buffers hold) still had to move when
    it returned, from when it returned and when the receive completed: the kernel's socket
    buffer and the link's queue. Gloo's send returns as soon as they took the tail, long
    before the bytes arrive on a slow link. Median of `reps`; rank 0 sends to rank 1."""
    import torch.distributed as dist

    t = torch.zeros(nbytes // 4)
    got = []
    for _ in range(reps):
        h = dist.irecv(t, 0) if rank == 1 else None
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.isend(t, 1).wait()
        else:
            h.wait()
        took = torch.tensor([time.perf_counter() - t0, 0.0], dtype=torch.float64)
        if rank == 1:
            took = took.flip(0)  # [send returned, receive completed]
        dist.all_reduce(took)
        got.append(min(max((float(took[1]) - float(took[0])) * bytes_per_s, 0.0), float(nbytes)))
    return sorted(got)[len(got) // 2]


_PROBE = r"""
import json, sys, torch, torch.distributed as dist
from trirace.plan.topology import Topology, single_node
from trirace.runtime.link_probe import probe_links
from trirace.runtime.calibrate import send_buffer, transfer_cpu
rank, store, out, nodes = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
from trirace.runtime.gloo import backend
dist.init_process_group(backend("gloo"), init_method=f"file://{store}", rank=rank, world_size=2)
base = single_node(2)
topo = probe_links(Topology(nodes, 2 // nodes, base.intra, base.inter), torch.device("cpu"), large_bytes=4 << 20)
link = topo.inter if nodes == 2 else topo.intra
cost = transfer_cpu(rank, link.bytes_per_s)
if nodes == 2:  # across the emulated link: how much a blocking send leaves in flight
    cost["send_buffer_bytes"] = send_buffer(rank, link.bytes_per_s)
if rank == 0:
    json.dump({"bits_per_s": link.bits_per_s, "latency_s": link.latency_s, **cost}, open(out, "w"))
dist.destroy_process_group()
"""


def transfer_cpu(rank: int, bytes_per_s: float, seconds: float = 2.0) -> dict[str, float]:
    """CPU seconds (user + system, every thread, both processes together) one message and
    one byte cost, from a run of small messages and a run of large ones, rank 0 sending to
    rank 1 over the default group. Process CPU time leaves out the time spent blocked,
    so a slow link does not inflate it."""
    import torch.distributed as dist

    def cpu() -> float:
        t = os.times()
        return t.user + t.system

    def both(fn) -> float:
        dist.barrier()
        c0 = cpu()
        fn()
        dist.barrier()
        got = torch.tensor([cpu() - c0], dtype=torch.float64)
        dist.all_reduce(got)
        return float(got)
    small, big = torch.zeros(1), torch.zeros(1 << 20)  # 4 B, 4 MiB
    # seconds' worth of the link, at most 256 MiB: loopback's probed rate can be far above what
    # a loaded host then moves
    n_small, n_big = 300, min(64, max(2, int(seconds * bytes_per_s / big.nbytes)))

    def run(t: torch.Tensor, n: int):
        return lambda: [dist.send(t, 1) if rank == 0 else dist.recv(t, 0) for _ in range(n)]
    base = both(lambda: None)  # two barriers' worth
    per_message = max(both(run(small, n_small)) - base, 0.0) / n_small
    per_byte = max(both(run(big, n_big)) - base - n_big * per_message, 0.0) / (n_big * big.nbytes)
    return {"cpu_per_message_s": per_message, "cpu_per_byte_s": per_byte}


def model_step(cfg: TrainConfig):
    """One micro-batch's forward and backward through the whole model, as a function: the
    loop the CPU probes time in their own processes (which import it from here)."""
    layers = build_layers(cfg.spec, cfg.seed)
    x = torch.randint(0, cfg.spec.vocab_size, (cfg.micro_batch_size, cfg.tokens_seq))
    loss = loss_of(cfg.spec)
    return lambda: _forward_backward(layers, loss, x, x)


_CONTEND = r"""
import json, os, sys, time, torch
from trirace.config import TrainConfig
from trirace.runtime.calibrate import model_step
from trirace.runtime.wakeups import Waker
cfg = TrainConfig(**json.load(open(sys.argv[1])))
threads, go, seconds, out, wake_hz = int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5], float(sys.argv[6])
torch.set_num_threads(threads)
torch.manual_seed(0)
waker, woke = Waker(wake_hz).__enter__(), time.time()  # the job's communication threads' wake-ups, throughout
step = model_step(cfg)
for _ in range(int(sys.argv[7])):  # a fresh process's first steps run slow: ready only after them
    step()
open(out + ".ready", "w").close()
while not os.path.exists(go):  # keep computing until every copy is ready
    step()
start = float(open(go).read())
while time.time() < start:
    step()
times, cpu = [], []
while not times or time.time() < start + seconds:  # at least one step, however slow
    t0, c0 = time.perf_counter(), time.thread_time()
    step()
    times.append(time.perf_counter() - t0)
    cpu.append(time.thread_time() - c0)
waker.__exit__()
json.dump({"mean": sum(times) / len(times), "best": min(times), "times": times, "cpu": cpu,
           "wake_hz": waker.wakeups / (time.time() - woke)}, open(out, "w"))
"""


@dataclass(frozen=True)
class Contention:
    """What k processes computing the model at once on this host's cores get, k = 1..n."""

    throughput: list[float]  # [k-1]: work per second, in units of one process's fastest alone (`in_unit`: of another)
    spread: list[float]  # [k-1]: coefficient of variation of one iteration's time among them
    wake_hz: list[float] = field(default_factory=list)  # [k-1]: the wake-ups each process's waker achieved
    # [k-1][process]: its iteration times in order, kept for the file: whether one process stays
    # slower than the others for a whole step, or each iteration draws afresh, is in them
    times: list[list[list[float]]] = field(default_factory=list)
    # [k-1]: the same work per second, had the cores gone to the computing threads alone at
    # the CPU each of their iterations took (`thread_curve`): the wall the curve loses beyond
    # that is time-slicing's switches and the wakers' own CPU, not the computation's
    thread_throughput: list[float] = field(default_factory=list)
    best_s: float = 0.0  # the unit: one process's fastest iteration alone (k=1), 0 where not read

    def in_unit(self, unit_s: float) -> "Contention":
        """The curves in units of an iteration of `unit_s` (the calibration's per-layer sum):
        k processes' iterations a second times `unit_s`. The simulator multiplies the curve by
        its per-layer times, so the curve must count in them: stop 47 found the probe's one
        process alone up to 6% faster than the layer draws around it (250 Mbit at 63f14d0:
        0.201 s against 0.213), and every step where the cores bind predicted as much too slow."""
        return replace(self, throughput=in_unit(self.throughput, self.best_s, unit_s),
                       thread_throughput=in_unit(self.thread_throughput, self.best_s, unit_s), best_s=unit_s)


def in_unit(curve: list[float], unit_s: float, to_s: float) -> list[float]:
    """A contention curve counted in iterations of `unit_s` seconds, counted in ones of `to_s`."""
    return [x * to_s / unit_s for x in curve]


CONTENTION_WINDOW_S = 6.0  # one contention reading's window per k, unless a caller says otherwise
# Steps each contention process takes before it says it is ready. With one, 30 of the 36
# iterations over 1.75x their median in the kept calibrations up to stop 43 were a window's
# first or second, when each process had lived two or three steps. A young process still
# touches memory for the first time, and on this VM a first touch costs 1.2-2.7 s per GB
# against 0.1-0.2 to touch it again (the balloon hands freed pages back to the host). A
# running job's ranks have touched theirs by their steady steps; the window should too.
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
    do (short_run): each wake-up on a saturated core preempts computation."""
    out, spread, woke, series, by_thread = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="trirace-contend-") as tmp:
        job = Path(tmp) / "cfg.json"
        job.write_text(json.dumps(cfg.model_dump(mode="json")))
        for k in range(1, workers + 1):
            files = [Path(tmp) / f"k{k}-{i}.json" for i in range(k)]
            go = Path(tmp) / f"go{k}"
            procs = [subprocess.Popen(["timeout", "-k", "5", str(timeout_s), sys.executable, "-c", _CONTEND, str(job),
                                       str(threads), str(go), str(seconds), str(f), str(wake_hz), str(warm_steps)])
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
            by_thread.append(thread_curve_point(best, [g["cpu"] for g in got], os.cpu_count() or 1))
            times = [t for g in got for t in g["times"]]
            spread.append(statistics.pstdev(times) / statistics.fmean(times))
            woke.append(statistics.fmean(g["wake_hz"] for g in got))
            series.append([g["times"] for g in got])
    return Contention(out, spread, woke, series, by_thread, best)


def thread_curve_point(best: float, cpu: list[list[float]], cores: int) -> float:
    """k processes' work per second (units of one's best iteration alone, `best`) if the
    cores' min(k, cores) seconds a second went to their computing threads alone, each
    iteration costing the thread CPU it took (`cpu`: per process, per iteration): each
    process gets an equal share. What a k-process reading loses in CPU per iteration (caches
    evicted, memory shared) stays in it; what it loses in wall beyond that does not."""
    k = len(cpu)
    return min(k, cores) / k * sum(best / statistics.fmean(c) for c in cpu)


_BESIDE = r"""
import json, statistics, sys, threading, time, torch, torch.distributed as dist
from trirace.config import TrainConfig
from trirace.runtime.calibrate import model_step
rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
cfg = TrainConfig(**json.load(open(sys.argv[5])))
threads, rate, seconds, busy_windows, span = int(sys.argv[6]), float(sys.argv[7]), float(sys.argv[8]), int(sys.argv[9]), int(sys.argv[10])
nbytes, groups = int(sys.argv[11]), json.loads(sys.argv[12])  # groups: [] = a P2P ring of every rank
torch.set_num_threads(threads)
from trirace.runtime.wakeups import Waker
Waker(float(sys.argv[13])).__enter__()  # in quiet and busy windows alike: the job's other wake-ups
from trirace.runtime.gloo import backend
dist.init_process_group(backend("gloo"), init_method=f"file://{store}", rank=rank, world_size=world)
ring_group = dist.new_group(list(range(world)))  # the ring thread's own communicator: it alone issues on it
mine = None
for g in groups:  # every rank makes every group, in one order; each all-reduces in its own
    pg = dist.new_group(g)
    if rank in g:
        mine = (pg, len(g))
step = model_step(cfg)
size = nbytes // 4
# what one operation sends per rank: a message, or a ring all-reduce's two passes over (g-1)/g
op_bytes, op_messages = (2 * (mine[1] - 1) / mine[1] * nbytes, 2 * (mine[1] - 1)) if mine else (nbytes, 1)
n = max(4, int(seconds * rate / op_bytes))  # the same count on every rank: pairs and groups stay matched
# allocated and written once, before any window, as a job's gradients and activation buffers
# are: stop 38 found fresh buffers in every busy window charging their pages to the bytes
send, recv = torch.zeros(span * size), torch.zeros(span * size)
def op(i):
    at = (i % span) * size  # each operation on memory the last few did not touch, as gradients come
    if mine:
        dist.all_reduce(send[at:at + size], group=mine[0])
    else:
        r = dist.irecv(recv[at:at + size], (rank - 1) % world, group=ring_group)  # posted before the send
        s = dist.isend(send[at:at + size], (rank + 1) % world, group=ring_group)
        r.wait()
        s.wait()
def ring(done):
    t0 = time.perf_counter()
    for i in range(n):
        op(i)
        time.sleep(max(t0 + (i + 1) * op_bytes / rate - time.perf_counter(), 0.0))  # paced to `rate`
    done.append(time.perf_counter())
step()
op(0)  # the path's first use (connections, gloo's buffers) before any window
phases = []
for w in range(2 * busy_windows + 2):  # settle, then quiet, busy, quiet, ..., quiet: each busy window between two quiet ones
    busy = w > 0 and w % 2 == 0
    start = torch.tensor([time.perf_counter() + 0.2], dtype=torch.float64)  # one host, one clock
    dist.all_reduce(start, op=dist.ReduceOp.MAX)
    start = float(start)
    while time.perf_counter() < start:  # every rank computing before the window opens
        step()
    done = []
    th = threading.Thread(target=ring, args=(done,)) if busy else None
    if th:
        th.start()
    times = []
    while True:  # the iterations wholly inside the window: until the ring ends, or `seconds`
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        if not (th.is_alive() if th else t1 < start + seconds):
            break
        times.append(t1 - t0)
    if th:
        th.join()
    window = (done[0] if th else start + seconds) - start
    if w > 0:  # the first window only settles: what the start-up left behind lands in it, unread
        phases.append({"mean": statistics.fmean(times) if times else None, "window": window,
                       "ops": n if busy else 0})
    dist.barrier()
got = [None] * world
dist.all_gather_object(got, phases)
if rank == 0:
    json.dump({"ranks": got, "op_bytes": op_bytes, "op_messages": op_messages}, open(out, "w"))
dist.destroy_process_group()
"""


@dataclass(frozen=True)
class Beside:
    """What transfer_beside_compute read: the figure (CPU seconds per byte), each busy
    window's, and the work all ranks did per second in each window (quiet, busy, ..., quiet)."""
    per_byte_s: float
    per_window: list[float]
    work_per_s: list[float]


def beside_windows(got: dict, iteration_s: float) -> list[list[dict]]:
    """`_BESIDE`'s result as per_byte_beside reads it: per rank, each window's work done per
    second (units of `iteration_s`; None without a whole iteration), bytes and messages sent
    per second."""
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


COLLECTIVE_PROBE_BYTES = 4 << 20  # priority's default chunk, between trirace's (up to 8 MiB) and fifo's 25 MiB


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
    quiet ones, after an unread settling window. The buffers are allocated and written
    once, before it, as a job's are. On the testbed (stop 30), beside computation on saturated cores a
    message's byte cost 0.6-1.1 ns on loopback and 1.9-3.1 ns across nodes at 250-500 Mbit, 1.3-2.5x and 3-7x its idle figures, and more on slower links:
    the bytes stream through caches computation was using, and every wake-up of gloo's
    threads takes a core from it. So the operations walk through a buffer as large as the
    model's gradients (up to 64 MiB), as a reduction's chunks do, rather than reusing one
    that stays in cache. Each rank has a thread waking `wake_hz` times a second in both
    windows, as cpu_contention's processes do: the byte's cost is what it adds to those."""
    from contextlib import nullcontext

    from .. import testbed
    from ..models.build import layer_param_numels
    from ..plan.layout import Layout

    world = cfg.world_size
    seconds = max(0.5, 8 * iteration_s * world / (os.cpu_count() or 1))  # eight iterations per window
    grads = 4 * sum(sum(n) for n in layer_param_numels(cfg.spec))
    # the replicas' groups; which ranks they hold does not matter, since every rank is on its
    # own node (across nodes) or all share one (loopback)
    groups = [Layout(cfg.pp, cfg.dp).dp_group(s) for s in range(cfg.pp)] if collective else []
    if collective and cfg.dp < 2:
        raise UsageError("the collective transfer probe needs data-parallel groups (dp >= 2)")
    nbytes = min(COLLECTIVE_PROBE_BYTES, grads // cfg.pp) // 4 * 4 if collective else cfg.activation_bytes
    span = max(1, min(grads, 64 << 20) // nbytes)
    held = testbed.held(world, 1, link, mtu) if link else nullcontext(None)
    with held as tb, tempfile.TemporaryDirectory(prefix="trirace-beside-") as tmp:
        job, out = Path(tmp) / "cfg.json", Path(tmp) / "beside.json"
        job.write_text(json.dumps(cfg.model_dump(mode="json")))
        _run_ranks("transfer-beside-compute probe", _BESIDE, world, tb,
                   [str(world), str(Path(tmp) / "store"), str(out), str(job), str(threads), str(bytes_per_s), str(seconds),
                    str(busy_windows), str(span), str(nbytes), json.dumps(groups), str(wake_hz)], out, timeout_s)
        got = json.loads(out.read_text())
    windows = beside_windows(got, iteration_s)
    per_byte = per_byte_beside(windows, per_message_s)
    if not per_byte:
        raise UsageError("transfer-beside-compute probe: no window held a whole iteration")
    work = [sum(w[i]["work_per_s"] or 0.0 for w in windows) for i in range(len(windows[0]))]
    return Beside(statistics.median(per_byte), per_byte, work)


@dataclass(frozen=True)
class ShortRun:
    """What a short real run of the job showed about its ranks on these cores."""

    wake_hz: float  # a rank's other threads' wake-ups per second (the ranks' mean)
    compute_cpu_s: float  # the engine threads' CPU per steady step (F, B, OPT), all ranks


# A fresh rank's first steps are not its steady ones: in stop 46's short runs at 100 Mbit
# the ranks' computation took 1.3-1.7x its later CPU in the first three or four steps (pages
# touched the first time, caches cold), so a short run skips four where a long one skips two.
SHORT_RUN_STEPS, SHORT_RUN_SKIP = 14, 4


def short_run(cfg: TrainConfig, link: str | None = None, mtu: int = 9000, nodes: int | None = None,
              timeout_s: float = 600) -> ShortRun:
    """Wake-ups per second of a rank's other threads (communication: gloo's loops, the
    launcher, the waiters; with one intra-op thread per rank, as where ranks share cores,
    nothing else) while the job trains: a short real run of `cfg` on `nodes` testbed nodes
    at `link` (default: one rank on each; else on this host's loopback), each rank's median
    over its steady steps, the mean over ranks. Its bytes and messages are the job's, so it
    wakes as the job does: stop 34 measured gloo's loop waking once per 12 KB in a run and
    once per 40 KB in transfer_beside_compute's steady stream. A layout with ranks sharing a
    node (2x2) wakes somewhat less (stop 34: 650-750 against 610-920 a second).
    Beside it, the CPU the ranks' computation took per step (each rank's median, summed)."""
    from contextlib import nullcontext

    from .. import testbed
    from ..plan.bounds import per_rank_median, steady_steps
    from .launch import run_local

    nodes = nodes or cfg.world_size
    held = testbed.held_job(nodes, cfg.world_size // nodes, link, mtu) if link else nullcontext((None, None))
    with held as (tb, topo):
        job = cfg.model_copy(update={"steps": SHORT_RUN_STEPS, "topology": topo, "progress": False,
                                     "metrics_out": None, "trace_out": None, "checkpoint_dir": None})
        rows = run_local([job], timeout_s=timeout_s, rank_command=tb.rank_command if tb else None,
                         rank_env=tb.rank_env if tb else None, quiet=True)[0]  # not the profile's output
    steady = steady_steps(len(rows), warmup=SHORT_RUN_SKIP)
    kept = rows[steady.start:steady.stop]
    return ShortRun(statistics.fmean(per_rank_median(kept, "rank_wakeups", per_second=True)),
                    sum(per_rank_median(kept, "rank_compute_cpu_s")))


def step_work_s(cfg: TrainConfig, iteration_s: float, optimizer_s_per_param: float) -> float:
    """The computation one step of `cfg` asks of all its ranks together, in seconds alone:
    every micro-batch of every replica through the whole model once, forward and backward
    (`iteration_s`), and every replica's optimizer over the whole model. Whatever the
    partition: the stages split the layers, not the work's sum."""
    params = sum(sum(n) for n in layer_param_numels(cfg.spec))
    return cfg.dp * (cfg.micro_batches * iteration_s + params * optimizer_s_per_param)


def probe_pair(across_nodes: bool, link: str | None = None, mtu: int = 9000, timeout_s: float = 120) -> dict:
    """Ping-pong between two real processes: on two testbed nodes (`link` rate) or on loopback."""
    from contextlib import nullcontext

    from .. import testbed

    held = testbed.held(2, 1, link, mtu) if across_nodes else nullcontext(None)
    with held as tb, tempfile.TemporaryDirectory(prefix="trirace-profile-") as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "link.json"
        _run_ranks("link probe", _PROBE, 2, tb, [str(store), str(out), "2" if tb else "1"], out, timeout_s)
        return json.loads(out.read_text())


def _run_ranks(what: str, script: str, world: int, tb, args: list[str], out: Path, timeout_s: float) -> None:
    """Run `script` as `world` real processes, each given its rank and then `args` (in the
    testbed `tb`'s namespaces where there is one); `out` is what rank 0 must have written."""
    procs = [subprocess.Popen(["timeout", "-k", "5", str(timeout_s), *(tb.rank_command(r) if tb else []),
                               sys.executable, "-c", script, str(r), *args],
                              env={**os.environ, **(tb.rank_env(r) if tb else {})}) for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes) or not out.exists():
        raise UsageError(f"{what} failed (exit status {codes})")


def _on_testbed(what: str, script: str, nodes: int, ranks_per_node: int, link: str, mtu: int, args: list,
                timeout_s: float):
    """Run a probe `script` as one process per rank of a testbed held for it (nodes x
    ranks_per_node at `link`); each gets its rank, a store, the file rank 0 writes its JSON
    result to, then `args`. Returns that result."""
    from .. import testbed

    with testbed.held(nodes, ranks_per_node, link, mtu) as tb, tempfile.TemporaryDirectory(prefix="trirace-probe-") as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "result.json"
        _run_ranks(what, script, nodes * ranks_per_node, tb, [str(store), str(out), *map(str, args)], out, timeout_s)
        return json.loads(out.read_text())


_SHARE = r"""
import json, sys, time, torch, torch.distributed as dist
rank, store, out, nbytes, reps = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
from trirace.runtime.gloo import backend
dist.init_process_group(backend("gloo"), init_method=f"file://{store}", rank=rank, world_size=4)
t = torch.zeros(nbytes // 4)
shares = []
for rep in range(reps + 1):  # the first opens the connections
    h = dist.irecv(t, rank - 2) if rank >= 2 else None
    dist.barrier()
    at = torch.zeros(4, dtype=torch.float64)
    if rank < 2:  # ranks 0 and 1 share node 0's uplink, to ranks 2 and 3 on node 1
        at[rank] = time.time()  # one host, one clock: the namespaces' times compare
        dist.isend(t, rank + 2).wait()
    else:
        h.wait()
        at[rank] = time.time()
    dist.all_reduce(at)
    start = min(float(at[0]), float(at[1]))
    ends = sorted([float(at[2]) - start, float(at[3]) - start])
    if rep:
        shares.append(min(max(ends[1] / (2 * ends[0]), 0.5), 1.0))
if rank == 0:
    json.dump(sum(shares) / len(shares), open(out, "w"))
dist.destroy_process_group()
"""


def link_share(link: str, nbytes: int, mtu: int = 9000, reps: int = 21, timeout_s: float = 120) -> float:
    """How two transfers of `nbytes` that leave one testbed node together share its uplink:
    the first to finish had this fraction of the link while both moved (0.5: fair; 1: one
    after the other). TCP through the shaper is not fair: the first flow to fill its queue
    keeps most of it. Gloo sends between real processes; the mean of `reps`, since the
    split is bimodal (512 KiB at 50 Mbit: mostly 0.9, a third of the time 0.55-0.68)."""
    return float(_on_testbed("link share probe", _SHARE, 2, 2, link, mtu, [nbytes, reps], timeout_s))


_QUEUE = r"""
import json, statistics, sys, threading, time, torch, torch.distributed as dist
rank, store, out, nbytes, reps = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
from trirace.runtime.gloo import backend
dist.init_process_group(backend("gloo"), init_method=f"file://{store}", rank=rank, world_size=4)
bulk_group = dist.new_group([0, 1, 2, 3])  # the bulk thread's own communicator
pair = dist.new_group([0, 1])  # nodes 0 and 1: the small all-reduces
t, x = torch.zeros(nbytes // 4), torch.zeros(2)
def bulk(stop):  # 0 -> 2 and 1 -> 3 back to back; the sender marks its last message, so pairs stay matched
    while True:
        if rank < 2:
            t[0] = float(stop.is_set())
            dist.send(t, rank + 2, group=bulk_group)
        else:
            dist.recv(t, rank - 2, group=bulk_group)
        if t[0]:
            return
def small():
    got = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dist.all_reduce(x, group=pair)
        got.append(time.perf_counter() - t0)
        time.sleep(0.005)
    return statistics.median(got)
if rank < 2:
    small()  # opens the pair's connections
    idle = small()
dist.barrier()
stop = threading.Event()
th = threading.Thread(target=bulk, args=(stop,))
th.start()
if rank < 2:
    time.sleep(0.3)  # the bulk streams fill their queues
    busy = small()
    stop.set()
th.join()
if rank == 0:
    json.dump({"idle_s": idle, "busy_s": busy}, open(out, "w"))
dist.barrier()
dist.destroy_process_group()
"""


def link_queue(link: str, nbytes: int, bytes_per_s: float, mtu: int = 9000, reps: int = 30,
               timeout_s: float = 120) -> float:
    """Bytes a transfer keeps queued ahead of another on a testbed node's shaped uplink: the
    small all-reduce of two nodes' row counts, timed idle and while each node sends
    `nbytes` messages back to back to a third, as stage 0's replicas exchange while sending
    activations. The shaper is one FIFO queue: at 100 Mbit the all-reduce took 0.5 ms idle
    and 17-22 ms busy (stop 37), where a fluid model shares the link at once. The median of
    `reps` each way; the difference, at `bytes_per_s`, in bytes."""
    got = _on_testbed("link queue probe", _QUEUE, 4, 1, link, mtu, [nbytes, reps], timeout_s)
    return max(got["busy_s"] - got["idle_s"], 0.0) * bytes_per_s


def check_probe_settings(rounds: int, probe_s: float) -> None:
    """profile's rounds and window length, refused in one line (the CLI asks before it starts)."""
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if not 0 < probe_s <= 60:  # (NaN too) each probe process has 300 s in all
        raise UsageError("--probe-seconds must be above 0 and at most 60")


def plausible(throughput: list[float], cores: int, slack: float = 1.1) -> bool:
    """Whether a contention curve could be this host's: k processes never do more than
    min(k, cores) times one's best alone (with `slack` for one best iteration's luck). A
    reading past it means the host was busy while the one process ran alone, which sets the
    unit (stop 37: 5.63 with two processes on two cores, in one round of three)."""
    return all(x <= slack * min(k, cores) for k, x in enumerate(throughput, start=1))


def stalled(reading: Contention, ratio: float = 1.75) -> list[int]:
    """The k whose slowest iteration took over `ratio` times the median of their iterations.
    Healthy readings stay under 1.5 (three ranks on two cores alternate between one core and
    half of one); in stop 41's slow hour rounds 2 and 3 of every calibration, and the probes
    after the first two cells, held first iterations of 1.0-2.3 s against a 0.5 s median at
    k=4, reading the point 1.10-1.59 where the undisturbed rounds read 1.75-1.92. The jobs
    beside them ran faster than the disturbed curve says (4x1 at 500 and 250 Mbit came 7-14%
    over on it), so such a reading is the host's hiccup, not what ranks get."""
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
                      wake_hz: float = 0.0, say=lambda what: None) -> tuple[Contention, list[dict]]:
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
                      [min(c.wake_hz[i] for c in got) for i in range(len(got[0].wake_hz))],
                      thread_throughput=_median_curve([c.thread_throughput for c in got]), best_s=unit_s)


def profile(cfg: TrainConfig, cluster: str = "testbed", link: str | None = None, mtu: int = 9000,
            intra: bool = True, rounds: int = 3, probe_s: float = 4.0) -> Calibration:
    """Measure what the simulator needs (the module's docstring). Where ranks share cores,
    the contention curve and the per-byte transfer costs are read `rounds` times, spread
    over the calibration between compute draws, and each figure is the median (the
    per-byte ones over every round's busy windows): stop 34 saw four ranks' throughput
    read 1.70 at one calibration and 1.34-1.50 in the minutes after it, and the per-byte
    probe swing up to 3x between hours, so one reading could decide a rate's predictions.
    `probe_s`: each contention window's seconds (6 s in one reading before stop 35; three
    of 4 s now). Each round's curve counts in its own lone process's fastest iteration; the
    file's counts in the layers' (`Contention.in_unit`): what k processes get done a second
    comes from the probe alone, not from the probe's unit times the layer draws' speed."""
    from ..sim.cluster import PRESETS

    check_probe_settings(rounds, probe_s)
    threads = max(1, (os.cpu_count() or 1) // cfg.world_size)  # as runtime/worker.py gives each rank
    torch.set_num_threads(threads)
    allocator.use()  # as the ranks allocate, here and in the probes' processes

    def say(what: str) -> None:  # minutes of probes: say what runs
        print(f"profile: {what}", file=sys.stderr, flush=True)

    # The host's speed drifts over minutes (one draw of stop 30's matrix came 7% under the
    # others at its rate, and all its predictions 8-13% under), so compute is timed at
    # the start, between the probes' rounds and at the end: each layer's median over the draws.
    say("timing the layers")
    draws, copies = [layer_times(cfg)], [copy_rate()]
    probes = {}
    if intra:
        say("probing loopback")
        probes["intra"] = probe_pair(False)
    if link is not None:
        say(f"probing a {link} link")
        probes["inter"] = probe_pair(True, link, mtu)
    links = {k: {"bits_per_s": v["bits_per_s"], "latency_s": v["latency_s"]} for k, v in probes.items()}
    shared = PRESETS[cluster].shared_cores if cluster in PRESETS else None
    contention, cost, wake_hz, job_cpu_per_work, record, readings = Contention([], []), {}, 0.0, {}, [], []
    if shared:  # every rank on this host's cores: what they cost each other, beside the job's wake-ups
        # one rank a node across a link, where a rank wakes the most (stops 46-47 also ran the
        # other layouts: their CPU per work fed only a core model that lost to the curve twice)
        nodes = cfg.world_size if link else 1
        layout = layout_key(nodes, cfg.world_size // nodes)
        say(f"a short run of the job on {layout}: its wake-ups, its computation's CPU")
        before = compute_now(cfg, threads)
        run = short_run(cfg, link, mtu, nodes)
        now = statistics.fmean([before, compute_now(cfg, threads)])  # the host's speed around the run
        job_cpu_per_work[layout] = run.compute_cpu_s / step_work_s(cfg, now, draws[0][2])
        wake_hz = run.wake_hz
        # a byte's cost where it matters, beside computation on saturated cores (and idle, for the record):
        # as P2P messages, and as the replicas' all-reduce chunks
        rates = {k: min(v["bits_per_s"] / 8, 64 * 2**20) for k, v in probes.items()}
        per_byte_kinds = (("per_byte_s", False), ("per_byte_collective_s", True))[:1 + (cfg.dp > 1)]
        # per round: the contention reading (`record`: everything read, for the file)
        for r in range(rounds):
            say(f"round {r + 1} of {rounds}: {cfg.world_size} ranks' contention, transfer CPU")
            reading, refused = steady_contention(cfg, threads, probe_s, wake_hz, lambda w: say(f"round {r + 1}: {w}"))
            readings.append(reading)
            draws.append(layer_times(cfg))
            copies.append(copy_rate())
            iteration_s = statistics.median(sum(f) + sum(b) for f, b, _ in draws)
            per_byte, seen = {}, {}
            for k, v in probes.items():
                beside = partial(transfer_beside_compute, cfg, threads, iteration_s, v["cpu_per_message_s"],
                                 link if k == "inter" else None, rates[k], mtu, wake_hz=wake_hz)
                per_byte[k], seen[k] = {}, {}
                for name, collective in per_byte_kinds:
                    try:
                        got = beside(collective=collective)
                    except UsageError as e:  # a window without a whole iteration: the other rounds' stand
                        say(f"round {r + 1}: {e}")
                        continue
                    per_byte[k][name] = got.per_byte_s
                    seen[k][name] = {"per_window": got.per_window, "work_per_s": got.work_per_s}
            record.append({"cpu_throughput": readings[-1].throughput, "compute_spread": readings[-1].spread,
                           "cpu_throughput_thread": readings[-1].thread_throughput, "unit_s": readings[-1].best_s,
                           "iteration_times": readings[-1].times, "transfer_cpu": per_byte, "transfer_windows": seen,
                           "refused": refused})
        woke = min(w for c in readings for w in c.wake_hz)
        if wake_hz and woke < 0.8 * wake_hz:  # a Python thread needs the GIL to wake
            say(f"warning: the contention probe's wakers woke {woke:.0f} times a second, short of the job's {wake_hz:.0f}")
        for k, v in probes.items():
            cost[k] = {"per_message_s": v["cpu_per_message_s"], "per_byte_idle_s": v["cpu_per_byte_s"]}
            for name, _ in per_byte_kinds:
                # every round's busy windows pooled: one window reads 0.7-2.2 ns on loopback where
                # its neighbours read 1.3 (stop 38), and a median of six outvotes two such
                got = [x for rec in record for x in rec["transfer_windows"][k].get(name, {}).get("per_window", [])]
                if not got:
                    raise UsageError(f"transfer-beside-compute probe ({k}): no round held a whole iteration")
                cost[k][name] = statistics.median(got)
    share, queue = {}, {}
    if shared and link is not None:  # activations leaving one emulated node together
        say("two activations sharing an uplink")
        share = {"inter": link_share(link, cfg.activation_bytes, mtu)}
        say("a collective's messages behind activations in an uplink's queue")
        queue = {"inter": link_queue(link, cfg.activation_bytes, probes["inter"]["bits_per_s"] / 8, mtu)}
    draws.append(layer_times(cfg))
    copies.append(copy_rate())
    fwd, bwd = ([statistics.median(d[j][i] for d in draws) for i in range(len(draws[0][j]))] for j in (0, 1))
    if readings:
        contention = median_contention(readings, sum(fwd) + sum(bwd))
    rows = rows_touched(cfg)
    return Calibration(cfg.model, cfg.micro_batch_size, cfg.tokens_seq, threads, fwd, bwd,
                       statistics.median(d[2] for d in draws), cluster, links,
                       {str(cfg.tokens_per_replica_step): rows}, host=socket.gethostname(),
                       sparse_local_s=sparse_local_s(cfg, rows),
                       cpu_throughput=contention.throughput, compute_spread=contention.spread, transfer_cpu=cost,
                       send_buffer={k: v["send_buffer_bytes"] for k, v in probes.items() if "send_buffer_bytes" in v},
                       link_share=share, link_queue=queue, compute_draws_s=[sum(f) + sum(b) for f, b, _ in draws],
                       copy_draws_bytes_per_s=copies, comm_wakeups_hz=wake_hz, probe_rounds=record,
                       cpu_throughput_thread=contention.thread_throughput, job_cpu_per_work=job_cpu_per_work)
