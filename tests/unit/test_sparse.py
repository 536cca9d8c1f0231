"""Sparse embedding-gradient exchange: the pure cost model, and the arguments refused before any collective."""

from __future__ import annotations

import math

import pytest
import torch

from trirace.policy.sparse import (METHODS, SPARSE_BYTE_COST, breakdown, choose, crossovers, estimate, expected_union, owner_of,
                                 owner_range)


def test_exchange_rejects_bad_arguments_before_any_collective():
    from trirace.runtime.sparse_exchange import exchange, touched_rows

    g = torch.zeros(10, 4)
    with pytest.raises(ValueError, match="unknown method"):
        exchange(g, None, "ring")
    with pytest.raises(ValueError, match="out must be"):
        exchange(g, None, "dense", out=torch.zeros(10, 5))
    with pytest.raises(ValueError, match=r"\[V, d\]"):
        exchange(torch.zeros(10), None, "dense")
    # Rows of a dense gradient, and of a fully sparse (2-sparse-dim) COO one, coalesced.
    g[[2, 7]] = 1.0
    for x in (g, g.to_sparse(), torch.sparse_coo_tensor(torch.tensor([[7, 2, 7]]), torch.ones(3, 4), (10, 4),
                                                             check_invariants=True)):
        idx, vals = touched_rows(x)
        assert idx.tolist() == [2, 7] and idx.dtype == torch.int64 and vals.shape == (2, 4)


def test_formulas_on_known_numbers():
    n, v, d, k, a, bw = 4, 1000, 10, 100, 1e-5, 1e9
    # By hand: dense ring 2(n-1)/n x v x d x 4 B = 60000 B; a record is d floats + an int64
    # index (48 B); allgather ships 3 counts (8 B) and 3 x k records to each worker.
    assert estimate("dense", n, v, d, k, alpha_s=a, bytes_per_s=bw) == pytest.approx((60000, 6 * a + 60000 / bw))
    ag = 14424
    rec = 48
    c3 = SPARSE_BYTE_COST  # the sparse methods' local work per shipped byte
    assert estimate("allgather", n, v, d, k, alpha_s=a, bytes_per_s=bw) == pytest.approx((ag, 6 * a + c3 * ag / bw))
    assert estimate("allgather", n, v, d, k, alpha_s=a, bytes_per_s=bw, sparse_byte_cost=1.0)[1] == \
        pytest.approx(6 * a + ag / bw)
    # Full overlap (union = k): 2 count exchanges + 3/4 k records out + 3 x k/4 records back.
    a2a = 7248  # 2 x 3 counts of 8 B, 3/4 of the k records out, 3 x 25 records back: 48 + 3600 + 3600
    c = breakdown("alltoall", n, v, d, k, alpha_s=a, bytes_per_s=bw, rows_union=k)
    assert (c.bytes_per_worker, c.seconds, c.collectives, c.latency_steps) == \
        pytest.approx((a2a, 12 * a + c3 * a2a / bw, 4, 12))
    # Default union: independent touches; imbalance scales the largest owner's share.
    u = expected_union(n, v, k)
    assert u == pytest.approx(1000 * (1 - 0.9 ** 4))
    assert estimate("alltoall", n, v, d, k)[0] == pytest.approx(48 + 0.75 * k * rec + 3 * u / 4 * rec)
    assert estimate("alltoall", n, v, d, k, rows_union=k, imbalance=2.0)[0] == pytest.approx(48 + 3600 + 3 * 50 * rec)
    # An owner never returns more than its range, however skewed.
    assert estimate("alltoall", n, v, d, v, imbalance=9.0)[0] == pytest.approx(48 + 0.75 * v * rec + 3 * 250 * rec)
    assert estimate("dense", 4, v, d, k, elem_bytes=2)[0] == 30000


def test_single_worker_and_bad_input():
    assert all(estimate(m, 1, 100, 8, 10) == (0, 0) for m in METHODS)
    assert choose(1, 100, 8, 10) == "dense"  # ties go to dense
    with pytest.raises(ValueError):
        estimate("ring", 4, 100, 8, 10)
    with pytest.raises(ValueError):
        estimate("dense", 0, 100, 8, 10)


@pytest.mark.parametrize("n,vocab,dim", [(4, 65536, 256), (8, 16384, 64), (2, 50000, 1024), (4, 1000, 4)])
def test_choose_goes_sparse_to_dense_once_as_density_rises(n, vocab, dim):
    ks = sorted({max(1, round(vocab * 10 ** (-6 + 6 * j / 200))) for j in range(201)})
    picks = [choose(n, vocab, dim, k) for k in ks]
    assert picks[0] != "dense" and picks[-1] == "dense"
    first_dense = picks.index("dense")
    assert set(picks[first_dense:]) == {"dense"}, "once dense, denser gradients must stay dense"
    for m in ("allgather", "alltoall"):
        b = [estimate(m, n, vocab, dim, k)[0] for k in ks]
        assert b == sorted(b), f"{m}'s bytes must grow with the touched rows"
    # crossovers() reports the same switch.
    xs = crossovers(n, vocab, dim)
    assert xs[0][1] == picks[0] and xs[-1][1] == "dense"


def test_choose_follows_the_latency_bandwidth_tradeoff():
    # With full overlap alltoall halves allgather's bytes at N=4: it wins while bytes
    # dominate, and loses its extra round trip's worth once latency does.
    assert choose(4, 65536, 256, 8192, alpha_s=0.0, rows_union=8192) == "alltoall"
    assert choose(4, 65536, 256, 8192, alpha_s=1.0, rows_union=8192) == "allgather"
    # A ring all-reduce pays as many hops as two all-gathers: at equal latency bytes decide.
    assert choose(4, 65536, 256, 64, alpha_s=1.0) == "allgather"
    assert choose(4, 65536, 256, 60000, alpha_s=1.0) == "dense"


def test_owner_of_contiguous_ranges():
    assert [owner_of(r, 4, 10) for r in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert owner_of(torch.arange(10), 4, 10).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    for n, v in [(4, 10), (4, 257), (3, 2), (8, 64)]:
        ranges = [owner_range(o, n, v) for o in range(n)]
        assert ranges[0][0] == 0 and ranges[-1][1] == v
        assert all(ranges[i][1] == ranges[i + 1][0] for i in range(n - 1))
        assert all(owner_of(r, n, v) == o for o, (lo, hi) in enumerate(ranges) for r in range(lo, hi))
        assert max(hi - lo for lo, hi in ranges) == math.ceil(v / n)
