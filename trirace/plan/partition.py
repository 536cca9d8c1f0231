"""Layers -> contiguous pipeline stages, balanced by a per-layer cost.

The cost is measured time (see `runtime.layer_timing`) or parameter count; either way the
split minimises the cost of the heaviest stage, since the slowest stage sets the pace
of the whole pipeline.
"""

from __future__ import annotations

from ..errors import UsageError


def balance(costs: list[float], n_stages: int) -> list[int]:
    """Layers per stage minimising the largest stage sum; every stage gets at least one layer.
    Exact dynamic programme over cut points: O(stages * layers^2), tiny for real models."""
    n = len(costs)
    if n_stages < 1:
        raise UsageError("need at least one pipeline stage")
    if n_stages > n:
        raise UsageError(f"cannot cut {n} layers into {n_stages} stages: more stages than layers")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: smallest max-stage cost putting the first i layers into k stages.
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n - (n_stages - k) + 1):
            for j in range(k - 1, i):
                cand = max(best[k - 1][j], prefix[i] - prefix[j])
                if cand < best[k][i]:
                    best[k][i], cut[k][i] = cand, j
    sizes, i = [], n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def check_sizes(sizes: list[int], n_layers: int, n_stages: int) -> list[int]:
    """Validate an explicit override such as --partition 3,4."""
    if len(sizes) != n_stages:
        raise UsageError(f"partition lists {len(sizes)} stages but pp is {n_stages}")
    if any(s < 1 for s in sizes):
        raise UsageError("every stage in the partition needs at least one layer")
    if sum(sizes) != n_layers:
        raise UsageError(f"partition covers {sum(sizes)} layers but the model has {n_layers}")
    return list(sizes)


def stage_ranges(sizes: list[int]) -> list[range]:
    out, start = [], 0
    for s in sizes:
        out.append(range(start, start + s))
        start += s
    return out


def stage_sums(costs: list[float], sizes: list[int]) -> list[float]:
    """Per-layer costs (time, parameters, bytes) summed per stage."""
    return [sum(costs[r.start:r.stop]) for r in stage_ranges(sizes)]


def imbalance(costs: list[float], sizes: list[int]) -> float:
    """Heaviest stage over the mean stage: 1.0 is perfect balance."""
    sums = stage_sums(costs, sizes)
    return max(sums) / (sum(sums) / len(sums)) if sum(sums) else 1.0
