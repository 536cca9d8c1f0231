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


def detect_topology(topology_file: str | None, world_size: int) -> Topology:
    if topology_file:
        topo = load_topology(topology_file)
        topo.check(world_size)
        return topo
    hosts: list[str] = [""] * world_size
    dist.all_gather_object(hosts, socket.gethostname())
    nodes = list(dict.fromkeys(hosts))
    per_node = [hosts.count(h) for h in nodes]
    contiguous = all(hosts[r] == nodes[r // per_node[0]] for r in range(world_size)) if len(set(per_node)) == 1 else False
    if len(nodes) == 1 or not contiguous:
        if len(nodes) > 1:
            raise UsageError("ranks are spread over hosts unevenly or out of order; give --topology FILE")
        return single_node(world_size)
    base = single_node(world_size)
    return Topology(len(nodes), per_node[0], base.intra, base.inter)


def _pingpong(a: int, b: int, group, device, nbytes: int, reps: int) -> float:
    """Best one-way time for nbytes from a to b (b answers with 4 bytes)."""
    me = dist.get_rank()
    big = torch.zeros(max(1, nbytes // 4), device=device)
    ack = torch.zeros(1, device=device)
    best = float("inf")
    for _ in range(reps):
        if me == a:
            t0 = time.perf_counter()
            dist.send(big, dst=b, group=group)
            dist.recv(ack, src=b, group=group)
            best = min(best, time.perf_counter() - t0)
        elif me == b:
            dist.recv(big, src=a, group=group)
            dist.send(ack, dst=a, group=group)
    return best


def probe_links(topo: Topology, device: torch.device, large_bytes: int = 2 << 20) -> Topology:
    pairs = {}
    if topo.ranks_per_node > 1:
        pairs[INTRA] = (0, 1)
    if topo.nodes > 1:
        pairs[INTER] = (0, topo.ranks_per_node)
    groups = {cls: dist.new_group(list(pair)) for cls, pair in pairs.items()}  # all ranks, same order
    measured: dict[str, Link] = {}
    for cls, (a, b) in pairs.items():
        if dist.get_rank() in (a, b):
            _pingpong(a, b, groups[cls], device, 4, 3)  # connect and warm up
            small = _pingpong(a, b, groups[cls], device, 4, 10)
            large = _pingpong(a, b, groups[cls], device, large_bytes, 3)
            lat = small / 2  # the 4-byte answer rides back on the same latency
            measured[cls] = Link(8 * large_bytes / max(large - small, 1e-9), lat)
        dist.barrier()
    box = [measured]
    dist.broadcast_object_list(box, src=0)
    got = box[0]
    return replace(topo, intra=got.get(INTRA, topo.intra), inter=got.get(INTER, topo.inter))
