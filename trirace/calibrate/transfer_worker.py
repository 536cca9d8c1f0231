"""One rank of the transfer-beside-compute probe (testbed_contention.transfer_beside_compute):
every rank computes the model; in alternate windows each also sends, paced to a rate,
round a P2P ring or as all-reduces in the job's data-parallel groups.

    python -m trirace.calibrate.transfer_worker RANK WORLD STORE OUT JOB THREADS RATE SECONDS
                                                BUSY_WINDOWS SPAN NBYTES GROUPS WAKE_HZ

JOB: the job's config as JSON; GROUPS: a JSON list of rank lists ([]: a P2P ring of every
rank). Rank 0 writes every rank's windows (mean iteration, length, operations) to OUT."""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

from ..config import TrainConfig
from ..runtime.gloo import backend
from ..runtime.wakeups import Waker
from .layers import model_step


def main(argv: list[str]) -> None:
    rank, world, store, out = int(argv[0]), int(argv[1]), argv[2], argv[3]
    with open(argv[4]) as f:
        cfg = TrainConfig(**json.load(f))
    threads, rate, seconds, busy_windows, span = int(argv[5]), float(argv[6]), float(argv[7]), int(argv[8]), int(argv[9])
    nbytes, groups, wake_hz = int(argv[10]), json.loads(argv[11]), float(argv[12])
    torch.set_num_threads(threads)
    Waker(wake_hz).__enter__()  # in quiet and busy windows alike: the job's other wake-ups
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
    # allocated and written once, before any window, as a job's gradients and activation
    # buffers are: fresh buffers would charge their first-touch page faults to the bytes
    send, recv = torch.zeros(span * size), torch.zeros(span * size)

    def op(i: int) -> None:
        at = (i % span) * size  # each operation on memory the last few did not touch, as gradients come
        if mine:
            dist.all_reduce(send[at:at + size], group=mine[0])
        else:
            r = dist.irecv(recv[at:at + size], (rank - 1) % world, group=ring_group)  # posted before the send
            s = dist.isend(send[at:at + size], (rank + 1) % world, group=ring_group)
            r.wait()
            s.wait()

    def ring(done: list[float]) -> None:
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
        start_t = torch.tensor([time.perf_counter() + 0.2], dtype=torch.float64)  # one host, one clock
        dist.all_reduce(start_t, op=dist.ReduceOp.MAX)
        start = float(start_t)
        while time.perf_counter() < start:  # every rank computing before the window opens
            step()
        done: list[float] = []
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
        with open(out, "w") as f:
            json.dump({"ranks": got, "op_bytes": op_bytes, "op_messages": op_messages}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
