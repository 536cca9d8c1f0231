"""Sparse embedding-gradient exchange: the pure cost model, and every method on a real
4-process gloo group (one set of processes runs all cases; the checks read its output)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from trirace.policy.sparse import METHODS, choose, estimate


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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
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


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], sys.argv[3])
