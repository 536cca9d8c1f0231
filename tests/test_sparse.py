"""Sparse embedding-gradient exchange: the pure cost model, and every method on a real
4-process gloo group (one set of processes runs all cases; the checks read its output)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from trirace.policy.sparse import (METHODS, SPARSE_BYTE_COST, breakdown, choose, crossovers, estimate, expected_union, owner_of,
                                 owner_range)

WORLD = 4
ALL = (*METHODS, "auto")

# name -> (vocab, dim, dtype, input kind, rows drawn per rank, group members)
# Draws for "coo" kinds are with replacement (duplicates to coalesce); "dense" kinds touch
# that many distinct rows. Vocab 257 / 97 do not split evenly over 4 owners; d=3 makes
# records whose size is not a multiple of 8 (alignment of the unpacked int64 / floats).
CASES: dict[str, tuple[int, int, torch.dtype, str, tuple[int, ...], tuple[int, ...]]] = {
    "coo": (257, 8, torch.float32, "coo", (0, 3, 40, 300), (0, 1, 2, 3)),
    "dense_d3": (100, 3, torch.float32, "dense", (10, 0, 60, 5), (0, 1, 2, 3)),
    "f64": (50, 5, torch.float64, "coo", (1, 20, 0, 9), (0, 1, 2, 3)),
    "empty": (40, 4, torch.float32, "coo", (0, 0, 0, 0), (0, 1, 2, 3)),
    "subgroup": (97, 6, torch.float32, "coo", (0, 0, 11, 30), (1, 2, 3)),
    "auto_high": (16384, 8, torch.float32, "dense", (16384,) * 4, (0, 1, 2, 3)),
    "auto_low": (4096, 64, torch.float32, "coo", (4, 4, 4, 4), (0, 1, 2, 3)),
}


def make_grad(case: str, rank: int) -> torch.Tensor:
    """The deterministic local gradient of `rank` in `case` (rebuilt by the checks)."""
    vocab, dim, dtype, kind, draws, _ = CASES[case]
    g = torch.Generator().manual_seed(1000 * list(CASES).index(case) + rank)
    k = draws[rank]
    if kind == "coo":
        idx = torch.randint(0, vocab, (k,), generator=g)
        vals = torch.randn(k, dim, generator=g, dtype=torch.float64).to(dtype)
        return torch.sparse_coo_tensor(idx[None], vals, (vocab, dim), check_invariants=True)  # uncoalesced
    out = torch.zeros(vocab, dim, dtype=dtype)
    rows = torch.randperm(vocab, generator=g)[:k]
    out[rows] = torch.randn(k, dim, generator=g, dtype=torch.float64).to(dtype)
    return out


def touched(grad: torch.Tensor) -> int:
    return grad.coalesce().indices().shape[1] if grad.is_sparse else int(grad.ne(0).any(1).sum())


# ---------------------------------------------------------------- worker (a subprocess)

def _worker(rank: int, store_path: str, out: str) -> None:
    import torch.distributed as dist

    from trirace.runtime.sparse_exchange import exchange

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    results: dict = {}
    try:
        groups = {members: (None if len(members) == WORLD else dist.new_group(list(members)))
                  for members in {c[5] for c in CASES.values()}}  # every rank creates every group
        for case, (*_, members) in CASES.items():
            if rank not in members:
                continue
            grad = make_grad(case, rank)
            before = grad.to_dense().clone()
            for method in ALL:
                res, stats = exchange(grad, groups[members], method)
                assert torch.equal(grad.to_dense(), before), f"{case}/{method} modified its input"
                results[(case, method)] = (res, stats)
                # Into a dirty buffer, and in place over a dense gradient: the same bits.
                buf = torch.full_like(before, 7.0)
                ok = exchange(grad, groups[members], method, out=buf)[0] is buf and torch.equal(buf, res)
                if not grad.is_sparse:
                    mine = grad.clone()
                    ok &= torch.equal(exchange(mine, groups[members], method, out=mine)[0], res)
                results[(case, method, "out")] = ok
    finally:
        dist.destroy_process_group()
    torch.save(results, out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("sparse")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(tmp / "store"), str(tmp / f"r{r}.pt")],
                              env=env) for r in range(WORLD)]
    try:
        for p in procs:
            assert p.wait(timeout=150) == 0, "a rank failed (its traceback is above)"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [torch.load(tmp / f"r{r}.pt") for r in range(WORLD)]


# ---------------------------------------------------------------- distributed checks

def _reference(case: str) -> torch.Tensor:
    return sum(make_grad(case, r).to_dense().double() for r in CASES[case][5])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", ALL)
def test_sum_matches_reference_and_ranks_agree(runs, case, method):
    ref = _reference(case)
    members = CASES[case][5]
    first, _ = runs[members[0]][(case, method)]
    scale = max(float(ref.abs().max()), 1.0)
    assert first.shape == ref.shape and first.dtype == CASES[case][2] and first.layout == torch.strided
    torch.testing.assert_close(first.double(), ref, rtol=1e-6, atol=1e-6 * scale)
    dense, _ = runs[members[0]][(case, "dense")]
    torch.testing.assert_close(first, dense, rtol=1e-6, atol=1e-6 * scale)
    for r in members[1:]:
        res, stats = runs[r][(case, method)]
        assert torch.equal(res, first), f"rank {r} differs from rank {members[0]}"
        assert stats["method"] == runs[members[0]][(case, method)][1]["method"]
    assert all(runs[r][(case, method, "out")] for r in members)


@pytest.mark.parametrize("case", list(CASES))
def test_stats(runs, case):
    vocab, dim, dtype, *_, members = CASES[case]
    n, e = len(members), torch.empty((), dtype=dtype).element_size()
    rows = [touched(make_grad(case, r)) for r in members]
    for r, k in zip(members, rows):
        stats = {m: runs[r][(case, m)][1] for m in ALL}
        assert all(s["rows"] == k for s in stats.values())
        assert stats["dense"] == {"method": "dense", "bytes_sent": 2 * (n - 1) * vocab * dim * e // n, "rows": k}
        padded = (n - 1) * max(rows) * (8 + dim * e)
        assert stats["allgather"]["bytes_sent"] == (n - 1) * 8 + padded
        assert stats["alltoall"]["method"] == "alltoall" and stats["alltoall"]["bytes_sent"] >= 2 * (n - 1) * 8
        assert stats["auto"]["method"] == choose(n, vocab, dim, max(rows), elem_bytes=e)


def test_auto_picks_dense_when_dense_and_sparse_when_sparse(runs):
    for r in range(WORLD):
        assert runs[r][("auto_high", "auto")][1]["method"] == "dense"
        assert runs[r][("auto_low", "auto")][1]["method"] in ("allgather", "alltoall")
    # The model's margin in those cases is wide, not a coin toss.
    # Every row touched, d=8: dense is cheapest (no indices, one collective).
    hi = {m: estimate(m, WORLD, 16384, 8, 16384)[1] for m in METHODS}
    lo = {m: estimate(m, WORLD, 4096, 64, 4)[1] for m in METHODS}
    assert hi["dense"] * 1.5 < min(hi["allgather"], hi["alltoall"])
    assert min(lo["allgather"], lo["alltoall"]) * 1.5 < lo["dense"]


def test_alltoall_ships_fewer_bytes_than_allgather_when_rows_overlap(runs):
    # auto_high: every rank touches every row, so owners' reduced rows are V/N each.
    s = runs[0][("auto_high", "alltoall")][1]["bytes_sent"]
    assert s < runs[0][("auto_high", "allgather")][1]["bytes_sent"] / 1.9


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


def test_the_local_passes_profile_times_are_the_allgather_methods_own():
    from trirace.calibrate.layers import sparse_local_s
    from trirace.runtime.sparse_exchange import local_passes
    from trirace.config import make_config

    g = torch.zeros(50, 8)
    g[[3, 9, 40]] = torch.randn(3, 8)
    before = g.clone()
    out = torch.full_like(g, 7.0)  # stale values: the passes zero it first
    local_passes(g, out, 3)
    assert torch.equal(out, 3 * g) and torch.equal(g, before)  # n sources' rows summed, grad untouched
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "data": "synthetic"})
    assert 0 < sparse_local_s(cfg, 300) < 1.0
    # measured with two replicas' rows even for a job without replicas: a sweep prices other layouts from it
    assert 0 < sparse_local_s(cfg.with_(dp=1), 300) < 1.0


# ---------------------------------------------------------------- the pure cost model

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


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], sys.argv[3])
