"""Where ranks live and what connects them: nodes, ranks per node, and two link classes.

Ranks fill nodes in order (rank // ranks_per_node), as torchrun numbers them. A transfer
between ranks of one node uses the intra-node link; anything else uses each node's
inter-node uplink/downlink, which all of that node's cross-node traffic shares. That is
the contention the topology-aware policy avoids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..yamlfile import read_mapping

_BIT_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}  # tc's decimal units
_BYTE_UNITS = {"B/s": 8.0, "KB/s": 8e3, "MB/s": 8e6, "GB/s": 8e9, "TB/s": 8e12}
_RATE = re.compile(r"\s*((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z/]*)\s*")


def parse_rate(text: str | float | int) -> float:
    """'250mbit' / '1gbit' (bits, as tc writes them) / '25GB/s' (bytes) / 3.1e9 or '3.1e9'
    (YAML reads that as a string) -> bits per second. "mbps"-style units are refused: tc
    reads them as bytes, people mean bits."""
    if isinstance(text, (int, float)):
        return float(text)
    m = _RATE.fullmatch(str(text))
    unit = m.group(2) if m else ""
    if m and not unit:
        return float(m.group(1))
    if m and "e" in m.group(1).lower():
        m = None  # an exponent only on a bare number: "1e9bit" is no unit tc or a reader writes
    scale = _BIT_UNITS.get(unit.lower()) if unit.lower() in _BIT_UNITS else _BYTE_UNITS.get(unit)
    if not m or scale is None:
        raise UsageError(f"not a rate: {text!r} (e.g. 250mbit, 1gbit, 25GB/s)")
    return float(m.group(1)) * scale


def parse_time(text: str | float | int) -> float:
    """'5us' / '2ms' / 0.001 / '2e-06' (YAML reads that as a string) -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|ns)?\s*", str(text))
    if not m:
        raise UsageError(f"not a time: {text!r} (e.g. 5us, 2ms)")
    return float(m.group(1)) * {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2) or "s"]


@dataclass(frozen=True)
class Link:
    bits_per_s: float
    latency_s: float

    @property
    def bytes_per_s(self) -> float:
        return self.bits_per_s / 8

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    def __str__(self) -> str:
        return f"{self.bits_per_s / 1e9:.3g} Gbit/s, {self.latency_s * 1e6:.3g} us"


INTRA, INTER = "intra", "inter"


@dataclass(frozen=True)
class Topology:
    nodes: int
    ranks_per_node: int
    intra: Link
    inter: Link

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def link_between(self, a: int, b: int) -> str:
        return INTRA if self.node_of(a) == self.node_of(b) else INTER

    def group_link(self, ranks: list[int]) -> str:
        """The slowest link class a collective over `ranks` crosses."""
        return INTRA if len({self.node_of(r) for r in ranks}) <= 1 else INTER

    def link(self, cls: str) -> Link:
        return self.intra if cls == INTRA else self.inter

    def rates(self) -> dict[str, float]:
        """Bytes per second of each link class."""
        return {INTRA: self.intra.bytes_per_s, INTER: self.inter.bytes_per_s}

    def describe(self) -> str:
        return (f"topology: {self.nodes} node(s) x {self.ranks_per_node} rank(s); "
                f"intra-node {self.intra}; inter-node {self.inter}")

    def check(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise UsageError(f"topology has {self.nodes} x {self.ranks_per_node} = {self.world_size} ranks "
                             f"but the job has {world_size}")


# Defaults when nothing is measured or given: a shared-memory node and a 25 GbE fabric.
DEFAULT_INTRA = Link(parse_rate("100gbit"), 2e-6)
DEFAULT_INTER = Link(parse_rate("25gbit"), 10e-6)


def single_node(world_size: int) -> Topology:
    return Topology(1, world_size, DEFAULT_INTRA, DEFAULT_INTER)


def load_topology(path: str | Path) -> Topology:
    """YAML: nodes, ranks_per_node, and optional intra/inter {bandwidth, latency}."""
    p = Path(path)
    data = read_mapping(p, "topology file")
    try:
        return topology_from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"topology file {p}: {e}") from None


def link_from_dict(data: dict, key: str, default: Link) -> Link:
    """`data[key]` as {bandwidth, latency}, either omitted taking `default`'s."""
    spec = data.get(key) or {}
    if not isinstance(spec, dict) or set(spec) - {"bandwidth", "latency"}:
        raise ValueError(f"{key}: expected {{bandwidth, latency}}")
    bw = parse_rate(spec["bandwidth"]) if "bandwidth" in spec else default.bits_per_s
    lat = parse_time(spec["latency"]) if "latency" in spec else default.latency_s
    if bw <= 0 or lat < 0:
        raise ValueError(f"{key}: bandwidth must be positive and latency non-negative")
    return Link(bw, lat)


def topology_from_dict(data: dict) -> Topology:
    unknown = set(data) - {"nodes", "ranks_per_node", "intra", "inter"}
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
    nodes, rpn = int(data["nodes"]), int(data["ranks_per_node"])
    if nodes < 1 or rpn < 1:
        raise ValueError("nodes and ranks_per_node must be at least 1")

    return Topology(nodes, rpn, link_from_dict(data, "intra", DEFAULT_INTRA), link_from_dict(data, "inter", DEFAULT_INTER))


def hierarchical_pays(topo: Topology, ranks: list[int], nbytes: float) -> bool:
    """Does reduce-in-node, all-reduce across nodes, broadcast-in-node beat one flat ring
    for a collective over `ranks`? Only when the group spans nodes and shares some node;
    then compare the alpha-beta times of both (the inter-node uplink is the bottleneck)."""
    per_node: dict[int, int] = {}
    for r in ranks:
        per_node[topo.node_of(r)] = per_node.get(topo.node_of(r), 0) + 1
    n, k, local = len(ranks), len(per_node), max(per_node.values())
    if k < 2 or local < 2:
        return False
    flat = 2 * (n - 1) * topo.inter.latency_s + 2 * (n - 1) / n * nbytes / topo.inter.bytes_per_s
    inner = 2 * (local - 1) * topo.intra.latency_s + 2 * (local - 1) / local * nbytes / topo.intra.bytes_per_s
    across = 2 * (k - 1) * topo.inter.latency_s + 2 * (k - 1) / k * nbytes / topo.inter.bytes_per_s
    bcast = topo.intra.latency_s + nbytes / topo.intra.bytes_per_s
    return inner + across + bcast < flat
