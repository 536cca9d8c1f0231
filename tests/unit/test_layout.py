"""Rank layout: (stage, replica) <-> rank, data-parallel groups, pipeline links."""

from __future__ import annotations

import pytest

from trirace.errors import UsageError
from trirace.plan import Layout
from trirace.plan.layout import ORDERS

SHAPES = [(pp, dp) for pp in range(1, 6) for dp in range(1, 6)]
LAYOUTS = [Layout(pp, dp, order) for pp, dp in SHAPES for order in ORDERS]
# The blocked mixes: every block size that divides its axis, on shapes that have some.
LAYOUTS += [Layout(pp, dp, f"{axis}-blocks-{k}") for pp, dp in [(2, 4), (4, 2), (3, 6), (4, 4)]
            for axis, n in (("dp", dp), ("pp", pp)) for k in range(1, n + 1) if n % k == 0]


def test_orders():
    assert set(ORDERS) == {"dp-inner", "pp-inner"}
    assert Layout(2, 2).order == "dp-inner"


@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
def test_coords_and_rank_are_inverse_bijections(lay):
    assert lay.world_size == lay.pp * lay.dp
    coords = [lay.coords(r) for r in range(lay.world_size)]
    assert sorted(coords) == [(s, r) for s in range(lay.pp) for r in range(lay.dp)]
    for rank, (s, r) in enumerate(coords):
        assert lay.rank(s, r) == rank
    ranks = sorted(lay.rank(s, r) for s in range(lay.pp) for r in range(lay.dp))
    assert ranks == list(range(lay.world_size))


@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
def test_dp_groups(lay):
    seen = []
    for s in range(lay.pp):
        g = lay.dp_group(s)
        assert len(g) == lay.dp == len(set(g))
        assert all(lay.coords(x)[0] == s for x in g)  # one stage
        assert [lay.coords(x)[1] for x in g] == list(range(lay.dp))  # every replica, in order
        seen += g
    assert sorted(seen) == list(range(lay.world_size))  # the groups partition the world


@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
def test_p2p_pairs_cover_every_link_once(lay):
    pairs = lay.p2p_pairs()
    assert len(pairs) == len(set(pairs)) == lay.dp * (lay.pp - 1)
    expected = {(lay.rank(s, r), lay.rank(s + 1, r)) for s in range(lay.pp - 1) for r in range(lay.dp)}
    assert set(pairs) == expected
    for a, b in pairs:
        (sa, ra), (sb, rb) = lay.coords(a), lay.coords(b)
        assert ra == rb and sb == sa + 1
    assert pairs == lay.p2p_pairs()  # one fixed order


@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
def test_prev_and_next_rank(lay):
    for rank in range(lay.world_size):
        s, r = lay.coords(rank)
        nxt, prv = lay.next_rank(rank), lay.prev_rank(rank)
        if s == lay.pp - 1:
            assert nxt is None
        else:
            assert lay.coords(nxt) == (s + 1, r)
            assert (rank, nxt) in lay.p2p_pairs()
            assert lay.prev_rank(nxt) == rank
        if s == 0:
            assert prv is None
        else:
            assert lay.coords(prv) == (s - 1, r)
            assert (prv, rank) in lay.p2p_pairs()


@pytest.mark.parametrize("pp,dp", SHAPES)
def test_dp_inner_puts_replicas_of_a_stage_on_adjacent_ranks(pp, dp):
    lay = Layout(pp, dp, "dp-inner")
    for s in range(pp):
        assert lay.dp_group(s) == list(range(s * dp, (s + 1) * dp))


@pytest.mark.parametrize("pp,dp", SHAPES)
def test_pp_inner_puts_a_pipeline_on_adjacent_ranks(pp, dp):
    lay = Layout(pp, dp, "pp-inner")
    for r in range(dp):
        assert [lay.rank(s, r) for s in range(pp)] == list(range(r * pp, (r + 1) * pp))
    for a, b in lay.p2p_pairs():
        assert b == a + 1


def test_concrete_layouts():
    dpi, ppi = Layout(2, 3, "dp-inner"), Layout(2, 3, "pp-inner")
    assert [dpi.coords(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [ppi.coords(r) for r in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert dpi.dp_group(1) == [3, 4, 5]
    assert ppi.dp_group(1) == [1, 3, 5]
    assert dpi.p2p_pairs() == [(0, 3), (1, 4), (2, 5)]
    assert ppi.p2p_pairs() == [(0, 1), (2, 3), (4, 5)]


def test_single_stage_and_single_replica():
    lay = Layout(1, 4)
    assert lay.p2p_pairs() == []
    assert lay.dp_group(0) == [0, 1, 2, 3]
    assert all(lay.prev_rank(r) is None and lay.next_rank(r) is None for r in range(4))
    lay = Layout(4, 1, "pp-inner")
    assert [lay.dp_group(s) for s in range(4)] == [[0], [1], [2], [3]]
    assert lay.p2p_pairs() == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("pp,dp,fragment", [
    (0, 1, "pp and dp must be at least 1"),
    (1, 0, "pp and dp must be at least 1"),
    (-2, 2, "pp=-2"),
    (2, -1, "dp=-1"),
])
def test_invalid_sizes(pp, dp, fragment):
    with pytest.raises(UsageError, match=fragment):
        Layout(pp, dp)


@pytest.mark.parametrize("order", ["dp_inner", "PP-INNER", "", "data", "dp-blocks-0", "dp-blocks-", "tp-blocks-2"])
def test_invalid_order(order):
    with pytest.raises(UsageError, match="unknown rank order"):
        Layout(2, 2, order)


def test_blocks_generalise_both_orders():
    """K = dp is dp-inner and K = 1 is pp-inner; in between, a node of K x m ranks holds K
    replicas of m consecutive stages."""
    for pp, dp in [(2, 4), (4, 2), (3, 6)]:
        for k, same in ((dp, "dp-inner"), (1, "pp-inner")):
            a, b = Layout(pp, dp, f"dp-blocks-{k}"), Layout(pp, dp, same)
            assert [a.coords(r) for r in range(pp * dp)] == [b.coords(r) for r in range(pp * dp)]
        assert [Layout(pp, dp, f"pp-blocks-{pp}").coords(r) for r in range(pp * dp)] == \
            [Layout(pp, dp, "pp-inner").coords(r) for r in range(pp * dp)]
    mix = Layout(4, 4, "dp-blocks-2")
    assert [mix.coords(r) for r in range(8)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    assert mix.dp_group(0) == [0, 1, 8, 9]
    with pytest.raises(UsageError, match="3 does not divide dp=4"):
        Layout(2, 4, "dp-blocks-3")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("rank", [-1, 6, 100])
def test_coords_rejects_ranks_outside_the_world(order, rank):
    lay = Layout(2, 3, order)
    with pytest.raises(UsageError, match="outside a world of 6"):
        lay.coords(rank)
    with pytest.raises(UsageError):
        lay.next_rank(rank)
    with pytest.raises(UsageError):
        lay.prev_rank(rank)


def test_layout_is_a_frozen_value():
    a, b = Layout(2, 2, "pp-inner"), Layout(2, 2, "pp-inner")
    assert a == b and hash(a) == hash(b)
    assert a != Layout(2, 2, "dp-inner")
    with pytest.raises(AttributeError):
        a.pp = 3
