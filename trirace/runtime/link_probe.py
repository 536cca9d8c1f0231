"""Which ranks share a node, and what the links between them measure, at start-up.

Structure comes from a topology file or from the host names ranks report; link figures
come from a short probe: a ping-pong of small messages (latency) and a few large ones
(bandwidth) on one pair of ranks per link class, one class at a time so probes do not
share a link. Rank 0's figures are broadcast, so every rank plans with the same numbers.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from ..errors import UsageError
from ..plan.topology import INTER, INTRA, Link, Topology, load_topology, single_node
from .communicator import Communicator


def detect_topology(topology_file: str | None, world_size: int, control: Communicator | None = None) -> Topology:
    if topology_file:
        topo = load_topology(topology_file)
        topo.check(world_size)
        return topo
    hosts: list[str] = [""] * world_size
    (control or Communicator.plain(None)).all_gather_object(hosts, socket.gethostname())
    nodes = list(dict.fromkeys(hosts))
    per_node = [hosts.count(h) for h in nodes]
    contiguous = all(hosts[r] == nodes[r // per_node[0]] for r in range(world_size)) if len(set(per_node)) == 1 else False
    if len(nodes) == 1 or not contiguous:
        if len(nodes) > 1:
            raise UsageError("ranks are spread over hosts unevenly or out of order; give --topology FILE")
        return single_node(world_size)
    base = single_node(world_size)
    return Topology(len(nodes), per_node[0], base.intra, base.inter)


def _pingpong(a: int, b: int, comm: Communicator, device, nbytes: int, reps: int) -> float:
    """Best one-way time for nbytes from a to b (b answers with 4 bytes). Each leg is
    waited on to completion (a CUDA event under NCCL), so the host clock times the wire.
    Both ends issue the legs in the same order, so the pair's stream never crosses."""
    me = dist.get_rank()
    big = torch.zeros(max(1, nbytes // 4), device=device)
    ack = torch.zeros(1, device=device)
    best = float("inf")
    for _ in range(reps):
        if me == a:
            t0 = time.perf_counter()
            comm.p2p([("send", big, b)])[0].wait()
            comm.p2p([("recv", ack, b)])[0].wait()
            best = min(best, time.perf_counter() - t0)
        elif me == b:
            comm.p2p([("recv", big, a)])[0].wait()
            comm.p2p([("send", ack, a)])[0].wait()
    return best


def probe_links(topo: Topology, device: torch.device, large_bytes: int = 2 << 20,
                control: Communicator | None = None) -> Topology:
    control = control or Communicator.plain(None)
    pairs = {}
    if topo.ranks_per_node > 1:
        pairs[INTRA] = (0, 1)
    if topo.nodes > 1:
        pairs[INTER] = (0, topo.ranks_per_node)
    comms = {cls: Communicator(f"probe/{cls}", pair, dist.new_group(list(pair), timeout=control.timeout), device,
                               control.log, control.timeout)
             for cls, pair in pairs.items()}  # new_group: all ranks, same order
    measured: dict[str, Link] = {}
    for cls, (a, b) in pairs.items():
        if dist.get_rank() in (a, b):
            _pingpong(a, b, comms[cls], device, 4, 3)  # connect and warm up
            small = _pingpong(a, b, comms[cls], device, 4, 10)
            large = _pingpong(a, b, comms[cls], device, large_bytes, 3)
            lat = small / 2  # the 4-byte answer rides back on the same latency
            measured[cls] = Link(8 * large_bytes / max(large - small, 1e-9), lat)
        control.barrier()
    box = [measured]
    control.broadcast_object(box, src=0)
    for c in comms.values():  # done with: a worker running many jobs would keep them all
        dist.destroy_process_group(c.group)
    got = box[0]
    return replace(topo, intra=got.get(INTRA, topo.intra), inter=got.get(INTER, topo.inter))
