"""One rank of the link probe (links.probe_pair): two processes, rank 0 and rank 1, on
one host's loopback or on two testbed nodes.

    python -m trirace.calibrate.link_pair RANK STORE OUT NODES TRANSFER_CPU

NODES: 1 (loopback) or 2 (across the testbed's link); TRANSFER_CPU: 1 to also measure the
CPU a transfer costs both ends. Rank 0 writes the figures to OUT as JSON."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from ..plan.topology import Topology, single_node
from ..runtime.gloo import backend
from ..runtime.link_probe import probe_links


def send_buffer(rank: int, bytes_per_s: float, nbytes: int = 8 << 20, reps: int = 3) -> float:
    """Bytes a blocking send of `nbytes` (more than the buffers hold) still had to move when
    it returned, from when it returned and when the receive completed: the kernel's socket
    buffer and the link's queue. Gloo's send returns as soon as they took the tail, long
    before the bytes arrive on a slow link. Median of `reps`; rank 0 sends to rank 1."""
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


def transfer_cpu(rank: int, bytes_per_s: float, seconds: float = 2.0) -> dict[str, float]:
    """CPU seconds (user + system, every thread, both processes together) one message and
    one byte cost, from a run of small messages and a run of large ones, rank 0 sending to
    rank 1 over the default group. Process CPU time leaves out the time spent blocked,
    so a slow link does not inflate it."""
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
    # a few seconds' worth of the link, at most 256 MiB: loopback's probed rate can be far
    # above what a loaded host then moves
    n_small, n_big = 300, min(64, max(2, int(seconds * bytes_per_s / big.nbytes)))

    def run(t: torch.Tensor, n: int):
        return lambda: [dist.send(t, 1) if rank == 0 else dist.recv(t, 0) for _ in range(n)]
    base = both(lambda: None)  # two barriers' worth
    per_message = max(both(run(small, n_small)) - base, 0.0) / n_small
    per_byte = max(both(run(big, n_big)) - base - n_big * per_message, 0.0) / (n_big * big.nbytes)
    return {"cpu_per_message_s": per_message, "cpu_per_byte_s": per_byte}


def main(argv: list[str]) -> None:
    rank, store, out, nodes, with_cpu = int(argv[0]), argv[1], argv[2], int(argv[3]), argv[4] == "1"
    dist.init_process_group(backend("gloo"), init_method=f"file://{store}", rank=rank, world_size=2)
    base = single_node(2)
    topo = probe_links(Topology(nodes, 2 // nodes, base.intra, base.inter), torch.device("cpu"), large_bytes=4 << 20)
    link = topo.inter if nodes == 2 else topo.intra
    got = {"bits_per_s": link.bits_per_s, "latency_s": link.latency_s}
    if with_cpu:
        got |= transfer_cpu(rank, link.bytes_per_s)
    if nodes == 2:  # across the emulated link: how much a blocking send leaves in flight
        got["send_buffer_bytes"] = send_buffer(rank, link.bytes_per_s)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(got, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
