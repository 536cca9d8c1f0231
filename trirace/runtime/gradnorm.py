"""Each step's global gradient norm, agreed by every rank before its update.

Clipping needs the norm over all stages and replicas, and the divergence guard needs every
rank to make the same stop-or-skip decision. Both ride on one small all-reduce per step on
the "norm" communicator (gloo, the whole world): a vector with one slot per stage, where
replica 0 of each stage writes the squared norm of that stage's averaged gradient, plus one
slot counting non-finite losses. A sum in which each slot has one writer is exact, so
every rank reads the same figures and computes the same factor, bit for bit, whatever the
communication policy did before.

When it is issued is what keeps it from deadlocking a pipeline without a flush. A stage's
contribution goes out from the engine thread once its gradient of the step is summed over
its replicas: at the end of the step's last backward when there are no replicas;
otherwise at the sum point the plan gives it (policy/driver.py: `summed_at`), or at AR.
None waits for a later action of the engine. Issued at AR, the contributions would make
every stage wait at OPT for the slowest to reach its AR: a barrier at every step of a
pipeline that never flushes. Only the update (OPT) waits for the result, and with OPT at
its deadline every stage's contribution needs only actions that precede every stage's OPT
(`validate` with `global_update=True` proves it for the schedule in use). The communicator is gloo on the host, so the
all-reduce never occupies the device.

Contributions go out in step order; `ready()` issues strictly in order even if asked out
of order.
"""

from __future__ import annotations

import math
import threading

import torch

from .communicator import Communicator, Handle
from .stage import StageModel


NORM_BLOCK = 1 << 20  # gradient values per float64 partial sum


class GradNorms:
    def __init__(self, comm: Communicator, model: StageModel, stage: int, n_stages: int, replica: int,
                 replicas: int, version_of_step):
        self.comm, self.model, self.stage, self.n_stages = comm, model, stage, n_stages
        self.replica, self.replicas, self.version_of_step = replica, replicas, version_of_step
        self.lock = threading.Lock()
        self.next = 0  # the next step to issue
        self.ready_steps: set[int] = set()
        self.handles: dict[int, tuple[torch.Tensor, Handle]] = {}
        self.losses: dict[int, list[torch.Tensor]] = {}
        self.loss_values: dict[int, list[float]] = {}

    def loss(self, step: int, value: torch.Tensor) -> None:
        """A last-stage forward's loss (engine thread, before the step's contribution), kept
        on its device: the step reads its losses back once, with its norm (`_issue`)."""
        with self.lock:
            self.losses.setdefault(step, []).append(value.detach())

    def losses_of(self, step: int) -> list[float]:
        """This rank's micro-batch losses of step `step`, in forward order (after its
        contribution went out: the update waits for that)."""
        with self.lock:
            return self.loss_values.pop(step, [])

    def issued(self, step: int) -> bool:
        with self.lock:
            return step < self.next

    def ready(self, step: int) -> None:
        """Step `step`'s gradient, summed over replicas, is final here: issue its
        contribution, and any later ones already final, in step order."""
        with self.lock:
            self.ready_steps.add(step)
            while self.next in self.ready_steps:
                self.ready_steps.discard(self.next)
                self._issue(self.next)
                self.next += 1

    def _issue(self, step: int) -> None:
        vec = torch.zeros(self.n_stages + 1, dtype=torch.float64)
        losses = self.losses.pop(step, [])
        parts = []  # read back to the host together: one read per step
        blocks = 0
        if self.replica == 0:
            flat = self.model.flat_grad(self.version_of_step(step))
            # In float64, a block at a time in a fixed order: the same bits everywhere, a
            # bounded temporary.
            self.comm.log.compute(f"norm{step}")
            norms = [torch.linalg.vector_norm(flat[i:i + NORM_BLOCK], dtype=torch.float64)
                     for i in range(0, flat.numel(), NORM_BLOCK)]
            parts += norms
            blocks = len(norms)
        parts += [x.to(torch.float64) for x in losses]  # exact: every float32 is a float64
        values = []
        if parts:
            # On a device the read waits for what this thread launched before: logged.
            self.comm.log.host_read(f"gradnorm and losses of step {step} .tolist()")
            values = torch.stack(parts).tolist()
        if blocks:
            # A sum over replicas, not yet their mean: divided here, so the figure does not
            # depend on whether the engine has divided the buffer yet.
            vec[self.stage] = sum(v ** 2 for v in values[:blocks]) / self.replicas**2
        self.loss_values[step] = values[blocks:]
        vec[self.n_stages] = float(sum(not math.isfinite(v) for v in self.loss_values[step]))
        self.handles[step] = (vec, self.comm.all_reduce(vec))

    def wait(self, step: int) -> tuple[float, bool]:
        """(global norm, whether the loss was non-finite anywhere) of step `step` (OPT)."""
        with self.lock:
            vec, handle = self.handles.pop(step)
        handle.wait()
        total = sum(vec[: self.n_stages].tolist())  # the same order on every rank
        return math.sqrt(total), vec[self.n_stages].item() > 0

    def drain(self) -> None:
        """Wait on whatever is still in flight (a run's last steps), so nothing is left unwaited."""
        with self.lock:
            left = list(self.handles.values())
            self.handles.clear()
        for _, handle in left:
            handle.wait()
