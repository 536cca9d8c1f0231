"""The communicators of one job plan, created once, in the same order on every rank, and
warmed up in that order before training, so none is ever initialised lazily mid-run.

P2P uses one communicator per pipeline, "pipe/rR" (the ranks of replica R, one per
stage): a run of adjacent transfers, which may go to both neighbours, is then one batch,
which NCCL runs as one kernel, and the schedule validator proves those batches free of
deadlock. Training, evaluation and warm-up transfers all ride on it, from the engine
thread. Small control traffic (metrics, agreed decisions, barriers) goes on a gloo
communicator over the whole world, which takes CPU tensors under any backend; the
per-step gradient norm (gradnorm.py) has a gloo world communicator of its own, "norm", so
that its host-side order is the engine's alone.
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
    group = dist.new_group(world, backend=gloo.backend("gloo"), timeout=timeout)
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
    p2p: dict[Op, tuple[Communicator, int]] = field(default_factory=dict)  # my transfer ops -> (pipe, peer)
    norm: Communicator | None = None  # the whole world, for the global gradient norm
    # My stage's replicas again, for the token table's exchange by rows: its collectives are
    # small and dependent, and each is waited for one unit after the last; on the dense
    # chunks' communicator it would queue behind their bytes.
    rows: Communicator | None = None

    @property
    def layout(self):
        return self.plan.layout

    @property
    def is_reporter(self) -> bool:
        """The one rank that prints progress and writes metrics: last stage, replica 0."""
        return self.stage == self.layout.pp - 1 and self.replica == 0

    def communicators(self) -> list[Communicator]:
        """Every communicator this rank is a member of, in creation order."""
        every = [self.control, self.dp, self.rows, self.tie,
                 *(self.hierarchy.communicators() if self.hierarchy else []), *(c for c, _ in self.p2p.values()),
                 self.norm]
        return list({id(c): c for c in every if c is not None}.values())

    def release(self) -> None:
        """Destroy every process group of this job, once all its ops are complete (after
        the last barrier). A worker that runs several jobs (run_local) would otherwise keep
        each job's groups, their threads and their buffers, for good."""
        for c in self.communicators():
            dist.destroy_process_group(c.group)

    def reduction_communicators(self) -> list[Communicator]:
        """What the gradient reduction issues on."""
        return ([self.dp] if self.dp else []) + ([self.rows] if self.rows else []) + \
            (self.hierarchy.communicators() if self.hierarchy else [])


def make_groups(plan: JobPlan, device: torch.device, control: Communicator) -> Groups:
    """Create every communicator of `plan` (collective: all ranks, same order)."""
    log, timeout, rank, L = control.log, control.timeout, dist.get_rank(), plan.layout

    def comm(name: str, members: list[int]) -> Communicator | None:
        group = dist.new_group(members, timeout=timeout)  # the job's, not torch's 10-minute default
        return Communicator(name, sorted(members), group, device, log, timeout) if rank in members else None

    stage, replica = L.coords(rank)
    dps = [comm(f"dp/s{s}", L.dp_group(s)) for s in range(L.pp)] if L.dp > 1 else []  # (every rank agrees)
    rows = [comm(f"rows/s{s.stage}", L.dp_group(s.stage)) for s in plan.stages
            if L.dp > 1 and s.sparse_param is not None]
    pipes = [comm(f"pipe/r{r}", [L.rank(s, r) for s in range(L.pp)]) if L.pp > 1 else None for r in range(L.dp)]
    p2p: dict[Op, tuple[Communicator, int]] = {}
    if L.pp > 1:
        pipe = pipes[replica]
        if stage < L.pp - 1:
            p2p[Op.SF] = p2p[Op.RB] = (pipe, L.rank(stage + 1, replica))
        if stage > 0:
            p2p[Op.RF] = p2p[Op.SB] = (pipe, L.rank(stage - 1, replica))
    ties = [comm(f"tie/{a}-{b}", [a, b]) for a, b in plan.tie_pairs()]
    hierarchy = None
    for s in plan.stages:  # every stage's sub-groups, by every rank, in stage order
        if s.hierarchical:
            h = _hierarchy(s.stage, list(s.ranks), plan, comm)
            hierarchy = h if s.stage == stage else hierarchy
    world = list(range(dist.get_world_size()))
    norm = Communicator("norm", world, dist.new_group(world, backend=gloo.backend("gloo"), timeout=timeout),
                        torch.device("cpu"), log, timeout, host=True)
    return Groups(plan, rank, stage, replica, control, dps[stage] if L.dp > 1 else None,
                  next((t for t in ties if t is not None), None), hierarchy, p2p, norm,
                  next((c for c in rows if c is not None), None))


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


def warm_up(g: Groups, device: torch.device, activation_shape: tuple[int, ...], chunk_elems: int,
            grad_dtype: torch.dtype) -> None:
    """Every communicator's ops once, at the sizes training uses, so that NCCL sets up its
    connections before the first step rather than inside it: the reductions (one chunk),
    then each pipeline link forward and back as a chain from the first stage, never a
    cycle, then the tie, then a barrier on the control communicator. Run by the engine
    thread, in this order on every rank."""
    for c in g.reduction_communicators():
        c.all_reduce(torch.zeros(max(chunk_elems, 1), device=device, dtype=grad_dtype)).wait()
    act = lambda: torch.zeros(activation_shape, device=device)  # noqa: E731
    for recv, send in ((Op.RF, Op.SF), (Op.RB, Op.SB)):
        if recv in g.p2p:
            comm, peer = g.p2p[recv]
            comm.p2p([("recv", act(), peer)])[0].wait()
        if send in g.p2p:
            comm, peer = g.p2p[send]
            comm.p2p([("send", act(), peer)])[0].wait()
    if g.tie is not None:
        g.tie.all_reduce(torch.ones(1, device=device)).wait()
    g.control.barrier()
