"""Clusters to simulate: nodes of identical devices, an intra-node and an inter-node link.

A preset names a node type; the node count comes from the job (pp x dp / devices per
node) unless given. Link figures are per direction; the inter-node figure is a node's
aggregate (all its NICs), which all of the node's cross-node traffic shares, as in
plan/topology.py. Figures from design.md 5: NVLink3 300 GB/s, NVLink4 450 GB/s, IB HDR
25 GB/s and NDR 50 GB/s per NIC, one NIC per GPU.

Compute runs in fp32 as trirace trains, so GPU peaks are the TF32 tensor-core figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UsageError
from ..plan.topology import Link, Topology, link_from_dict, parse_rate
from ..yamlfile import read_mapping


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # per second, at the precision trirace computes in
    efficiency: float  # achieved fraction of peak for transformer layers
    memory_bytes: float
    memory_bytes_per_s: float  # what the optimizer step streams through

    @property
    def flops(self) -> float:
        return self.peak_flops * self.efficiency


@dataclass(frozen=True)
class Cluster:
    name: str
    ranks_per_node: int
    intra: Link
    inter: Link
    device: Device
    nodes: int | None = None  # None: as many as the job needs
    shared_cores: int | None = None  # every rank shares this many cores (one host emulating nodes)
    collective_streams: int = 1  # collectives of one group that run at once (NCCL 1, gloo 2)
    description: str = ""

    def topology(self, world_size: int) -> Topology:
        rpn = self.ranks_per_node
        if self.nodes is None and world_size < rpn:
            rpn = world_size  # a job smaller than a node runs on part of one
        nodes = self.nodes if self.nodes is not None else -(-world_size // rpn)
        topo = Topology(nodes, rpn, self.intra, self.inter)
        if topo.world_size != world_size:
            raise UsageError(f"cluster {self.name} has {nodes} x {self.ranks_per_node} = {topo.world_size} devices "
                             f"but pp x dp = {world_size}")
        return topo


A100 = Device("A100-80GB", 156e12, 0.45, 80 * 2**30, 2.0e12)
H100 = Device("H100-SXM-80GB", 495e12, 0.45, 80 * 2**30, 3.35e12)
# One core of this kind of machine running fp32 PyTorch; a calibration replaces it.
CPU = Device("cpu-core", 60e9, 1.0, 24 * 2**30, 10e9)

PRESETS: dict[str, Cluster] = {c.name: c for c in [
    Cluster("a100-ib", 8, Link(parse_rate("300GB/s"), 3e-6), Link(8 * parse_rate("25GB/s"), 5e-6), A100,
            description="DGX A100: 8 GPUs, NVLink3 300 GB/s, 8x HDR InfiniBand 25 GB/s per node"),
    Cluster("h100-ib", 8, Link(parse_rate("450GB/s"), 2e-6), Link(8 * parse_rate("50GB/s"), 4e-6), H100,
            description="DGX H100: 8 GPUs, NVLink4 450 GB/s, 8x NDR InfiniBand 50 GB/s per node"),
    Cluster("a100-roce", 8, Link(parse_rate("300GB/s"), 3e-6), Link(parse_rate("100gbit"), 10e-6), A100,
            description="8 A100 per node, NVLink3, one 100 GbE NIC per node"),
    Cluster("testbed", 1, Link(parse_rate("20gbit"), 20e-6), Link(parse_rate("250mbit"), 1e-4), CPU,
            shared_cores=2, collective_streams=2,
            description="this machine's emulated cluster (trirace testbed up): one rank per namespace, "
                        "250 Mbit tbf links, all ranks sharing 2 cores, gloo"),
]}


def load_cluster(name_or_file: str, nodes: int | None = None, ranks_per_node: int | None = None,
                 link: str | None = None) -> Cluster:
    """A preset by name or a YAML file; `nodes`, `ranks_per_node` and `link` (the inter-node
    rate) override it."""
    if name_or_file in PRESETS:
        c = PRESETS[name_or_file]
    elif Path(name_or_file).suffix in (".yaml", ".yml") or Path(name_or_file).exists():
        c = cluster_from_file(name_or_file)
    else:
        raise UsageError(f"unknown cluster {name_or_file!r}; choose from {', '.join(PRESETS)} or give a YAML file")
    if nodes is not None:
        if nodes < 1:
            raise UsageError("--nodes must be at least 1")
        c = replace(c, nodes=nodes)
    if ranks_per_node is not None:
        if ranks_per_node < 1:
            raise UsageError("--ranks-per-node must be at least 1")
        c = replace(c, ranks_per_node=ranks_per_node)
    if link is not None:
        c = replace(c, inter=Link(parse_rate(link), c.inter.latency_s))
    return c


def cluster_from_file(path: str | Path) -> Cluster:
    """YAML: ranks_per_node, nodes (optional), intra/inter {bandwidth, latency},
    device {name, peak_flops, efficiency, memory, memory_bandwidth} or a preset's name
    (`base: a100-ib`) to start from, shared_cores, collective_streams."""
    data = read_mapping(Path(path), "cluster file")
    try:
        return _from_dict(data, str(Path(path).stem))
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"cluster file {path}: {e}") from None


def _from_dict(data: dict, name: str) -> Cluster:
    keys = {"base", "name", "nodes", "ranks_per_node", "intra", "inter", "device", "shared_cores",
            "collective_streams", "description"}
    if unknown := set(data) - keys:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
    base_name = data.get("base", "a100-ib")
    if base_name not in PRESETS:
        raise ValueError(f"base: unknown preset {base_name!r}")
    base = PRESETS[base_name]

    dev = data.get("device") or {}
    if not isinstance(dev, dict) or set(dev) - {"name", "peak_flops", "efficiency", "memory", "memory_bandwidth"}:
        raise ValueError("device: expected {name, peak_flops, efficiency, memory, memory_bandwidth}")
    d = base.device
    device = Device(str(dev.get("name", d.name)), float(dev.get("peak_flops", d.peak_flops)),
                    float(dev.get("efficiency", d.efficiency)), float(dev.get("memory", d.memory_bytes)),
                    float(dev.get("memory_bandwidth", d.memory_bytes_per_s)))
    if device.peak_flops <= 0 or not 0 < device.efficiency <= 1:
        raise ValueError("device: peak_flops must be positive and efficiency in (0, 1]")
    rpn = int(data.get("ranks_per_node", base.ranks_per_node))
    nodes = data.get("nodes")
    if rpn < 1 or (nodes is not None and int(nodes) < 1):
        raise ValueError("nodes and ranks_per_node must be at least 1")
    cores = data.get("shared_cores", base.shared_cores)
    return Cluster(str(data.get("name", name)), rpn, link_from_dict(data, "intra", base.intra), link_from_dict(data, "inter", base.inter), device,
                   int(nodes) if nodes is not None else None, int(cores) if cores else None,
                   int(data.get("collective_streams", base.collective_streams)), str(data.get("description", "")))
