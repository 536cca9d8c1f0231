"""Runs one stage's action list on real processes.

The engine owns compute and the activations in flight; every transfer goes through `comm`
(runtime/stage_comm.py), which executes the communication policy. What the engine records per
step (losses, when its OPT ran) feeds the metrics.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..errors import Diverged
from ..data.batches import BatchFn
from ..models import lm_loss
from ..models.emulated import compute_for, input_grad_only
from ..optim import UpdateRule
from ..obs.timeline import Recorder
from ..plan import Action, Op, Schedule
from ..plan.schedule import p2p_groups
from . import split_backward
from .stage_comm import StageComm
from .groups import Groups
from .stage import StageModel


@dataclass
class Timed:
    label: str  # the action
    step: int
    t0: float  # perf_counter seconds
    t1: float
    cpu_s: float  # the engine thread's CPU in it
    update: bool  # OPT: it ends the step


class ComputeClock:
    """Times compute actions without a device-wide sync.

    On the CPU an action's work is done when its call returns: wall and thread CPU time
    around the call. On a GPU kernels run after their launch, so CUDA events recorded on
    the compute stream around the call time them; the host waits on the step's last event
    once, at its update (an event wait: NCCL's streams are not waited on), and converts
    every pending action of the step then."""

    def __init__(self, device: torch.device, log):
        self.cuda, self.log = device.type == "cuda", log
        self.pending: list[tuple[Timed, torch.cuda.Event, torch.cuda.Event]] = []  # on a GPU, until the update
        if self.cuda:
            self.origin = torch.cuda.Event(enable_timing=True)
            self.origin.record()
            self.origin.synchronize()  # once, before training: the host's clock at the event
            self.origin_s = time.perf_counter()

    def begin(self) -> tuple[float, float, "torch.cuda.Event | None"]:
        start = None
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        return time.perf_counter(), time.thread_time(), start

    def end(self, mark, label: str, step: int, update: bool) -> list[Timed]:
        """What is timed by now: this action on the CPU; on a GPU, at an update, every
        action since the last update."""
        t0, c0, start = mark
        t1, c1 = time.perf_counter(), time.thread_time()
        timed = Timed(label, step, t0, t1, c1 - c0, update)
        if update:  # logged on every device, so that commcheck sees what a GPU run does
            self.log.host_read(f"compute timing of step {step} (an event on the compute stream)")
        if not self.cuda:
            return [timed]
        stop = torch.cuda.Event(enable_timing=True)
        stop.record()
        self.pending.append((timed, start, stop))
        if not update:
            return []
        stop.synchronize()
        at = lambda ev: self.origin_s + self.origin.elapsed_time(ev) / 1e3  # noqa: E731
        for t, a, b in self.pending:
            t.t0, t.t1 = at(a), at(b)
        done, self.pending = [t for t, _, _ in self.pending], []
        return done


@dataclass
class StepRecord:
    step: int
    losses: list[float] = field(default_factory=list)  # this replica's micro-batch losses (last stage)
    end_time: float = 0.0
    compute_s: float = 0.0  # wall time in compute actions
    op_s: dict[str, list[float]] = field(default_factory=dict)  # F, B, OPT -> [seconds, count]
    compute_cpu_s: float = 0.0  # CPU time of the engine thread in them (shared cores inflate wall time)
    grad_norm: float = 0.0  # the global norm of the gradient the update applied (before clipping)
    lr: float = 0.0
    skipped: bool = False  # the update was refused (non-finite, --on-nonfinite skip)
    val_loss_sum: float = 0.0  # held-out losses evaluated after this step's update (last stage)
    val_count: int = 0


class Engine:
    def __init__(self, schedule: Schedule, model: StageModel, groups: Groups, comm: StageComm, batch: BatchFn,
                 device: torch.device, recorder: Recorder,
                 on_step: Callable[[StepRecord], None] | None = None, delay_s: float = 0.0,
                 kill_step: int | None = None, rule: UpdateRule | None = None, precision: str = "fp32",
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss):
        self.sched, self.model, self.g, self.comm, self.batch = schedule, model, groups, comm, batch
        # bf16: autocast runs matmuls in bf16; weights, the loss and what crosses stages stay fp32.
        self.autocast = precision == "bf16"
        self.loss_fn = loss_fn
        self.rule = rule or UpdateRule(lr=model.optimizer.param_groups[0]["lr"], steps=schedule.steps)
        self.device, self.rec, self.on_step = device, recorder, on_step
        self.delay_s = delay_s  # an injected straggler: extra time after every forward
        self.kill_step = kill_step  # an injected crash: this process dies when that step starts
        self.step_now = -1  # the global step of the latest forward, for failure messages
        self.progress = os.environ.get("TRIRACE_PROGRESS_FILE")
        self.m = schedule.micro_batches
        self.norm_of_step: dict[int, tuple[float, bool]] = {}  # OPT's global norm, awaited before its timing
        self.inputs: dict[int, torch.Tensor] = {}  # received activation (requires grad)
        self.outputs: dict[int, torch.Tensor] = {}  # stage output, or the scaled loss on the last stage
        self.out_grads: dict[int, torch.Tensor] = {}  # received gradient of the output
        self.weight_passes: dict[int, split_backward.WeightPass] = {}  # a split backward's W, from its I
        self.records: dict[int, StepRecord] = {}
        self.clock = ComputeClock(device, groups.control.log)

    def _record(self, step: int) -> StepRecord:
        return self.records.setdefault(step, StepRecord(step))

    # ------------------------------------------------------------ compute

    def _global_index(self, k: int) -> tuple[int, int]:
        """(global step, position in the global batch): replica r owns positions r*m .. r*m+m-1."""
        step, i = divmod(k, self.m)
        return step + self.model.offset, self.g.replica * self.m + i

    def forward(self, k: int) -> None:
        step = self.sched.step_of(k)
        if step + self.model.offset != self.step_now:
            self.step_now = step + self.model.offset
            if self.progress:  # the local launcher names the step a dead rank was in
                with open(self.progress + ".tmp", "w") as f:
                    f.write(str(self.step_now))
                os.replace(self.progress + ".tmp", self.progress)
        if self.step_now == self.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        module = self.model.module(self.sched.version_of_step(step))
        x = self.batch(*self._global_index(k))[0].to(self.device) if self.model.is_first else self.inputs[k]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            y = module(x)
            if self.model.is_last:
                loss = self.loss_fn(y, self.batch(*self._global_index(k))[1].to(self.device))
        if not self.model.is_last and y.dtype != torch.float32:  # the next stage receives fp32
            y = y.float()
        if self.model.is_last:
            self.comm.norms.loss(step, loss)  # read back once per step, with the step's norm
            y = loss / self.m  # gradients average over micro-batches
        self.outputs[k] = y
        if self.delay_s:
            time.sleep(self.delay_s)

    def backward(self, k: int, unit: int) -> None:
        """B, or a split backward's W: the weight gradients of micro-batch k (a step's
        reduction chunks are ready at its last). After an I, W resumes from what the I kept;
        else (B, or W on the first stage, which takes no input gradient) the whole pass."""
        step = self.sched.step_of(k)
        last = (k + 1) % self.m == 0
        self.comm.backward_begins(step, last, unit)
        if k in self.weight_passes:
            split_backward.weight_grad(self.weight_passes.pop(k), self._weights(k))
            if self.model.emulated_weight_s is not None:  # emulated weights lie outside the graph
                compute_for(self.model.emulated_weight_s)
        else:
            y = self.outputs.pop(k)
            if self.model.is_last:
                y.backward()
            else:
                torch.autograd.backward(y, self.out_grads.pop(k))
        self.comm.backward_ends(step, last)

    def _weights(self, k: int) -> list[torch.Tensor]:
        return list(self.model.module(self.sched.version_of_step(self.sched.step_of(k))).parameters())

    def input_grad(self, k: int) -> None:
        """I of a split backward: the gradient of the stage's input alone, which the
        previous stage waits for (runtime/split_backward.py keeps what W needs). The
        first stage has no input gradient: its W runs the whole backward."""
        if self.model.is_first:
            return
        y, x = self.outputs.pop(k), self.inputs[k]
        g = None if self.model.is_last else self.out_grads.pop(k)
        with input_grad_only():
            x.grad, self.weight_passes[k] = split_backward.input_grad(y, g, x, self._weights(k),
                                                                      split=not self.model.recompute)

    def await_update(self, step: int) -> tuple[float, bool]:
        """What OPT waits for: the tied weight's reduction, then the step's global norm, which
        needs every stage's gradient summed over its replicas. Both waits are exposed
        all-reduce time (the simulator counts them so too), not the update's compute."""
        self.comm.before_update(step)
        t0 = time.perf_counter()
        got = self.comm.norms.wait(step)
        self.comm.stats.add(step, kind="allreduce", exposed_s=time.perf_counter() - t0)
        return got

    def update(self, step: int) -> None:
        """OPT: every rank reads the same global norm, so every rank makes the same choice."""
        norm, bad_loss = self.norm_of_step.pop(step)
        global_step = step + self.model.offset
        skip = bad_loss or not math.isfinite(norm)
        if skip and self.rule.on_nonfinite == "stop":
            raise Diverged(global_step, "non-finite loss" if bad_loss else f"non-finite gradient norm ({norm})")
        rec = self._record(step)
        rec.grad_norm, rec.lr, rec.skipped = norm, self.rule.lr_at(global_step), skip
        self.model.step(self.sched.version_of_step(step), publish_version=step + 1, lr=rec.lr,
                        scale=1.0 if skip else self.rule.factor(norm), skip=skip,
                        compensation=self.rule.compensation)

    # ------------------------------------------------------------ driver

    def _transfers(self, group: list[Action]) -> None:
        sends = {}
        for a in group:
            if a.op is Op.SF:
                sends[a] = self.outputs[a.index].detach().contiguous()
            elif a.op is Op.SB:
                sends[a] = self.inputs.pop(a.index).grad.contiguous()
        self.comm.exchange(group, sends)

    def run(self, actions: tuple[Action, ...]) -> None:
        try:
            self._run(actions)
        except BaseException:
            self.comm.close(failed=True)
            raise
        self.comm.close()

    def _run(self, actions: tuple[Action, ...]) -> None:
        """Each unit of the action list (a compute action, or a run of adjacent transfers),
        then the launches the plan puts after it."""
        for unit, group in enumerate(p2p_groups(actions)):
            self._unit(unit, group)
            self.comm.after_unit(unit)

    def _unit(self, unit: int, group: list[Action]) -> None:
        a = group[0]
        if a.op.is_p2p:
            self._transfers(group)
            return
        if a.op is Op.AR:
            self.comm.reduce(a.index)
            return
        if a.op is Op.OPT:
            self.norm_of_step[a.index] = self.await_update(a.index)
        self._receive(a)
        mark = self.clock.begin()
        self.comm.log.compute(str(a))
        if a.op is Op.F:
            self.forward(a.index)
        elif a.op.ends_backward:
            self.backward(a.index, unit)
        elif a.op is Op.I:
            self.input_grad(a.index)
        else:
            self.update(a.index)
        step = self.sched.step_of_action(a)
        for timed in self.clock.end(mark, str(a), step, update=a.op is Op.OPT):
            self._account(timed)
        if a.op is Op.OPT:
            rec = self._record(step)
            rec.losses = self.comm.norms.losses_of(step)
            if self.on_step:
                self.on_step(self.records.pop(step))

    def _receive(self, a: Action) -> None:
        """What compute `a` consumes from a neighbour, waited for here, outside its timing."""
        if a.op is Op.F and not self.model.is_first:
            self.inputs[a.index] = self.comm.take(Action(Op.RF, a.index)).requires_grad_(True)
            self.rec.flow(f"RF{a.index}", str(a))
        elif a.op.takes_output_grad and not self.model.is_last:
            self.out_grads[a.index] = self.comm.take(Action(Op.RB, a.index))
            self.rec.flow(f"RB{a.index}", str(a))

    def _account(self, t: Timed) -> None:
        # the thread's CPU beside the wall time: on shared cores the gap is the contention
        self.rec.span("compute", t.label, t.t0, t.t1, cpu_s=round(t.cpu_s, 6))
        rec = self._record(t.step)
        rec.compute_s += t.t1 - t.t0
        op = t.label.rstrip("0123456789")
        spent = rec.op_s.setdefault(op, [0.0, 0])
        spent[0] += t.t1 - t.t0
        spent[1] += 1
        rec.compute_cpu_s += t.cpu_s
        if t.update:
            rec.end_time = t.t1
