"""The cluster's resources as the simulated network sees them, folded by symmetry.

The replicas of a stage run the same actions on the same kind of device, and collectives
keep them in lockstep, so the simulator runs one representative rank per stage and lets
each of its flows stand for every copy (design choice: a 1024-GPU job becomes 8 simulated
ranks). To keep contention exact, every physical link is still accounted for:

1. A *flow class* is a set of physical transfers that happen together: the activations
   of stage s to s+1 for all replicas, one ring step of stage s's all-reduce, ...
2. Each physical resource (a rank's intra-node port up/down, a node's inter-node uplink
   and downlink, a device, a shared CPU pool) gets a usage vector: how many copies of each
   class cross it. Resources with equal vectors are interchangeable and become one
   *resource class*; a class's flow uses it with weight = that count.

Where ranks share a host's cores (sim/host.py), compute flows use the CPU pool with one
unit of weight per copy, and so does a transfer's CPU work (its messages' fixed cost and
its bytes' cost at both ends, and a sparse exchange's passes over its table): a flow of
class ("cpu", cls) that runs beside the bytes,
in seconds like computation, since max-min sharing needs one unit per resource.

Max-min sharing on the folded problem gives every copy of a class the rate of the
slowest copy, which is what lockstep replicas see. The assumption: replicas are
symmetric and in lockstep. On cores that ranks share they are not: the OS hands the cores
out unevenly, and under 2bw's asynchronous all-reduce a replica may run up to a step
ahead, and on the testbed it does. Two replicas on one node then mostly take turns on the
uplink where the fold has them collide, and share the cores at other moments. So the
fabric can also be *unfolded*: a class per replica for computation, P2P and the tied
reduction (a collective stays one class, all its members' copies), and the executor runs
every rank. Unfolded without noise, the result equals the fold's exactly (a test holds it
to that).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..plan.layout import Layout
from ..plan.topology import INTER, Topology
from .host import HostCpu
from .network import Network, Uses

# Flow classes: ("p2p", s, "fwd"|"bwd"), ("ring", s), ("local", s), ("leaders", s),
# ("bcast", s), ("tie",), ("compute", s), and ("cpu", cls) for a transfer's CPU work;
# unfolded, compute, P2P and tie classes end with the replica's index.
FlowClass = tuple
SHAPED = ("node-up", "node-down")  # a node's inter-node links: shaped, one FIFO queue each (the testbed's tbf)


@dataclass
class Fabric:
    layout: Layout
    topo: Topology
    host: HostCpu | None = None  # all ranks share this host's cores (the testbed)
    tied: bool = False  # first and last stage all-reduce the tied table/head gradient (class ("tie",))
    unfold: bool = False  # simulate every replica (see the module's docstring), not one per stage
    # What the first of two activations leaving a node together gets of its inter-node link
    # (measured by trirace profile; 0.5: fair). P2P flows on those links favour the oldest.
    link_share: float = 0.5
    # Bytes another transfer keeps queued ahead on a shaped inter-node link (measured by trirace
    # profile; 0: none). A collective's message that joins a busy link waits for them first:
    # the shaper is one FIFO queue, where the fluid model would share the link at once.
    link_queue: float = 0.0
    net: Network = field(default_factory=Network)
    uses: dict[FlowClass, Uses] = field(default_factory=dict)
    latency: dict[FlowClass, float] = field(default_factory=dict)
    transfer_cpu: dict[FlowClass, tuple[float, float]] = field(default_factory=dict)  # per copy: (s/message, s/byte)

    def __post_init__(self):
        self._pairs_of: dict[FlowClass, list[tuple[int, int]]] = {}
        classes = self._physical()
        per_resource: dict[tuple, Counter] = {}
        for cls, (resources, _lat) in classes.items():
            for res, n in Counter(resources).items():
                per_resource.setdefault(res, Counter())[cls] = n
        ids: dict[tuple, int] = {}  # (capacity kind, usage vector) -> folded resource id
        folded: dict[FlowClass, dict[int, float]] = {cls: {} for cls in classes}
        for res, usage in per_resource.items():
            sig = (res[0], frozenset(usage.items()))
            if sig not in ids:
                curve = self.host.capacity if res[0] == "cpu" else None
                ids[sig] = self.net.resource(f"{res[0]}x{len(ids)}", self._capacity(res[0]), curve,
                                             self._seniority(res[0]))
            for cls, n in usage.items():
                folded[cls][ids[sig]] = max(folded[cls].get(ids[sig], 0.0), float(n))
        self.latency = {cls: lat for cls, (_res, lat) in classes.items()}
        self._queued = {i: self._capacity(kind) for (kind, _), i in ids.items() if kind in SHAPED}
        cpu = next((i for (kind, _), i in ids.items() if kind == "cpu"), None)
        if cpu is not None:  # what transfers cost the shared cores (sim/host.py)
            for cls, pairs in self._pairs_of.items():
                kinds = [self.topo.link_between(a, b) for a, b in pairs]
                cost = (max(self.host.per_message_s.get(k, 0.0) for k in kinds),
                        max(self.host.byte_cost(k, collective=cls[0] != "p2p") for k in kinds))
                folded[("cpu", cls)] = {cpu: float(len(pairs))}  # every copy's CPU work at once
                if any(cost):
                    self.transfer_cpu[cls] = cost
        self.uses = {cls: tuple(sorted(u.items())) for cls, u in folded.items()}

    @property
    def replicas(self) -> int:
        """Simulated ranks per stage."""
        return len(self._replicas())

    # A class names one replica's flows when unfolded, every replica's when folded.
    def compute_cls(self, stage: int, replica: int) -> FlowClass:
        return ("compute", stage, replica) if self.unfold else ("compute", stage)

    def p2p_cls(self, lo: int, direction: str, replica: int) -> FlowClass:
        return ("p2p", lo, direction, replica) if self.unfold else ("p2p", lo, direction)

    def tie_cls(self, replica: int) -> FlowClass:
        return ("tie", replica) if self.unfold else ("tie",)

    def _replicas(self) -> list[list[int]]:
        """The replica indices each class stands for: one class each, or one for all."""
        every = list(range(self.layout.dp))
        return [[r] for r in every] if self.unfold else [every]

    def cpu_seconds(self, cls: FlowClass, nbytes: float, messages: int, local_s: float = 0.0) -> float:
        """CPU seconds one copy of a `cls` transfer costs the shared cores, `local_s` of its
        own work included (0 where no cores are shared: a device's passes over a table, at
        its memory bandwidth, are left out: under a millisecond for gpt2-xl's 322 MB table)."""
        if ("cpu", cls) not in self.uses:
            return 0.0
        per_message, per_byte = self.transfer_cpu.get(cls, (0.0, 0.0))
        return messages * per_message + nbytes * per_byte + local_s

    def queue_wait(self, cls: FlowClass) -> float:
        """Seconds one message of a `cls` transfer starting now waits behind the bytes other
        transfers keep queued on the inter-node links it crosses: at most `link_queue` bytes,
        no more than they have left, drained at the link's rate (the longest wait of its links)."""
        if self.link_queue <= 0:
            return 0.0
        wait = 0.0
        for r, _ in self.uses[cls]:
            if r in self._queued:
                ahead = sum(f.remaining * w for f in self.net.flows.values() for rr, w in f.uses if rr == r)
                wait = max(wait, min(ahead, self.link_queue) / self._queued[r])
        return wait

    def _seniority(self, kind: str) -> float:
        """How much the oldest P2P flow on a resource counts against another (sim/network.py):
        a share s of the link for the first of two is a weight of s / (1 - s)."""
        if kind not in SHAPED:
            return 1.0
        share = min(max(self.link_share, 0.5), 0.95)  # past 0.95 one flow would all but stop the other
        return share / (1 - share)

    def _capacity(self, kind: str) -> float:
        if kind in ("port-up", "port-down"):
            return self.topo.intra.bytes_per_s
        if kind in SHAPED:
            return self.topo.inter.bytes_per_s
        if kind == "cpu":
            return float(self.host.cores)
        return 1.0  # a device does one second of work per second

    def _pair(self, a: int, b: int) -> tuple[list[tuple], float]:
        t = self.topo
        if t.link_between(a, b) == INTER:
            return [("node-up", t.node_of(a)), ("node-down", t.node_of(b))], t.inter.latency_s
        return [("port-up", a), ("port-down", b)], t.intra.latency_s

    def _pairs(self, cls: FlowClass, pairs: list[tuple[int, int]]) -> tuple[list[tuple], float]:
        self._pairs_of[cls] = pairs
        res: list[tuple] = []
        lat = 0.0
        for a, b in pairs:
            r, latency = self._pair(a, b)
            res += r
            lat = max(lat, latency)
        return res, lat

    def _physical(self) -> dict[FlowClass, tuple[list[tuple], float]]:
        """Every flow class with the physical resources its copies cross (with repeats)."""
        L, t = self.layout, self.topo
        out: dict[FlowClass, tuple[list[tuple], float]] = {}
        for s in range(L.pp):
            ranks = L.dp_group(s)
            for reps in self._replicas():
                cls = self.compute_cls(s, reps[0])
                out[cls] = ([("device", L.rank(s, r)) for r in reps] + ([("cpu",)] * len(reps) if self.host else []),
                            0.0)
                if s < L.pp - 1:
                    fwd = [(L.rank(s, r), L.rank(s + 1, r)) for r in reps]
                    for direction, pairs in (("fwd", fwd), ("bwd", [(b, a) for a, b in fwd])):
                        p2p = self.p2p_cls(s, direction, reps[0])
                        out[p2p] = self._pairs(p2p, pairs)
            if L.dp > 1:
                out[("ring", s)] = self._pairs(("ring", s), [(ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks))])
                by_node: dict[int, list[int]] = {}
                for r in ranks:
                    by_node.setdefault(t.node_of(r), []).append(r)
                local = [(m[i], m[(i + 1) % len(m)]) for m in by_node.values() if len(m) > 1 for i in range(len(m))]
                leaders = [m[0] for m in by_node.values()]
                if local:
                    out[("local", s)] = self._pairs(("local", s), local)
                    out[("bcast", s)] = self._pairs(("bcast", s), [(m[0], x) for m in by_node.values() for x in m[1:]])
                if len(leaders) > 1:
                    out[("leaders", s)] = self._pairs(("leaders", s), [(leaders[i], leaders[(i + 1) % len(leaders)])
                                                       for i in range(len(leaders))])
        if self.tied and L.pp > 1:  # a two-member ring per replica: each end sends the other half
            for reps in self._replicas():
                pairs = [(L.rank(0, r), L.rank(L.pp - 1, r)) for r in reps]
                cls = self.tie_cls(reps[0])
                out[cls] = self._pairs(cls, pairs + [(b, a) for a, b in pairs])
        return out

    def local_sizes(self, stage: int) -> tuple[int, int]:
        """(largest number of a stage's replicas on one node, nodes the stage spans)."""
        per_node = Counter(self.topo.node_of(r) for r in self.layout.dp_group(stage))
        return max(per_node.values()), len(per_node)
