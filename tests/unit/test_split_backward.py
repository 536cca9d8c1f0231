"""A backward split into I (the input gradient) and W (the weight gradients) computes what
the whole backward does, and W does not run the input side's nodes again."""

import pytest
import torch
from torch import nn

from trirace.config import make_config
from trirace.models import build_layers
from trirace.runtime.split_backward import input_grad, weight_grad
from trirace.runtime.stage import Layers


def _stage(model: str, layers: range, recompute: bool = False) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    spec = make_config({"model": model}).spec
    torch.manual_seed(0)
    seq = min(32, spec.max_seq_len)
    return (Layers(build_layers(spec, 0, layers), recompute), torch.randn(2, seq, spec.d_model),
            torch.randn(2, seq, spec.d_model))


def _whole(stage: nn.Module, x0: torch.Tensor, g: torch.Tensor):
    params = list(stage.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    x = x0.clone().requires_grad_(True)
    torch.autograd.backward(stage(x), g)
    return x.grad, [p.grad.clone() for p in params]


def _split(stage: nn.Module, x0: torch.Tensor, g: torch.Tensor, split: bool = True):
    params = list(stage.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    x = x0.clone().requires_grad_(True)
    y = stage(x)
    dx, pending = input_grad(y, g, x, params, split=split)
    assert all(torch.count_nonzero(p.grad) == 0 for p in params)  # I touched no weight
    weight_grad(pending, params)
    return dx, [p.grad.clone() for p in params]


@pytest.mark.parametrize("model,layers,recompute,split", [
    ("gpt-test", range(1, 4), False, True),
    ("llama-test", range(1, 4), False, True),
    ("llama-test", range(1, 4), True, False),  # recompute: W is one pass (the engine's choice)
    ("llama-test", range(1, 4), True, True),
])
def test_i_then_w_equals_the_whole_backward_bitwise(model, layers, recompute, split):
    stage, x, g = _stage(model, layers, recompute)
    dx, dws = _split(stage, x, g, split)
    want_dx, want_dws = _whole(stage, x, g)
    assert torch.equal(dx, want_dx)
    assert all(torch.equal(a, b) for a, b in zip(dws, want_dws))


def test_the_last_stage_splits_a_scalar_loss():
    stage, x, _ = _stage("gpt-test", range(3, 5))  # the last block, the final norm and the head

    def loss(y):
        return y.float().pow(2).mean()
    params = list(stage.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    x1 = x.clone().requires_grad_(True)
    dx, pending = input_grad(loss(stage(x1)), None, x1, params)
    weight_grad(pending, params)
    got = [p.grad.clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    x2 = x.clone().requires_grad_(True)
    loss(stage(x2)).backward()
    assert torch.equal(dx, x2.grad)
    assert all(torch.equal(a, p.grad) for a, p in zip(got, params))


def test_w_does_not_run_the_input_side_again():
    """The MLP's activation lies on the input side only: I runs its backward, W must not
    (the whole pass to the weights would, to reach the first MLP matrix below it)."""
    stage, x0, g = _stage("gpt-test", range(1, 3))
    params = list(stage.parameters())
    x = x0.clone().requires_grad_(True)
    y = stage(x)
    gelus, stack, seen = [], [y.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "Gelu" in node.name():
            gelus.append(node)
        stack.extend(c for c, _ in node.next_functions)
    assert gelus
    runs = []
    hooks = [n.register_prehook(lambda grads: runs.append(1)) for n in gelus]
    _, pending = input_grad(y, g, x, params)
    assert len(runs) == len(gelus)
    weight_grad(pending, params)
    assert len(runs) == len(gelus), "W ran input-side nodes again"
    for h in hooks:
        h.remove()


class _Shared(nn.Module):
    """One matrix used twice along the input side: its branch is entered from two places."""

    def __init__(self):
        super().__init__()
        self.w = nn.Linear(8, 8)

    def forward(self, x):
        return self.w(torch.tanh(self.w(x)))


def test_a_weight_used_twice_gets_both_shares_once():
    torch.manual_seed(1)
    stage, x, g = _Shared(), torch.randn(4, 8), torch.randn(4, 8)
    dx, dws = _split(stage, x, g)
    want_dx, want_dws = _whole(stage, x, g)
    assert torch.equal(dx, want_dx)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(dws, want_dws))
