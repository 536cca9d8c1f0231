"""Cost model for exchanging sparse embedding gradients across data-parallel replicas.

Pure: no torch.distributed. The executor (runtime/sparse_exchange.py) feeds it only values
every member of the group shares (the all-reduced maximum touched-row count), so every rank
reaches the same decision and issues the same collectives.

Notation: N workers, V rows of width d, k rows touched on a replica (the maximum over
replicas: every padded buffer is sized by it), e value bytes, i index bytes (int64: 8),
R = d*e + i bytes per shipped (index, row) record.

Alpha-beta model: seconds = latency_steps * alpha + c * bytes / bandwidth (c = 1 for dense,
SPARSE_BYTE_COST for the sparse methods' local work per byte), with a ring /
pairwise collective over N workers taking N-1 latency steps (ring all-reduce: 2(N-1)).
Bytes are what one worker puts on the wire.

  dense      ring all-reduce of the table:
             bytes = 2(N-1)/N * V*d*e                                  steps = 2(N-1)
  allgather  all_gather counts (one int64), then padded records:
             bytes = (N-1)*i + (N-1)*k*R                               steps = 2(N-1)
  alltoall   all_to_all counts, all_to_all records to their row owners, owners sum, then
             all_gather the owners' counts and their padded reduced rows:
             bytes = (N-1)*i + (N-1)/N*k*R + (N-1)*i + (N-1)*u*R       steps = 4(N-1)
             u = min(ceil(V/N), imbalance * U/N): the largest owner's reduced rows, U the
             rows touched by any replica. U defaults to independent uniform touches,
             U = V*(1 - (1 - k/V)^N) (about N*k when sparse: no overlap, the pessimistic
             case for alltoall); with full overlap (U = k) alltoall moves about
             2(N-1)/N * k*R, half of allgather at N=4, for two extra collectives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

METHODS = ("dense", "allgather", "alltoall")

# A 100 Gb/s link with 10 us per hop; callers with measurements pass their own.
ALPHA_S = 10e-6
BYTES_PER_S = 12.5e9
INDEX_BYTES = 8
# Local work per byte a sparse method ships (packing, padding, scatter-add, and gloo's
# all_gather/all_to_all being slower per byte than its all-reduce), relative to one byte of
# a dense all-reduce: the sparse benchmark (python -m trirace.bench.sparse; report in
# docs/benchmarks/) finds a byte of allgather costs about three bytes of dense all-reduce.
SPARSE_BYTE_COST = 3.0

T = TypeVar("T")


@dataclass(frozen=True)
class SparseCost:
    """The model's estimate for one method: what one worker sends and how long it takes."""

    method: str
    bytes_per_worker: float
    seconds: float
    collectives: int  # collective calls issued
    latency_steps: int  # hops paid for in alpha


def breakdown(method: str, n_workers: int, vocab: int, dim: int, rows_touched: int, elem_bytes: int = 4,
              alpha_s: float = ALPHA_S, bytes_per_s: float = BYTES_PER_S, index_bytes: int = INDEX_BYTES,
              rows_union: float | None = None, imbalance: float = 1.0,
              sparse_byte_cost: float = SPARSE_BYTE_COST) -> SparseCost:
    """The model's cost of `method` (formulas in the module docstring)."""
    n, v, d, k = n_workers, vocab, dim, min(rows_touched, vocab)
    if n < 1 or v < 1 or d < 1 or k < 0:
        raise ValueError(f"bad sizes: n_workers={n} vocab={v} dim={d} rows_touched={rows_touched}")
    rec = d * elem_bytes + index_bytes
    if method == "dense":
        nbytes, colls, steps = 2 * (n - 1) / n * v * d * elem_bytes, 1, 2 * (n - 1)
    elif method == "allgather":
        nbytes, colls, steps = (n - 1) * index_bytes + (n - 1) * k * rec, 2, 2 * (n - 1)
    elif method == "alltoall":
        union = expected_union(n, v, k) if rows_union is None else min(float(rows_union), v)
        per_owner = min(math.ceil(v / n), imbalance * union / n)
        nbytes = 2 * (n - 1) * index_bytes + (n - 1) / n * k * rec + (n - 1) * per_owner * rec
        colls, steps = 4, 4 * (n - 1)
    else:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    per_byte = 1.0 if method == "dense" else sparse_byte_cost
    return SparseCost(method, nbytes, steps * alpha_s + per_byte * nbytes / bytes_per_s, colls, steps)


def estimate(method: str, n_workers: int, vocab: int, dim: int, rows_touched: int, elem_bytes: int = 4,
             alpha_s: float = ALPHA_S, bytes_per_s: float = BYTES_PER_S, **kw: float) -> tuple[float, float]:
    """(bytes on the wire per worker, seconds) for `method`; `kw` as in `breakdown`."""
    c = breakdown(method, n_workers, vocab, dim, rows_touched, elem_bytes, alpha_s, bytes_per_s, **kw)
    return c.bytes_per_worker, c.seconds


def choose(n_workers: int, vocab: int, dim: int, rows_touched_max: int, elem_bytes: int = 4,
           alpha_s: float = ALPHA_S, bytes_per_s: float = BYTES_PER_S, methods: tuple[str, ...] = METHODS,
           **kw: float) -> str:
    """The cheapest method by the model. Ties go to the earlier of `methods` (dense first:
    the simplest), so equal inputs give the same answer on every rank."""
    secs = [estimate(m, n_workers, vocab, dim, rows_touched_max, elem_bytes, alpha_s, bytes_per_s, **kw)[1]
            for m in methods]
    return methods[min(range(len(methods)), key=secs.__getitem__)]


def expected_rows(vocab: int, tokens: int, zipf_s: float = 1.0) -> float:
    """Distinct ids among `tokens` draws from a Zipf(s) vocabulary, the shape of real text
    (used when no calibration measured the training data)."""
    import numpy as np

    p = 1.0 / np.arange(1, vocab + 1) ** zipf_s
    p /= p.sum()
    return float(np.sum(-np.expm1(tokens * np.log1p(-p))))


def expected_union(n_workers: int, vocab: int, rows_touched: int) -> float:
    """Rows touched by any of N replicas that each touch `rows_touched` uniformly at random."""
    if vocab <= 0:
        return 0.0
    return vocab * (1.0 - (1.0 - min(rows_touched, vocab) / vocab) ** n_workers)


def rows_per_owner(n_workers: int, vocab: int) -> int:
    """Rows in each owner's contiguous range (the last may hold fewer, or none)."""
    return max(1, math.ceil(vocab / n_workers))


def owner_range(owner: int, n_workers: int, vocab: int) -> tuple[int, int]:
    """[lo, hi) of the rows `owner` reduces."""
    chunk = rows_per_owner(n_workers, vocab)
    lo = min(owner * chunk, vocab)
    return lo, min(lo + chunk, vocab)


def owner_of(rows: T, n_workers: int, vocab: int) -> T:
    """Owner of each row (an int, or an integer array/tensor elementwise): contiguous
    ranges of ceil(V/N) rows, so sorted rows split into one slice per owner."""
    return rows // rows_per_owner(n_workers, vocab)  # type: ignore[operator]


def crossovers(n_workers: int, vocab: int, dim: int, points: int = 4000, **kw: float) -> list[tuple[float, str]]:
    """Densities at which `choose` changes its answer, scanning k = 1..V on a log grid:
    [(first density, method from there on), ...]."""
    ks = sorted({max(1, round(vocab ** (j / (points - 1)))) for j in range(points)})
    out: list[tuple[float, str]] = []
    for k in ks:
        m = choose(n_workers, vocab, dim, k, **kw)
        if not out or out[-1][1] != m:
            out.append((k / vocab, m))
    return out
