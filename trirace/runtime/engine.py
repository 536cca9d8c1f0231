"""Runs one stage's action list on real processes.

The engine owns compute and the activations in flight; transfers go through `comm`, which
for now is the blocking executor (PipeDream-2BW's behaviour): a group of adjacent P2P
actions is posted together, receives first, and waited on; AR is one flattened blocking
all-reduce of the stage's gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..models import lm_loss
from ..plan import Action, Op, Schedule
from ..plan.schedule import p2p_groups
from .groups import Groups
from .stage import StageModel

# (step, index within the step's global batch) -> (inputs, targets)
BatchFn = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class StepRecord:
    step: int
    losses: list[float] = field(default_factory=list)  # this replica's micro-batch losses (last stage)
    end_time: float = 0.0


class Engine:
    def __init__(self, schedule: Schedule, model: StageModel, groups: Groups, batch: BatchFn,
                 activation_shape: tuple[int, ...], device: torch.device,
                 on_step: Callable[[StepRecord], None] | None = None):
        self.sched, self.model, self.g, self.batch = schedule, model, groups, batch
        self.shape, self.device, self.on_step = activation_shape, device, on_step
        self.m = schedule.micro_batches
        self.inputs: dict[int, torch.Tensor] = {}  # received activation (requires grad)
        self.outputs: dict[int, torch.Tensor] = {}  # stage output, or the scaled loss on the last stage
        self.out_grads: dict[int, torch.Tensor] = {}  # received gradient of the output
        self.records: dict[int, StepRecord] = {}

    # ------------------------------------------------------------ compute

    def _global_index(self, k: int) -> tuple[int, int]:
        """(step, position in the global batch): replica r owns positions r*m .. r*m+m-1."""
        step, i = divmod(k, self.m)
        return step, self.g.replica * self.m + i

    def forward(self, k: int) -> None:
        step = self.sched.step_of(k)
        module = self.model.module(self.sched.version_of_step(step))
        if self.model.is_first:
            x = self.batch(*self._global_index(k))[0].to(self.device)
        else:
            x = self.inputs[k]
        y = module(x)
        if self.model.is_last:
            loss = lm_loss(y, self.batch(*self._global_index(k))[1].to(self.device))
            self.records.setdefault(step, StepRecord(step)).losses.append(loss.item())
            y = loss / self.m  # gradients average over micro-batches
        self.outputs[k] = y

    def backward(self, k: int) -> None:
        y = self.outputs.pop(k)
        if self.model.is_last:
            y.backward()
        else:
            torch.autograd.backward(y, self.out_grads.pop(k))

    # ------------------------------------------------------------ communication (blocking)

    def exchange(self, group: list[Action]) -> None:
        works, sends = [], []
        for a in group:  # receives first: a pair's two directions then overlap on gloo
            if a.op is Op.RF:
                t = torch.empty(self.shape, device=self.device)
                works.append(dist.irecv(t, src=self.g.prev_rank, group=self.g.prev))
                self.inputs[a.index] = t
            elif a.op is Op.RB:
                t = torch.empty(self.shape, device=self.device)
                works.append(dist.irecv(t, src=self.g.next_rank, group=self.g.next))
                self.out_grads[a.index] = t
        for a in group:
            if a.op is Op.SF:
                t = self.outputs[a.index].detach().contiguous()
                works.append(dist.isend(t, dst=self.g.next_rank, group=self.g.next))
                sends.append(t)
            elif a.op is Op.SB:
                t = self.inputs.pop(a.index).grad.contiguous()
                works.append(dist.isend(t, dst=self.g.prev_rank, group=self.g.prev))
                sends.append(t)
        for w in works:
            w.wait()
        for a in group:
            if a.op is Op.RF:
                self.inputs[a.index].requires_grad_(True)

    def reduce(self, step: int) -> None:
        grads = self.model.grads(self.sched.version_of_step(step))
        if self.g.dp is not None:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.g.dp)
            flat /= self.g.layout.dp
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        self._reduced = grads

    def update(self, step: int) -> None:
        self.model.step(self._reduced, publish_version=step + 1)
        rec = self.records.setdefault(step, StepRecord(step))
        rec.end_time = time.perf_counter()
        if self.on_step:
            self.on_step(rec)
        self.records.pop(step)

    # ------------------------------------------------------------ driver

    def run(self, actions: tuple[Action, ...]) -> None:
        for group in p2p_groups(actions):
            a = group[0]
            if a.op.is_p2p:
                self.exchange(group)
            elif a.op is Op.F:
                self.forward(a.index)
            elif a.op is Op.B:
                self.backward(a.index)
            elif a.op is Op.AR:
                self.reduce(a.index)
            elif a.op is Op.OPT:
                self.update(a.index)
