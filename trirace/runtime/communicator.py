"""Communicators: every op this runtime issues goes through here, so that it is logged and
its completion is real.

- `Communicator` wraps one process group under a name equal on all its members
  ("dp/s0", "fwd/0>2", "control"). Its ops return a `Handle`.
- `Handle.wait()` blocks the host until the ops are done. On gloo, Work.wait() already
  does; on NCCL it only orders the caller's stream, so the handle also records a CUDA
  event behind the op on a side stream and synchronises on it. Nothing is reported
  complete before it is.
- `CommLog` (`--comm-log DIR`) writes `DIR/rank-R.jsonl`: a format line, then one line per
  issued op, per host wait, and per event that only matters on a device (a compute
  action's kernels, a device-wide sync, a host read of a device value), in issue order
  across the rank's threads, which `trirace commcheck` replays under NCCL's rules. The
  runtime logs device events on CPU too, so a gloo run's log is what the NCCL run launches.
  Ops carry what equal byte counts hide: dtype, reduce op, broadcast source, all-to-all
  splits.
- `Waiter` reports completions to a callback from a thread of its own, so the thread that
  issued the op never blocks for bookkeeping.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


LOG_FORMAT = 2  # the first line of every log: {"format": 2}; commcheck refuses formats it does not know


class CommLog:
    """Issue order of one rank's ops, shared by all its threads (hence the lock)."""

    def __init__(self, path: Path | None, rank: int):
        self.rank = rank
        self._file = None
        self._lock = threading.Lock()
        self._seq = 0
        if path is not None:
            Path(path).mkdir(parents=True, exist_ok=True)
            self._file = open(Path(path) / f"rank-{rank}.jsonl", "w")
            self._file.write(json.dumps({"format": LOG_FORMAT}) + "\n")

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def _write(self, rows: list[dict], batch: bool = False) -> list[int]:
        thread = threading.current_thread().name
        with self._lock:
            seqs, first = [], self._seq
            for row in rows:
                row.update(seq=self._seq, rank=self.rank, thread=thread)
                if batch:  # ops issued together share the first one's seq as their batch id
                    row["batch"] = first
                seqs.append(self._seq)
                self._seq += 1
                self._file.write(json.dumps(row) + "\n")
        return seqs

    def issue(self, comm: "Communicator", ops: Sequence[tuple[str, int | None, int | None, dict]]) -> list[int]:
        """One batch of (op, peer, nbytes, metadata) on `comm`; returns their seqs."""
        if not self.enabled:
            return []
        where = {"host": True} if comm.host else {}  # commcheck places the others on the device
        rows = [{"comm": comm.name, "members": list(comm.members), "op": op, "peer": peer, "nbytes": nbytes, **meta,
                 **where} for op, peer, nbytes, meta in ops]
        return self._write(rows, batch=True)

    # A device runs these in its launch order with the communicators' kernels; on CPU they
    # cost nothing and are logged all the same, so the log is what a device would run.
    def compute(self, action: str) -> None:
        """The calling thread launched the kernels of compute `action` (one kernel to commcheck)."""
        if self.enabled:
            self._write([{"op": "compute", "action": action}])

    def host_read(self, where: str) -> None:
        """The calling thread reads a device value on the host (.item(), .tolist(), a size
        only the device knows), which waits for the compute it launched before."""
        if self.enabled:
            self._write([{"op": "host_read", "where": where}])

    def wait(self, seqs: Sequence[int]) -> None:
        """The calling thread has blocked until ops `seqs` completed."""
        if self.enabled and seqs:
            self._write([{"op": "wait", "waits": list(seqs)}])

    def close(self) -> None:
        if self._file is not None:
            with self._lock:
                self._file.close()
                self._file = None


class Handle:
    """Ops issued together on one communicator."""

    def __init__(self, comm: "Communicator", works: list, seqs: list[int]):
        self.comm, self.works, self.seqs = comm, works, seqs

    def wait(self, log: bool = True) -> None:
        """Block until every op is complete. `log=False` for bookkeeping threads, whose
        waits hold back no issuing thread."""
        if self.comm.device.type == "cuda":
            _cuda_complete(self.works, self.comm.device, self.comm.timeout)
        else:
            for w in self.works:
                w.wait(self.comm.timeout)
        if log:
            self.comm.log.wait(self.seqs)


_side = threading.local()


def _cuda_complete(works: list, device: torch.device, timeout: timedelta) -> None:
    # Work.wait() on NCCL makes the calling thread's current stream wait for the op. A
    # helper thread's current stream is the legacy default one, which is the compute
    # stream: waiting there would hold every kernel queued after it behind the transfer.
    # So every wait happens on a side stream of this thread, and the event behind it
    # follows the op alone. (A new thread's current CUDA device is 0: name the device.)
    with torch.cuda.device(device):
        streams = _side.__dict__.setdefault("streams", {})
        stream = streams.get(device) or streams.setdefault(device, torch.cuda.Stream(device))
        with torch.cuda.stream(stream):
            for w in works:
                w.wait(timeout)
            event = torch.cuda.Event()
            event.record(stream)
        event.synchronize()


class Communicator:
    """One process group, named identically on all its members. `host`: a gloo group on CPU
    tensors under every backend (control, norm), whose ops never run on the device."""

    def __init__(self, name: str, members: Sequence[int], group: dist.ProcessGroup | None,
                 device: torch.device, log: CommLog, timeout: timedelta, host: bool = False):
        self.name, self.members, self.group = name, tuple(members), group
        self.device, self.log, self.timeout, self.host = device, log, timeout, host

    @classmethod
    def plain(cls, group: dist.ProcessGroup | None, device: torch.device | None = None) -> "Communicator":
        """An unlogged communicator over an existing group (tests, benchmarks)."""
        ranks = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
        return cls("plain", sorted(ranks), group, device or torch.device("cpu"), CommLog(None, dist.get_rank()),
                   timedelta(minutes=30))

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def my_index(self) -> int:
        return dist.get_rank(self.group) if self.group is not None else dist.get_rank()

    # Logging happens before the call: an op that hangs inside torch is still in the log.
    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> Handle:
        seqs = self.log.issue(self, [("all_reduce", None, _nbytes(t), {"dtype": _dtype(t), "reduce_op": _op_name(op)})])
        return Handle(self, [dist.all_reduce(t, op=op, group=self.group, async_op=True)], seqs)

    def broadcast(self, t: torch.Tensor, src: int) -> Handle:
        seqs = self.log.issue(self, [("broadcast", None, _nbytes(t), {"dtype": _dtype(t), "src": src})])
        return Handle(self, [dist.broadcast(t, src=src, group=self.group, async_op=True)], seqs)

    def all_gather_into(self, out: torch.Tensor, t: torch.Tensor) -> Handle:
        seqs = self.log.issue(self, [("all_gather", None, _nbytes(t), {"dtype": _dtype(t)})])
        return Handle(self, [_all_gather_into(out, t, group=self.group, async_op=True)], seqs)

    def all_to_all_single(self, out: torch.Tensor, t: torch.Tensor, out_splits=None, in_splits=None) -> Handle:
        # Bytes differ per member by design (row counts); the agreed count comes first. The
        # splits (rows to and from each member, in group order) must agree pairwise.
        meta = {"dtype": _dtype(t), "send_splits": _splits(t, in_splits, self.size),
                "recv_splits": _splits(out, out_splits, self.size), "row_bytes": _row_bytes(t)} \
            if self.log.enabled else {}
        seqs = self.log.issue(self, [("all_to_all", None, None if in_splits else _nbytes(t), meta)])
        return Handle(self, [dist.all_to_all_single(out, t, out_splits, in_splits, group=self.group,
                                                    async_op=True)], seqs)

    def p2p(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Handle]:
        """One batch of ("send" | "recv", tensor, peer global rank), issued together (one
        NCCL group: one kernel); a handle per op. Where the backend fuses the batch into
        one work (NCCL), every op's handle waits for all of it."""
        seqs = self.log.issue(self, [(kind, peer, _nbytes(t), {"dtype": _dtype(t)}) for kind, t, peer in ops])
        p2p_ops = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, peer, self.group)
                   for kind, t, peer in ops]
        works = list(dist.batch_isend_irecv(p2p_ops))
        if len(works) != len(ops):
            return [Handle(self, works, seqs) for _ in ops]
        return [Handle(self, [w], seqs[i:i + 1] if seqs else []) for i, w in enumerate(works)]

    def barrier(self) -> None:
        # An all-reduce of one element is a barrier on every backend, with a timeout.
        self.all_reduce(torch.zeros(1, device=self.device)).wait()

    # Object collectives are synchronous; their byte counts are not known on every member.
    def broadcast_object(self, box: list, src: int) -> None:
        seqs = self.log.issue(self, [("broadcast_object", None, None, {})])
        dist.broadcast_object_list(box, src=src, group=self.group)
        self.log.wait(seqs)

    def all_gather_object(self, out: list, obj) -> None:
        seqs = self.log.issue(self, [("all_gather_object", None, None, {})])
        dist.all_gather_object(out, obj, group=self.group)
        self.log.wait(seqs)

    def gather_object(self, obj, out: list | None, dst: int) -> None:
        seqs = self.log.issue(self, [("gather_object", None, None, {})])
        dist.gather_object(obj, out, dst=dst, group=self.group)
        self.log.wait(seqs)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _op_name(op) -> str:
    return str(getattr(op, "name", op)).lower()


def _row_bytes(t: torch.Tensor) -> int:
    return _nbytes(t) // t.shape[0] if t.dim() and t.shape[0] else t.element_size()


def _splits(t: torch.Tensor, splits, n: int) -> list[int]:
    """Rows per member: the given splits, or the even split all_to_all_single makes without them."""
    if splits:
        return [int(x) for x in splits]
    rows = t.shape[0] if t.dim() else 1
    return [rows // n] * n


# all_gather_into_tensor was renamed all_gather_single (and deprecated) in recent torch.
_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Waiter(threading.Thread):
    """Waits on handles in the order given and reports each completion. Handles of one
    communicator complete in issue order under NCCL, so one waiter per communicator loses
    nothing; under gloo a later op that finished first is reported a little late, never
    early. A thread blocked in wait() (outside the GIL) is the event-driven equivalent of a
    callback, which gloo's P2P Work does not offer."""

    def __init__(self, name: str):
        super().__init__(name=name, daemon=True)
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.start()

    def add(self, handle: Handle, done: Callable[[], None], keep: object = None) -> None:
        self.q.put((handle, done, keep))  # `keep` (a tensor in flight) lives until completion

    def run(self) -> None:
        while (item := self.q.get()) is not None:
            handle, done, _keep = item
            try:
                handle.wait(log=False)
            except BaseException as e:  # noqa: BLE001 - surfaced by close()
                self.error = self.error or e
            try:
                done()  # always: it releases a link or a chunk, which would otherwise be held forever
            except BaseException as e:  # noqa: BLE001
                self.error = self.error or e

    def close(self) -> None:
        self.q.put(None)
        self.join()
        if self.error is not None:
            raise RuntimeError(f"{self.name}: a transfer failed") from self.error
