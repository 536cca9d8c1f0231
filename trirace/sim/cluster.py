"""Clusters to simulate: nodes of identical devices, an intra-node and an inter-node link,
and what NCCL's collectives achieve on each.

A preset names a node type; the node count comes from the job (pp x dp / devices per
node) unless given. The presets and the public figures behind them, with their sources,
are in clusters.yaml; a user's cluster file has the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import UsageError
from ..models.devices import DEVICES, Device, device_from_dict
from ..plan.topology import Link, Topology, link_from_dict, parse_rate
from ..yamlfile import read_mapping


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
    # What a ring all-reduce achieves per link class ("intra", "inter"), bytes/s: nccl-tests'
    # bus bandwidth. Missing: the nominal link rate.
    collective: dict[str, float] = field(default_factory=dict)

    def collective_factor(self, cls: str) -> float:
        """Bytes a collective moves per byte of payload on a `cls` link, relative to the
        nominal rate (>= 1: a collective never beats the link)."""
        link = self.intra if cls == "intra" else self.inter
        got = self.collective.get(cls)
        return max(link.bytes_per_s / got, 1.0) if got else 1.0

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


PRESET_FILE = Path(__file__).with_name("clusters.yaml")  # the presets, with their sources


def _presets() -> dict[str, Cluster]:
    data = read_mapping(PRESET_FILE, "cluster presets")
    out: dict[str, Cluster] = {}
    for name, entry in data["clusters"].items():
        entry = dict(entry)
        if isinstance(entry.get("device"), str):
            entry["device"] = DEVICES[entry["device"]]
        out[name] = _from_dict(entry, name, out)
    return out


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
    if link is not None:  # another inter-node link: the preset's collective figure was not measured on it
        c = replace(c, inter=Link(parse_rate(link), c.inter.latency_s),
                    collective={k: v for k, v in c.collective.items() if k != "inter"})
    return c


def cluster_from_file(path: str | Path) -> Cluster:
    """YAML: ranks_per_node, nodes (optional), intra/inter {bandwidth, latency},
    collective {intra, inter} (all-reduce bus bandwidth), device {name, peak_flops,
    efficiency, memory, memory_bandwidth}, shared_cores, collective_streams, and `base: NAME`,
    the preset whatever is left out comes from (a100-ib unless given)."""
    data = read_mapping(Path(path), "cluster file")
    try:
        return _from_dict(data, str(Path(path).stem), PRESETS, default_base="a100-ib")
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"cluster file {path}: {e}") from None


def _from_dict(data: dict, name: str, presets: dict[str, Cluster], default_base: str | None = None) -> Cluster:
    keys = {"base", "name", "nodes", "ranks_per_node", "intra", "inter", "collective", "device", "shared_cores",
            "collective_streams", "description"}
    if unknown := set(data) - keys:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
    base_name = data.get("base", default_base)
    if base_name is not None and base_name not in presets:
        raise ValueError(f"base: unknown preset {base_name!r}")
    base = presets[base_name] if base_name is not None else None
    if base is None and not {"device", "ranks_per_node", "intra", "inter"} <= set(data):
        raise ValueError("a cluster without a base needs device, ranks_per_node, intra and inter")
    device = device_from_dict(data.get("device") or {}, base.device if base else None)
    rpn = int(data.get("ranks_per_node", base.ranks_per_node if base else 0))
    nodes = data.get("nodes")
    if rpn < 1 or (nodes is not None and int(nodes) < 1):
        raise ValueError("nodes and ranks_per_node must be at least 1")
    cores = data.get("shared_cores", base.shared_cores if base else None)
    links = {cls: link_from_dict(data, cls, getattr(base, cls) if base else Link(1.0, 0.0)) for cls in ("intra", "inter")}
    # A base's collective figure holds only for the bandwidth it was measured at.
    collective = {cls: bw for cls, bw in (base.collective if base else {}).items()
                  if "bandwidth" not in (data.get(cls) or {})}
    given = data.get("collective") or {}
    if not isinstance(given, dict) or set(given) - {"intra", "inter"}:
        raise ValueError("collective: expected {intra, inter} (all-reduce bus bandwidth)")
    if any(not isinstance(v, str) or v.strip()[-1:].isdigit() for v in given.values()):  # no unit
        raise ValueError("collective: give a unit, as nccl-tests prints bus bandwidth (e.g. 230GB/s)")
    collective.update({cls: parse_rate(rate) / 8 for cls, rate in given.items()})
    if any(bw <= 0 for bw in collective.values()):
        raise ValueError("collective: bus bandwidth must be positive")
    return Cluster(str(data.get("name", name)), rpn, links["intra"], links["inter"], device,
                   int(nodes) if nodes is not None else None, int(cores) if cores else None,
                   int(data.get("collective_streams", base.collective_streams if base else 1)),
                   str(data.get("description", "")), collective)


PRESETS: dict[str, Cluster] = _presets()
