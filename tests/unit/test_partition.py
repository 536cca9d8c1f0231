"""Contiguous layer partitioning: optimal balance, override checks, ranges, imbalance."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from trirace.errors import UsageError
from trirace.plan import balance, check_sizes, stage_ranges
from trirace.plan.partition import imbalance


def stage_sums(costs, sizes):
    return [sum(costs[r.start:r.stop]) for r in stage_ranges(sizes)]


def brute_force_best(costs, k):
    """Smallest possible heaviest-stage cost over every split into k non-empty contiguous parts."""
    n = len(costs)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def check_valid_partition(sizes, n_layers, k):
    assert len(sizes) == k
    assert all(isinstance(s, int) and s >= 1 for s in sizes), sizes
    assert sum(sizes) == n_layers


def test_balance_is_optimal_on_random_integer_costs():
    rng = random.Random(1234)
    for _ in range(400):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        costs = [rng.randint(0, 20) for _ in range(n)]
        sizes = balance(costs, k)
        check_valid_partition(sizes, n, k)
        assert max(stage_sums(costs, sizes)) == brute_force_best(costs, k), (costs, k, sizes)


def test_balance_is_optimal_on_random_float_costs():
    rng = random.Random(99)
    for _ in range(300):
        n = rng.randint(1, 10)
        k = rng.randint(1, n)
        costs = [rng.uniform(0.01, 5.0) * rng.choice([1, 1, 10]) for _ in range(n)]
        sizes = balance(costs, k)
        check_valid_partition(sizes, n, k)
        assert math.isclose(max(stage_sums(costs, sizes)), brute_force_best(costs, k), rel_tol=1e-9)


def test_balance_exhaustive_small_cases():
    """Every 0..3-valued cost list of up to 5 layers, every stage count."""
    for n in range(1, 6):
        for costs in itertools.product(range(4), repeat=n):
            costs = list(costs)
            for k in range(1, n + 1):
                sizes = balance(costs, k)
                check_valid_partition(sizes, n, k)
                assert max(stage_sums(costs, sizes)) == brute_force_best(costs, k), (costs, k)


@pytest.mark.parametrize("costs,k,expected", [
    ([1, 1, 1, 1], 2, [2, 2]),
    ([1, 1, 1, 1, 1, 1], 3, [2, 2, 2]),
    ([10, 1, 1, 1], 2, [1, 3]),
    ([1, 1, 1, 10], 2, [3, 1]),
    ([5, 5, 5], 3, [1, 1, 1]),
    ([7], 1, [1]),
])
def test_balance_known_answers(costs, k, expected):
    assert balance(costs, k) == expected


def test_balance_gives_every_stage_a_layer_even_when_costs_are_lopsided():
    # one layer dominates; the optimum max is that layer, but zero-cost stages are not allowed
    costs = [100, 0, 0, 0, 0]
    for k in range(1, 6):
        sizes = balance(costs, k)
        check_valid_partition(sizes, 5, k)
        assert max(stage_sums(costs, sizes)) == 100
    assert balance([0.0] * 4, 4) == [1, 1, 1, 1]
    check_valid_partition(balance([0.0] * 4, 2), 4, 2)


def test_balance_one_stage_per_layer():
    assert balance([3, 1, 4, 1, 5], 5) == [1, 1, 1, 1, 1]


def test_balance_rejects_more_stages_than_layers():
    with pytest.raises(UsageError, match="more stages than layers"):
        balance([1.0, 2.0], 3)
    with pytest.raises(UsageError, match="more stages than layers"):
        balance([], 1)


@pytest.mark.parametrize("k", [0, -1])
def test_balance_rejects_no_stages(k):
    with pytest.raises(UsageError, match="at least one pipeline stage"):
        balance([1.0, 2.0], k)


def test_check_sizes_accepts_and_copies():
    given = (3, 4)
    out = check_sizes(given, 7, 2)
    assert out == [3, 4] and isinstance(out, list)
    src = [2, 2, 2]
    out = check_sizes(src, 6, 3)
    out.append(9)
    assert src == [2, 2, 2]


@pytest.mark.parametrize("sizes,n_layers,n_stages,fragment", [
    ([3, 4], 7, 3, "lists 2 stages but pp is 3"),
    ([1, 2, 4], 7, 2, "lists 3 stages but pp is 2"),
    ([], 0, 1, "lists 0 stages but pp is 1"),
    ([0, 7], 7, 2, "at least one layer"),
    ([8, -1], 7, 2, "at least one layer"),
    ([3, 3], 7, 2, "covers 6 layers but the model has 7"),
    ([4, 4], 7, 2, "covers 8 layers but the model has 7"),
])
def test_check_sizes_rejects(sizes, n_layers, n_stages, fragment):
    with pytest.raises(UsageError, match=fragment):
        check_sizes(sizes, n_layers, n_stages)


def test_stage_ranges():
    assert stage_ranges([2, 3, 1]) == [range(0, 2), range(2, 5), range(5, 6)]
    assert stage_ranges([4]) == [range(0, 4)]
    assert stage_ranges([]) == []


def test_stage_ranges_tile_the_layers():
    rng = random.Random(7)
    for _ in range(50):
        sizes = [rng.randint(1, 5) for _ in range(rng.randint(1, 8))]
        rs = stage_ranges(sizes)
        assert [len(r) for r in rs] == sizes
        assert [i for r in rs for i in r] == list(range(sum(sizes)))


def test_imbalance():
    assert imbalance([1, 1, 1, 1], [2, 2]) == 1.0
    assert imbalance([3, 1], [1, 1]) == pytest.approx(1.5)  # heaviest 3 over mean 2
    assert imbalance([1, 2, 3, 6], [3, 1]) == pytest.approx(1.0)
    assert imbalance([1, 2, 3, 6], [1, 3]) == pytest.approx(11 / 6)
    assert imbalance([0, 0, 0], [1, 2]) == 1.0  # no cost at all: balanced by definition
    assert imbalance([5], [1]) == 1.0


def test_balance_never_worse_than_even_split():
    rng = random.Random(5)
    for _ in range(100):
        n = rng.randint(2, 16)
        k = rng.randint(1, n)
        costs = [rng.uniform(0, 3) for _ in range(n)]
        even = [n // k + (1 if i < n % k else 0) for i in range(k)]
        assert imbalance(costs, balance(costs, k)) <= imbalance(costs, even) + 1e-12
