"""The communicators of one job plan, created once, in the same order on every rank, and
warmed up in that order before training, so none is ever initialised lazily mid-run.

P2P uses one communicator per direction of each pipeline link: "fwd/a>b" carries
activations from a to b, "bwd/b>a" their gradients back. On each, one rank only sends and
the other only receives, in the schedule's order, so receives can be posted ahead without
ever queueing in front of a send on the same in-order NCCL stream (NVIDIA/nccl#479).
Small control traffic (metrics, agreed decisions, barriers) goes on a gloo communicator
over the whole world, which takes CPU tensors under any backend. The per-step gradient
norm (gradnorm.py) has a gloo world communicator of its own, "norm": it is issued from
another thread than the control traffic, and each communicator has one issuing thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ..plan import Op
from ..plan.job import JobPlan
from . import gloo
from .communicator import CommLog, Communicator


def control_communicator(log: CommLog, timeout: timedelta) -> Communicator:
    """The whole world on gloo: the first communicator every rank creates."""
    world = list(range(dist.get_world_size()))
    group = dist.new_group(world, backend=gloo.backend("gloo"))
    return Communicator("control", world, group, torch.device("cpu"), log, timeout, host=True)


@dataclass
class Hierarchy:
    """My stage group's sub-communicators for a hierarchical all-reduce: sum inside the
    node, all-reduce among one leader per node over the inter-node links, broadcast inside
    the node. Cross-node bytes drop from 2(n-1)/n to 2(k-1)/k of the tensor for k nodes."""

    local: Communicator | None  # my node's members of the group (None if alone)
    leaders: Communicator | None  # one member per node (None unless I lead)
    leader: int  # global rank of my node's leader

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """In-place sum over the whole group, in three phases, each to completion."""
        if self.local is not None:
            self.local.all_reduce(tensor).wait()
        if self.leaders is not None:
            self.leaders.all_reduce(tensor).wait()
        if self.local is not None:
            self.local.broadcast(tensor, src=self.leader).wait()

    def communicators(self) -> list[Communicator]:
        return [c for c in (self.local, self.leaders) if c is not None]


@dataclass
class Groups:
    plan: JobPlan
    rank: int
    stage: int
    replica: int
    control: Communicator
    dp: Communicator | None  # replicas of my stage (None when dp == 1)
    tie: Communicator | None  # the two ends of my pipeline, when their weights are tied
    hierarchy: Hierarchy | None  # where the plan reduces my stage hierarchically
    p2p: dict[Op, tuple[Communicator, int]] = field(default_factory=dict)  # my transfer ops -> (comm, peer)
    norm: Communicator | None = None  # the whole world, for the global gradient norm
    eval_p2p: dict[str, tuple[Communicator, int]] = field(default_factory=dict)  # "send"/"recv" -> (comm, peer)

    @property
    def layout(self):
        return self.plan.layout

    @property
    def is_reporter(self) -> bool:
        """The one rank that prints progress and writes metrics: last stage, replica 0."""
        return self.stage == self.layout.pp - 1 and self.replica == 0

    def communicators(self) -> list[Communicator]:
        """Every communicator this rank is a member of, in creation order."""
        every = [self.control, self.dp, self.tie, *(self.hierarchy.communicators() if self.hierarchy else []),
                 *(c for c, _ in self.p2p.values()), self.norm, *(c for c, _ in self.eval_p2p.values())]
        return list({id(c): c for c in every if c is not None}.values())

    def release(self) -> None:
        """Destroy every process group of this job, once all its ops are complete (after
        the last barrier). A worker that runs several jobs (run_local) would otherwise keep
        each job's groups, their threads and their buffers, for good."""
        for c in self.communicators():
            dist.destroy_process_group(c.group)

    def reduction_communicators(self) -> list[Communicator]:
        """What the gradient reduction issues on (owned by its launcher thread)."""
        return ([self.dp] if self.dp else []) + (self.hierarchy.communicators() if self.hierarchy else [])


def make_groups(plan: JobPlan, device: torch.device, control: Communicator, evaluate: bool = False) -> Groups:
    """Create every communicator of `plan` (collective: all ranks, same order); with
    `evaluate`, also one per pipeline link for the evaluation pass's activations."""
    log, timeout, rank, L = control.log, control.timeout, dist.get_rank(), plan.layout

    def comm(name: str, members: list[int]) -> Communicator | None:
        group = dist.new_group(members)
        return Communicator(name, sorted(members), group, device, log, timeout) if rank in members else None

    stage, replica = L.coords(rank)
    dps = [comm(f"dp/s{s}", L.dp_group(s)) for s in range(L.pp)] if L.dp > 1 else []  # (every rank agrees)
    p2p: dict[Op, tuple[Communicator, int]] = {}
    for a, b in L.p2p_pairs():  # a runs stage s, b stage s + 1
        fwd, bwd = comm(f"fwd/{a}>{b}", [a, b]), comm(f"bwd/{b}>{a}", [a, b])
        if rank == a:
            p2p[Op.SF], p2p[Op.RB] = (fwd, b), (bwd, b)
        elif rank == b:
            p2p[Op.RF], p2p[Op.SB] = (fwd, a), (bwd, a)
    ties = [comm(f"tie/{a}-{b}", [a, b]) for a, b in plan.tie_pairs()]
    hierarchy = None
    for s in plan.stages:  # every stage's sub-groups, by every rank, in stage order
        if s.hierarchical:
            h = _hierarchy(s.stage, list(s.ranks), plan, comm)
            hierarchy = h if s.stage == stage else hierarchy
    world = list(range(dist.get_world_size()))
    norm = Communicator("norm", world, dist.new_group(world, backend=gloo.backend("gloo")), torch.device("cpu"), log, timeout,
                        host=True)
    eval_p2p: dict[str, tuple[Communicator, int]] = {}
    for a, b in L.p2p_pairs() if evaluate else ():
        c = comm(f"eval/{a}>{b}", [a, b])
        if rank in (a, b):
            eval_p2p["send" if rank == a else "recv"] = (c, b if rank == a else a)
    return Groups(plan, rank, stage, replica, control, dps[stage] if L.dp > 1 else None,
                  next((t for t in ties if t is not None), None), hierarchy, p2p, norm, eval_p2p)


def _hierarchy(stage: int, ranks: list[int], plan: JobPlan, comm) -> Hierarchy | None:
    topo = plan.topology
    by_node: dict[int, list[int]] = {}
    for r in ranks:
        by_node.setdefault(topo.node_of(r), []).append(r)
    locals_ = {node: comm(f"hier-local/s{stage}/n{node}", members) if len(members) > 1 else None
               for node, members in by_node.items()}
    leaders = comm(f"hier-leaders/s{stage}", [m[0] for m in by_node.values()])
    me = dist.get_rank()
    if me not in ranks:
        return None
    node = topo.node_of(me)
    return Hierarchy(locals_[node], leaders, by_node[node][0])


def warm_up_reduction(g: Groups, device: torch.device) -> None:
    """First op on each reduction communicator (NCCL creates a communicator at its first
    op): called by the thread that will issue on them, before the pipeline's warm-up."""
    for c in g.reduction_communicators():
        c.all_reduce(torch.ones(1, device=device)).wait()


def warm_up_pipeline(g: Groups, device: torch.device) -> None:
    """Each P2P direction once, previous link before next: along a pipeline this is a
    chain, never a cycle. Then the tie, then a barrier on the control communicator."""
    for op in (Op.RF, Op.SB, Op.SF, Op.RB):
        if op in g.p2p:
            comm, peer = g.p2p[op]
            comm.p2p([("recv" if op in (Op.RF, Op.RB) else "send", torch.ones(1, device=device), peer)]).wait()
    for way in ("recv", "send"):  # the evaluation links: the same chain
        if way in g.eval_p2p:
            comm, peer = g.eval_p2p[way]
            comm.p2p([(way, torch.ones(1, device=device), peer)]).wait()
    if g.tie is not None:
        g.tie.all_reduce(torch.ones(1, device=device)).wait()
    g.control.barrier()
