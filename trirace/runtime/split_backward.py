"""A stage's backward in two parts, as zero-bubble schedules run it: I, the gradient of the
stage's input (what the previous stage waits for), now; W, the weight gradients, later.

I runs autograd from the stage's output to its input alone, keeping the graph. On the way
it records the gradient arriving at every node where the path to the input meets a branch
that leads to weights only (a matmul's node, whose input edge I follows and whose weight
edge it skips). W starts autograd again at those nodes with those gradients and follows
the weight branches only. Together they run each node's backward once per edge, as the
whole backward does; re-running autograd from the output to the weights instead would
compute every input-side gradient of the stage twice.

W runs each such node with the edges to its weight branches alone as what it wants, so
autograd does not walk on down the input side (whose gradients I has, and which leads to
further weights), then all the branches at once down to the weights.

Works on any layer list (no layer is rewritten): the split is found in the graph autograd
built. Memory: the graph's saved tensors stay from the forward to W, as the schedule's
memory model counts them (plan/memory.py: held from F to W).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge


@dataclass
class WeightPass:
    """What W needs: each node it starts at, with the gradient I recorded there and the
    edges to its weight branches; or, where the split does not apply, the output and its
    gradient, for one pass from the output to the weights."""

    starts: list[tuple[Node, tuple[torch.Tensor | None, ...], list[tuple[Node, int]]]]
    whole: tuple[torch.Tensor, torch.Tensor | None] | None = None


def _node_of(t: torch.Tensor) -> Node | None:
    """The graph node whose gradient is t's: its grad_fn, or a leaf's accumulator."""
    return get_gradient_edge(t).node if t.requires_grad else None


def _graph(root: Node) -> tuple[dict[Node, list[Node]], list[Node], dict[Node, int]]:
    """Children of every node under `root`, the nodes in an order that puts each after all
    its children, and how many edges enter each (iteratively: a deep model's graph is
    deeper than Python's recursion limit)."""
    children: dict[Node, list[Node]] = {}
    parents: dict[Node, int] = {}
    order: list[Node] = []
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in children:
            continue
        children[node] = [c for c, _ in node.next_functions if c is not None]
        for c in children[node]:
            parents[c] = parents.get(c, 0) + 1
        stack.append((node, True))
        stack.extend((c, False) for c in children[node] if c not in children)
    return children, order, parents


def _reaching(children: dict[Node, list[Node]], order: list[Node], targets: set[Node]) -> set[Node]:
    reach: set[Node] = set()
    for node in order:
        if node in targets or any(c in reach for c in children[node]):
            reach.add(node)
    return reach


def input_grad(output: torch.Tensor, grad: torch.Tensor | None, inp: torch.Tensor,
               params: Sequence[torch.Tensor], split: bool = True) -> tuple[torch.Tensor, WeightPass]:
    """I: d output / d inp (times `grad`, None for a scalar loss), and what W needs.
    `split=False`: W is one pass from the output to the weights. With recomputed
    (checkpointed) blocks that is cheaper: each autograd call that reaches a block runs its
    forward again, and the split makes several calls per block."""
    if not split:
        (dx,) = torch.autograd.grad(output, inp, grad, retain_graph=True)
        return dx, WeightPass([], (output, grad))
    root, target = _node_of(output), _node_of(inp)
    children, order, parents = _graph(root)
    on_input = _reaching(children, order, {target})
    to_weights = _reaching(children, order, {n for n in map(_node_of, params) if n is not None})
    branches = {n: [(c, i) for c, i in n.next_functions if c is not None and c not in on_input and c in to_weights]
                for n in on_input}
    branches = {n: b for n, b in branches.items() if b}
    # A weight branch entered from two places (a weight used twice along the stage) would
    # take the input side's share twice: such a graph takes one pass to the weights at W.
    if any(parents[c] > 1 for b in branches.values() for c, _ in b):
        (dx,) = torch.autograd.grad(output, inp, grad, retain_graph=True)
        return dx, WeightPass([], (output, grad))
    seen: dict[Node, tuple[torch.Tensor | None, ...]] = {}
    hooks = [n.register_prehook(lambda grads, n=n: seen.__setitem__(n, tuple(grads))) for n in branches]
    try:
        (dx,) = torch.autograd.grad(output, inp, grad, retain_graph=True)
    finally:
        for h in hooks:
            h.remove()
    return dx, WeightPass([(n, seen[n], branches[n]) for n in branches if n in seen])


def weight_grad(pending: WeightPass, params: Sequence[torch.Tensor]) -> None:
    """W: accumulate the weight gradients into each parameter's .grad, in place."""
    if pending.whole is not None:
        output, grad = pending.whole
        torch.autograd.backward(output, grad, inputs=list(params))
        return
    # First into each weight branch: the node alone, its input side not needed (the
    # branch is entered from that node only). Then down all branches at once to the weights.
    edges, grads = [], []
    for node, got, branch in pending.starts:
        outs = [(GradientEdge(node, i), g) for i, g in enumerate(got) if g is not None]
        if not outs:
            continue
        into = torch.autograd.grad([e for e, _ in outs], [GradientEdge(c, i) for c, i in branch],
                                   [g for _, g in outs], allow_unused=True)
        for (c, i), g in zip(branch, into):
            if g is not None:
                edges.append(GradientEdge(c, i))
                grads.append(g)
    keep = [p for p in params if p.requires_grad]
    if not edges or not keep:
        return
    dws = torch.autograd.grad(edges, [get_gradient_edge(p) for p in keep], grads, allow_unused=True)
    with torch.no_grad():
        for p, dw in zip(keep, dws):
            if dw is None:
                continue
            if p.grad is None:
                p.grad = dw
            else:
                p.grad.add_(dw)
