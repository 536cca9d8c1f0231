"""Summing sparse embedding gradients across a data-parallel group, from dense collectives.

NCCL has no sparse all-reduce, so each method is built from collectives gloo and NCCL both
have: all_reduce, all_gather into one tensor, all_to_all_single with split sizes. Every
size that shapes a collective (padding, splits, the method itself) comes from values the
whole group has exchanged first, never from a local measurement, so all members issue the
same collectives in the same order.

Touched rows travel as records: the int64 index and the row's bytes side by side in one
uint8 row, so a phase costs one collective rather than one for indices and one for values.

Every read of a device value on the host (a count, a split, `nonzero`'s size) is logged
as a host read: on a device each one waits for the work queued before it.

Bytes reported are what this rank puts on the wire under ring / pairwise algorithms
(padding included): all_gather sends N-1 blocks, all_to_all every block not addressed to
itself, ring all-reduce 2(N-1)/N of the buffer.
"""

from __future__ import annotations

from collections.abc import Generator

import torch
import torch.distributed as dist

from ..policy.sparse import ALPHA_S, BYTES_PER_S, INDEX_BYTES, METHODS, choose, owner_of, owner_range
from .communicator import Communicator, Handle


Phases = Generator[Handle, None, tuple[torch.Tensor, dict]]


def exchange(grad: torch.Tensor, group: Communicator | dist.ProcessGroup | None = None, method: str = "auto", *,
             out: torch.Tensor | None = None, alpha_s: float = ALPHA_S, bytes_per_s: float = BYTES_PER_S
             ) -> tuple[torch.Tensor, dict]:
    """Sum `grad` (this replica's [V, d] embedding gradient: sparse COO as
    nn.Embedding(sparse=True) makes it, or dense) over `group`. Returns the dense [V, d]
    sum, identical on every rank of the group, and {"method", "bytes_sent", "rows"}.

    `out`: a contiguous [V, d] buffer to write the sum into (it may be `grad` itself when
    `grad` is dense); reusing one across steps saves allocating, and page-faulting, a whole
    table per call. `alpha_s` / `bytes_per_s` parameterise the cost model "auto" uses; like
    `method`, they must be the same on every rank of the group. `group` is a Communicator
    (each collective is then logged) or a plain process group (None: the world)."""
    return run(phases(grad, group, method, out=out, alpha_s=alpha_s, bytes_per_s=bytes_per_s))


def run(steps: Phases) -> tuple[torch.Tensor, dict]:
    """Drive an exchange's phases to the end here, waiting for each collective in turn."""
    try:
        handle = next(steps)
        while True:
            handle.wait()
            handle = steps.send(None)
    except StopIteration as done:
        return done.value


def phases(grad: torch.Tensor, group: Communicator | dist.ProcessGroup | None = None, method: str = "auto", *,
           out: torch.Tensor | None = None, alpha_s: float = ALPHA_S, bytes_per_s: float = BYTES_PER_S) -> Phases:
    """`exchange` as a generator: it launches one collective at a time and yields its
    handle; the caller waits for it (where and when it likes, the same on every rank) and
    resumes the generator, which reads what arrived and launches the next. It returns what
    `exchange` returns. So the runtime spreads an exchange over the units of a step, one
    collective per unit, instead of holding its engine until the last one lands."""
    if grad.dim() != 2:
        raise ValueError(f"expected a [V, d] gradient, got shape {tuple(grad.shape)}")
    if method not in (*METHODS, "auto"):
        raise ValueError(f"unknown method {method!r}; expected one of {(*METHODS, 'auto')}")
    vocab, dim = grad.shape
    if out is None:
        out = torch.zeros(vocab, dim, dtype=grad.dtype, device=grad.device)
    elif out.shape != grad.shape or out.dtype != grad.dtype or out.device != grad.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {tuple(grad.shape)} {grad.dtype} tensor on {grad.device}")
    return _phases(grad, group, method, out, alpha_s, bytes_per_s)


def _phases(grad: torch.Tensor, group: Communicator | dist.ProcessGroup | None, method: str, out: torch.Tensor,
            alpha_s: float, bytes_per_s: float) -> Phases:
    vocab, dim = grad.shape
    comm = group if isinstance(group, Communicator) else Communicator.plain(group, grad.device)
    n, rank = comm.size, comm.my_index
    if method == "dense" and not grad.is_sparse:  # only the count is wanted: copy no rows
        idx: torch.Tensor | None = None
        vals: torch.Tensor | None = None
        comm.log.host_read("sparse exchange: count of touched rows")
        k = int(grad.ne(0).any(dim=1).sum())
    else:  # rows are taken (copied, for a dense grad) before `out` is written: it may alias grad
        comm.log.host_read("sparse exchange: touched rows (nonzero)")
        idx, vals = touched_rows(grad)
        k = idx.numel()
    sent = 0
    counts: list[int] | None = None
    if method == "auto":
        # Every rank's row count: the largest picks the method, and allgather pads to it.
        if n > 1:
            counts = yield from _gather_counts(k, comm, n, grad.device)
            sent += (n - 1) * INDEX_BYTES
        method = choose(n, vocab, dim, max(counts or [k]), elem_bytes=grad.element_size(),
                        alpha_s=alpha_s, bytes_per_s=bytes_per_s)
    if n == 1 or method == "dense":
        if grad.is_sparse:
            out.zero_()
            out.index_copy_(0, idx, vals)
        elif out is not grad:
            out.copy_(grad)
        if n > 1:
            yield comm.all_reduce(out)
            sent += _all_reduce_bytes(out, n)
    elif method == "allgather":
        assert idx is not None and vals is not None
        sent += yield from _allgather(idx, vals, out, comm, n, counts)
    else:
        assert idx is not None and vals is not None
        sent += yield from _alltoall(idx, vals, out, comm, n, rank)
    return out, {"method": method, "bytes_sent": sent, "rows": k}


def touched_rows(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted unique int64 row indices [k], their values [k, d]) of a [V, d] gradient.
    Sparse: coalesced (duplicates summed). Dense: the rows with any non-zero entry."""
    if grad.is_sparse:
        g = grad.coalesce()
        if g.sparse_dim() == 1:
            return g.indices()[0].to(torch.int64).contiguous(), g.values().contiguous()
        grad = g.to_dense()  # fully sparse [V, d]: row structure only via the dense form
    idx = grad.ne(0).any(dim=1).nonzero().squeeze(1)
    return idx, grad.index_select(0, idx)


def _all_reduce_bytes(t: torch.Tensor, n: int) -> int:
    return 2 * (n - 1) * t.numel() * t.element_size() // n


def _pack(idx: torch.Tensor, vals: torch.Tensor, out: torch.Tensor) -> None:
    """Write records (index bytes | row bytes) into the first len(idx) rows of `out`."""
    k = idx.numel()
    if k:
        out[:k, :INDEX_BYTES] = idx.view(torch.uint8).view(k, INDEX_BYTES)
        out[:k, INDEX_BYTES:] = vals.view(torch.uint8).view(k, -1)


def _unpack(rec: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, values) of a record buffer: strided views when records are 8-byte
    aligned (no copy), otherwise copies (int64 / dtype views need aligned addresses)."""
    i, v = rec[:, :INDEX_BYTES], rec[:, INDEX_BYTES:]
    if rec.stride(0) % INDEX_BYTES or rec.storage_offset() % INDEX_BYTES:
        i, v = i.clone(), v.clone()
    return i.view(torch.int64).view(-1), v.view(dtype)


def _records(rows: int, vals: torch.Tensor) -> torch.Tensor:
    return torch.empty(rows, INDEX_BYTES + vals.shape[1] * vals.element_size(), dtype=torch.uint8,
                       device=vals.device)


def _gather_counts(count: int, comm: Communicator, n: int, device: torch.device
                   ) -> Generator[Handle, None, list[int]]:
    out = torch.empty(n, dtype=torch.int64, device=device)
    yield comm.all_gather_into(out, torch.tensor([count], dtype=torch.int64, device=device))
    comm.log.host_read("sparse exchange: gathered row counts .tolist()")
    return out.tolist()


def _gather_records(idx: torch.Tensor, vals: torch.Tensor, comm: Communicator, n: int,
                    counts: list[int] | None = None
                    ) -> Generator[Handle, None, tuple[list[tuple[torch.Tensor, torch.Tensor]], int]]:
    """All-gather every rank's (idx, vals), padded to the largest count (agreed first,
    unless `counts` already holds every rank's). Returns per-rank (idx, vals) in rank
    order, and the bytes this rank sent."""
    sent = 0
    if counts is None:
        counts = yield from _gather_counts(idx.numel(), comm, n, vals.device)
        sent += (n - 1) * INDEX_BYTES
    kmax = max(counts)
    if kmax == 0:  # known to every rank: all skip the data collective together
        return [(idx, vals)] * n, sent
    rec = _records(kmax, vals)
    _pack(idx, vals, rec)
    rec[idx.numel():].zero_()  # padding is never read, but ship no stale memory
    got = _records(n * kmax, vals)
    yield comm.all_gather_into(got, rec)
    gi, gv = _unpack(got, vals.dtype)
    return [(gi[r * kmax:r * kmax + c], gv[r * kmax:r * kmax + c]) for r, c in enumerate(counts)], \
        sent + (n - 1) * rec.numel()


def _allgather(idx: torch.Tensor, vals: torch.Tensor, out: torch.Tensor, comm: Communicator, n: int,
               counts: list[int] | None) -> Generator[Handle, None, int]:
    parts, sent = yield from _gather_records(idx, vals, comm, n, counts)
    _sum_rows(out, parts)
    return sent


def _sum_rows(out: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    out.zero_()
    # One index_add per source rank, in rank order: indices are unique within a source (no
    # atomics race on GPUs) and every rank does the same additions in the same order, so
    # the results are bitwise identical across ranks.
    for i, v in parts:
        out.index_add_(0, i, v)


def local_passes(grad: torch.Tensor, out: torch.Tensor, n: int) -> None:
    """An exchange's work on a rank's own memory, without its collectives: find the touched
    rows of `grad`, then zero `out` and add `n` sources' rows, as the allgather method does
    (here all `n` are this rank's). `trirace profile` times it (calibrate/layers.py): on
    shared cores the passes over a whole [V, d] table are a step's cost the bytes do not show."""
    idx, vals = touched_rows(grad)
    _sum_rows(out, [(idx, vals)] * n)


def _alltoall(idx: torch.Tensor, vals: torch.Tensor, out: torch.Tensor, comm: Communicator, n: int,
              rank: int) -> Generator[Handle, None, int]:
    vocab, dev, rec_bytes = out.shape[0], vals.device, INDEX_BYTES + vals.shape[1] * vals.element_size()
    # Rows are sorted and owners hold contiguous ranges: the records split in owner order.
    send = torch.bincount(owner_of(idx, n, vocab), minlength=n)
    recv = torch.empty_like(send)
    yield comm.all_to_all_single(recv, send)
    comm.log.host_read("sparse exchange: all-to-all splits .tolist()")
    send_l, recv_l = send.tolist(), recv.tolist()
    sent = (n - 1) * INDEX_BYTES + (idx.numel() - send_l[rank]) * rec_bytes
    rec = _records(idx.numel(), vals)
    _pack(idx, vals, rec)
    got = _records(sum(recv_l), vals)
    yield comm.all_to_all_single(got, rec, recv_l, send_l)
    gi, gv = _unpack(got, vals.dtype)
    # The owner sums its rows straight into its slice of `out`, sources in rank order: it
    # is the only adder, so the order is fixed and the others copy its bits.
    out.zero_()
    lo, hi = owner_range(rank, n, vocab)
    acc = out[lo:hi]
    touched = torch.zeros(hi - lo, dtype=torch.bool, device=dev)
    off = 0
    for c in recv_l:
        acc.index_add_(0, gi[off:off + c] - lo, gv[off:off + c])
        off += c
    touched[gi - lo] = True
    comm.log.host_read("sparse exchange: owned rows (nonzero)")
    mine = touched.nonzero().squeeze(1)
    # Share the reduced rows back: each owner's rows once, padded to the largest owner's.
    parts, b = yield from _gather_records(mine + lo, acc.index_select(0, mine), comm, n)
    for r, (i, v) in enumerate(parts):
        if r != rank:  # its own rows are in place already
            out.index_copy_(0, i, v)
    return sent + b
