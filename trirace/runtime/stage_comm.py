"""The communication runtime of one rank: it executes the stage driver's decisions
(policy/driver.py, shared with the simulator) on the communicators of groups.py.

Parts, each with one job: `PipelineP2P` (p2p.py) moves activations and gradients between
stages; `Reduction` (reduction.py) averages gradients across replicas; `CommStats` and
`LinkEstimates` (stats.py) measure. This class wires them together and owns the lock.

Who issues on which communicator, and who touches which state (NCCL needs one issuing
thread per communicator, or an order every member agrees on; we keep the former):

| thread            | issues on                          | state it changes (under `cond` unless noted) |
|-------------------|------------------------------------|-----------------------------------------------|
| engine (main)     | fwd/bwd P2P, tie, control; dp and norm when blocking or dp = 1 | driver (posting, P2P counts, enqueue, deadline, close_step), armed slots |
| autograd hooks    | nothing (run on the engine thread on CPU)   | driver (params_ready)                   |
| trirace-launcher  | dp, hierarchy, norm (asynchronous policies) | driver (launches), chunk seqs          |
| waiters (sends, chunks) | nothing: they wait and report        | driver (p2p_send_done, chunk_done); stats, link estimates (own locks) |
"""

from __future__ import annotations

import threading
import time

import torch

from ..policy.driver import StageDriver
from ..obs.timeline import Recorder
from ..plan import Action, Schedule
from ..plan.job import StagePlan
from .gradnorm import GradNorms
from .groups import Groups, warm_up_pipeline
from .p2p import PipelineP2P
from .reduction import Reduction
from .stage import StageModel
from .stats import CommStats, LinkEstimates


class StageComm:
    def __init__(self, stage: StagePlan, schedule: Schedule, groups: Groups, model: StageModel,
                 activation_shape: tuple[int, ...], device: torch.device, recorder: Recorder,
                 tuner=None, embedding_method: str = "dense", timeout_s: float = 60.0,
                 grad_dtype: torch.dtype = torch.float32):
        self.sched, self.g, self.model, self.device, self.rec = schedule, groups, model, device, recorder
        self.topo = groups.plan.topology
        self.log = groups.control.log
        # gloo applies its timeout to collectives but not to P2P waits: every wait here has one.
        self.timeout_s = timeout_s
        self.grad_dtype = grad_dtype  # what gradients cross the data-parallel links in
        self.cond = threading.Condition()
        self.stats = CommStats()
        self.links = LinkEstimates(self.topo)
        p2p_links = {op: self.topo.link_between(groups.rank, peer) for op, (_, peer) in groups.p2p.items()}
        self.driver = StageDriver(stage.policy, list(stage.numels), stage.reduction_link,
                                  schedule.actions[groups.stage], reduces=stage.reduces,
                                  sparse_param=stage.sparse_param, tuner=tuner,
                                  micro_batches=schedule.micro_batches, p2p_links=p2p_links,
                                  link_bytes_per_s=self.topo.rates(),
                                  group_size=len(stage.ranks), elem_size=stage.grad_elem_size)
        self.norms = GradNorms(groups.norm, model, groups.stage, groups.layout.pp, groups.replica,
                               groups.layout.dp, schedule.version_of_step)
        self.reduction = Reduction(self, embedding_method)  # warms up the reduction communicators first
        warm_up_pipeline(groups, device)
        self.p2p = PipelineP2P(self, activation_shape)
        if not self.driver.policy.blocking:
            self.p2p.post_ahead()

    def policy_for(self, step: int):
        return self.driver.policy_for(step)

    @property
    def tuner(self):
        return self.driver.tuner

    def exchange(self, group: list[Action], sends: list[tuple[Action, torch.Tensor]]) -> dict[Action, torch.Tensor]:
        cpu0 = time.thread_time()
        try:
            return self.p2p.exchange(group, sends)
        finally:
            self.stats.add(self.sched.step_of(group[0].index), cpu_s=time.thread_time() - cpu0)

    def backward_begins(self, step: int, last: bool) -> None:
        self.reduction.backward_begins(step, last)

    def backward_ends(self, step: int, last: bool) -> None:
        self.reduction.backward_ends(step, last)

    def reduce(self, step: int) -> None:
        cpu0 = time.thread_time()
        try:
            self.reduction.reduce(step)
        finally:
            self.stats.add(step, cpu_s=time.thread_time() - cpu0)

    def before_update(self, step: int) -> None:
        self.reduction.before_update(step)

    def close(self, failed: bool = False) -> None:
        """Stop the threads. On success every handle is waited on; after a failure nothing
        is waited on (a peer may be gone), the process is about to exit."""
        self.reduction.close(failed)
        self.p2p.close(failed)
        if not failed:
            self.norms.drain()
