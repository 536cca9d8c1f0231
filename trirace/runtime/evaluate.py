"""Validation loss on held-out data, run through the pipeline right after an update.

Each stage evaluates the weights its OPT just published, W(t+1), on the same fixed
held-out micro-batches every time (so the curve compares like with like); replica r takes
its own `eval_batches` of them. Activations go forward on the pipeline's communicator,
launched by the engine thread right after its OPT: a fixed point of the action list on
every rank, like every other launch.

Why it cannot hang a pipeline without a flush: a stage only waits for its upstream
neighbour's evaluation, which that neighbour runs at its own OPT, and its sends are never
waited on before the next evaluation. `schedule_for_policy` validates every schedule with
exactly that wait (`chained_update`).
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from ..models import lm_loss
from ..plan import Op
from .communicator import Handle
from .engine import BatchFn
from .groups import Groups
from .stage import StageModel


class Evaluator:
    def __init__(self, model: StageModel, groups: Groups, batch: BatchFn, batches: int, every: int, steps: int,
                 activation_shape: tuple[int, ...], device: torch.device, precision: str, loss_fn=lm_loss):
        self.model, self.g, self.batch, self.batches = model, groups, batch, batches
        self.every, self.steps, self.shape, self.device = every, steps, activation_shape, device
        self.autocast = precision == "bf16"
        self.loss_fn = loss_fn
        self.sending: list[tuple[Handle, torch.Tensor]] = []

    def due(self, global_step: int) -> bool:
        return self.every > 0 and ((global_step + 1) % self.every == 0 or global_step == self.steps - 1)

    @torch.no_grad()
    def run(self, version: int) -> tuple[float, int]:
        """(sum of the held-out losses, their count) here; (0, 0) off the last stage."""
        self.wait_sends()
        module = self.model.module(version)
        # The master weights, W(t+1), through the buffer's modules: with --delay-compensation
        # predict the buffer holds a prediction, not the weights the update produced.
        master = self.model.master_of(module)
        weights = {name: master[id(p)] for name, p in module.named_parameters()}
        total, count = 0.0, 0
        for i in range(self.batches):
            inputs, targets = self.batch(0, self.g.replica * self.batches + i)
            if self.model.is_first:
                x = inputs.to(self.device)
            else:
                comm, peer = self.g.p2p[Op.RF]  # the pipeline's communicator, as training's
                x = torch.empty(self.shape, device=self.device)
                comm.p2p([("recv", x, peer)])[0].wait()
            log = self.g.control.log
            log.compute(f"eval{i}")
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                y = functional_call(module, weights, (x,))
                if self.model.is_last:
                    log.host_read(f"eval loss.item() of batch {i}")
                    total += self.loss_fn(y, targets.to(self.device)).item()
                    count += 1
            if not self.model.is_last:
                comm, peer = self.g.p2p[Op.SF]
                out = y.float().contiguous()
                self.sending.append((comm.p2p([("send", out, peer)])[0], out))
        return total, count

    def wait_sends(self) -> None:
        """Sends complete when downstream evaluates: waited only here and at the end."""
        for handle, _ in self.sending:
            handle.wait()
        self.sending.clear()
