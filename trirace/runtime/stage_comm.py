"""The communication runtime of one rank: it executes the stage driver's decisions
(policy/driver.py, shared with the simulator) on the communicators of groups.py.

Parts, each with one job, given what they use: `PipelineP2P` (p2p.py) moves activations
and gradients between stages; `Reduction` (reduction.py) averages gradients across
replicas; `GradNorms` (gradnorm.py) agrees on each step's gradient norm; `CommStats` and
`LinkEstimates` (stats.py) measure. This class builds and wires them.

Who launches what, and in which order. NCCL runs a device's kernels in launch order
across all its communicators, and an op completes only once its peers launched theirs,
so every launch is made by the engine thread at a point of its action list that the plan
fixes, the same on every rank that shares the communicator:

| thread            | launches                                   | at                                    |
|-------------------|--------------------------------------------|---------------------------------------|
| engine (main)     | a run's P2P batch (pipe); waits for a receive where its data is used | the run's place in the action list |
|                   | gradient chunks (dp, hierarchy)            | the units launch_plan.py gives them; AR |
|                   | norm contribution (norm, host)             | three quarters of the way to AR, after the step's last chunk, else AR; the last backward without replicas |
|                   | tie                                        | OPT                                    |
|                   | metrics, evaluation                        | after OPT                              |
| waiters           | nothing: they wait for sends and chunks and report (chunk_done under the reduction's lock) | |

Autograd hooks launch nothing. Host reads of device values happen once per step, in the
norm contribution, and once per step for the compute clock's events.
"""

from __future__ import annotations

import time

import torch

from ..obs.timeline import Recorder
from ..plan import Action, Op, Schedule
from ..plan.job import StagePlan
from ..policy.driver import StageDriver
from .gradnorm import GradNorms
from .groups import Groups, warm_up
from .p2p import PipelineP2P
from .reduction import Reduction
from .stage import StageModel
from .stats import CommStats, LinkEstimates


class StageComm:
    def __init__(self, stage: StagePlan, schedule: Schedule, groups: Groups, model: StageModel,
                 activation_shape: tuple[int, ...], device: torch.device, recorder: Recorder,
                 tuner=None, embedding_method: str = "dense", timeout_s: float = 60.0,
                 grad_dtype: torch.dtype = torch.float32):
        self.sched, self.g = schedule, groups
        self.topo = groups.plan.topology
        self.log = groups.control.log
        self.stats = CommStats()
        self.links = LinkEstimates(self.topo)
        p2p_links = {op: self.topo.link_between(groups.rank, peer) for op, (_, peer) in groups.p2p.items()}
        self.driver = StageDriver(stage.policy, list(stage.numels), stage.reduction_link,
                                  schedule.actions[groups.stage], reduces=stage.reduces,
                                  sparse_param=stage.sparse_param, tuner=tuner, p2p_links=p2p_links,
                                  link_bytes_per_s=self.topo.rates(),
                                  group_size=len(stage.ranks), elem_size=stage.grad_elem_size)
        self.norms = GradNorms(groups.norm, model, groups.stage, groups.layout.pp, groups.replica,
                               groups.layout.dp, schedule.version_of_step)
        self.reduction = Reduction(self.driver, model, groups, schedule, self.norms, self.stats, self.links,
                                   recorder, grad_dtype, embedding_method, timeout_s)
        self.p2p = PipelineP2P(schedule, groups.p2p, p2p_links, activation_shape, device, stage.policy.blocking,
                               self.stats, self.links, recorder)
        chunk = stage.policy.partition_bytes // stage.grad_elem_size if stage.policy.partition_bytes else 1
        warm_up(groups, device, activation_shape, min(chunk, sum(stage.numels)), grad_dtype)

    def policy_for(self, step: int):
        return self.driver.policy_for(step)

    @property
    def tuner(self):
        return self.driver.tuner

    def observe_compute(self, step: int, seconds: dict[Op, float]) -> None:
        self.driver.observe_compute(step, seconds)

    def exchange(self, group: list[Action], sends: dict[Action, torch.Tensor]) -> None:
        cpu0 = time.thread_time()
        try:
            self.p2p.exchange(group, sends)
        finally:
            self.stats.add(self.sched.step_of(group[0].index), cpu_s=time.thread_time() - cpu0)

    def take(self, a: Action) -> torch.Tensor:
        cpu0 = time.thread_time()
        try:
            return self.p2p.take(a)
        finally:
            self.stats.add(self.sched.step_of(a.index), cpu_s=time.thread_time() - cpu0)

    def backward_begins(self, step: int, last: bool, unit: int) -> None:
        self.reduction.backward_begins(step, last, unit)

    def backward_ends(self, step: int, last: bool) -> None:
        self.reduction.backward_ends(step, last)

    def after_unit(self, unit: int) -> None:
        self.reduction.after_unit(unit)

    def reduce(self, step: int) -> None:
        cpu0 = time.thread_time()
        try:
            self.reduction.reduce(step)
        finally:
            self.stats.add(step, cpu_s=time.thread_time() - cpu0)

    def before_update(self, step: int) -> None:
        self.reduction.before_update(step)

    def close(self, failed: bool = False) -> None:
        """Stop the waiters. On success every handle is waited on; after a failure nothing
        is waited on (a peer may be gone), the process is about to exit."""
        self.reduction.close(failed)
        self.p2p.close(failed)
        if not failed:
            self.norms.drain()
