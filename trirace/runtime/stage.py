"""One pipeline stage's layers and weights.

`versions` holds the weight buffers compute runs on: one for synchronous schedules, two for
2BW (W(t-1), used by step t, and W(t)). The optimizer owns a separate `master` copy of the
latest weights, so its state (Adam moments) belongs to parameters, not to buffers, and
publishing W(t+1) is a copy into the buffer whose version no step needs any more.

Each version's gradients live in one flat buffer (every `.grad` is a view into it, which
autograd accumulates into in place), so a reduction chunk is a slice: no copies, and the
blocking policy's single flattened all-reduce is the whole buffer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..models import ModelSpec, build_layers, layer_names
from ..models.build import head_name, table_name, tie_in_place
from ..models.devices import WEIGHT_GRAD_SHARE
from ..models.emulated import EmulatedLayer, compute_for, step_seconds
from ..models.layers import Block, LlamaBlock
from ..optim import dc_correct, make_optimizer, muon_matrices


class StageModel:
    def __init__(self, spec: ModelSpec, layers: range, seed: int, n_versions: int, optimizer: str,
                 lr: float, device: torch.device, weight_decay: float = 0.0, recompute: bool = False):
        self.layers = layers
        self.is_first = layers.start == 0
        self.is_last = layers.stop == len(layer_names(spec))
        self.recompute = recompute
        self.versions = [Layers(self._layers(spec, seed, layers), recompute).to(device) for _ in range(n_versions)]
        params = list(self.versions[0].parameters())
        self.numels = [p.numel() for p in params]
        self.shapes = [tuple(p.shape) for p in params]
        first, last = self.versions[0][0], self.versions[0][-1]
        # The token table (param index) whose gradient an embedding method exchanges, and the
        # parameter tied to another stage (table on the first stage, head on the last).
        table = table_name(spec) if self.is_first else None
        self.table = _index(params, first.get_parameter(table)) if table else None
        tied_elsewhere = spec.tie_embeddings and self.is_first != self.is_last
        self.tied = None
        if tied_elsewhere:
            self.tied = self.table if self.is_first else _index(params, last.get_parameter(head_name(spec)))
        self.flat_grads = [torch.zeros(sum(self.numels), device=device) for _ in range(n_versions)]
        for module, flat in zip(self.versions, self.flat_grads):
            offset = 0
            for p in module.parameters():
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        self.master = [nn.Parameter(p.detach().clone()) for p in self.versions[0].parameters()]
        hidden = muon_matrices(self.versions[0], layers.start, len(layer_names(spec)))
        matrices = {id(m) for m, p in zip(self.master, params) if id(p) in hidden}
        self.optimizer = make_optimizer(self.master, optimizer, lr, weight_decay, matrices)
        # Emulated layers (--emulate) update nothing: the step takes the device's time instead.
        self.emulated_step_s = step_seconds(self.versions[0])
        emulated = [m for m in self.versions[0] if isinstance(m, EmulatedLayer)]
        # A split backward's W: emulated parameters are outside the graph, so it takes the
        # W share of the stage's backward here (its I took the rest, layer by layer).
        self.emulated_weight_s = sum(m.backward_s for m in emulated) * WEIGHT_GRAD_SHARE if emulated else None

    @staticmethod
    def _layers(spec: ModelSpec, seed: int, layers: range) -> list[nn.Module]:
        built = build_layers(spec, seed, layers)
        if spec.tie_embeddings and layers.start == 0 and layers.stop == len(layer_names(spec)):
            tie_in_place(built, spec)  # both ends on this stage: one shared parameter
        return built

    def grad_view(self, version: int, param: int) -> torch.Tensor:
        """A parameter's gradient as a view of the flat buffer, in its own shape."""
        start = sum(self.numels[:param])
        return self.flat_grad(version)[start:start + self.numels[param]].view(self.shapes[param])

    @torch.no_grad()
    def checksum(self, version: int, param: int) -> float:
        """A float64 fingerprint of one parameter's weights (equal tensors, equal numbers)."""
        w = list(self.module(version).parameters())[param].detach().double().flatten()
        return float((w * torch.arange(1, w.numel() + 1, dtype=torch.float64, device=w.device).sqrt()).sum())

    # A resumed run numbers its steps from 0 again; `offset` (its first global step) keeps
    # every global weight version in the buffer slot it had when it was saved.
    offset: int = 0

    def slot_of(self, version: int) -> int:
        """The buffer slot holding weight version `version` (the one mapping every caller uses)."""
        return (version + self.offset) % len(self.versions)

    def module(self, version: int) -> nn.Module:
        return self.versions[self.slot_of(version)]

    def flat_grad(self, version: int) -> torch.Tensor:
        return self.flat_grads[self.slot_of(version)]

    def master_of(self, module: nn.Module) -> dict[int, nn.Parameter]:
        """id(parameter of a weight buffer) -> its master copy, which holds the weights the
        latest update produced (a buffer may hold 2BW's prediction of them instead)."""
        return {id(p): m for p, m in zip(module.parameters(), self.master)}

    @torch.no_grad()
    def step(self, version: int, publish_version: int, lr: float | None = None, scale: float = 1.0,
             skip: bool = False, compensation: str = "none") -> None:
        """Apply the (already averaged) gradients of `version`, times `scale` (the clip), to
        the master weights at learning rate `lr`, and publish the result as
        `publish_version`, whose buffer's gradients start from zero. `skip` publishes the
        master weights unchanged (an update refused for a non-finite gradient).
        `compensation` (2BW; optim.py says what each does): "predict" publishes
        2 W(t+1) - W(t) instead of W(t+1); "dc" corrects the stale gradient first."""
        computed_on = list(self.module(version).parameters())
        publish = list(self.module(publish_version).parameters())  # under 2BW: the same buffer
        predicted = compensation == "predict" and not skip
        if not skip:
            if scale != 1.0:
                self.flat_grad(version).mul_(scale)
            if compensation == "dc":
                states = self.optimizer.state  # once: MuonAdamW assembles it from its two parts
                for m, p in zip(self.master, computed_on):
                    dc_correct(p.grad, m.detach(), p.detach(), states.get(m, {}).get("exp_avg_sq"))
            if lr is not None:
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
            for m, p in zip(self.master, computed_on):
                m.grad = p.grad
            if predicted:  # W(t) into the free buffer before the step: no third copy
                for m, p in zip(self.master, publish):
                    p.copy_(m)
            if self.emulated_step_s is None:
                self.optimizer.step()
            else:
                compute_for(self.emulated_step_s)
        for m, p in zip(self.master, publish):
            if predicted:
                p.mul_(-1.0).add_(m, alpha=2.0)  # 2 W(t+1) - W(t)
            else:
                p.copy_(m)
            m.grad = None
        self.flat_grad(publish_version).zero_()

    def n_params(self) -> int:
        return sum(self.numels)


class Layers(nn.Sequential):
    """A stage's run of layers. With `recompute`, each transformer block keeps only its
    input for backward and runs its forward again there (torch's non-reentrant
    checkpoint, which replays autocast too): the same values, so the same gradients, for
    a block's input instead of its ~16 intermediate tensors per micro-batch in flight."""

    def __init__(self, layers: list[nn.Module], recompute: bool = False):
        super().__init__(*layers)
        self.recompute = recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            if self.recompute and isinstance(layer, (Block, LlamaBlock)) and torch.is_grad_enabled():
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return x


def _index(params: list[nn.Parameter], p: nn.Parameter) -> int:
    return next(i for i, q in enumerate(params) if q is p)
