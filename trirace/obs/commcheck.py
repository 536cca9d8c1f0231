"""Replay every rank's communication log under NCCL's rules and report what would hang or
disagree, without a GPU and without rerunning the job.

Each rank writes `DIR/rank-R.jsonl` (see `trirace.runtime.communicator.CommLog`): a line
`{"format": 2}` (a log without it is format 1, which has no device events), then one
JSON object per line in the order the rank created them:

- an issue event hands an op ("send", "recv" or any collective) to a communicator; ops
  issued together by batch_isend_irecv share a `batch` id. Ops may carry `dtype`,
  `reduce_op`, `src` (broadcast), `send_splits` / `recv_splits` / `row_bytes`
  (all-to-all), and `host` for a gloo communicator on CPU tensors under any backend;
- a wait event (`"op": "wait"`) blocks its thread until the listed ops completed;
- device events: `compute` (a compute action's kernels, named by `action`), `sync` (a
  device-wide synchronize) and `host_read` (a device value read on the host).
Any may carry `after`: events of other threads of the rank that must have been passed.

Matching is static (ordinal): the n-th send from a to b on a communicator meets the n-th
recv at b from a, and the k-th collective of every member of a communicator forms one
instance. Sizes, op names, dtypes, reduce ops, broadcast sources and all-to-all splits
that disagree are found before the replay, even behind a deadlock.

Two models replay the logs (`--model`):

- `streams`: each (rank, communicator) is one in-order stream, and only its head batch
  (the earliest with an incomplete op) makes progress; a batch joins its stream once
  fully issued. A P2P pair completes when both ops are in the head batches of their
  streams, a collective when it is in every member's. Device events have no effect. This
  is what gloo and NCCL promise per communicator, and nothing about the device.
- `strict` (the default): each rank's device runs one kernel at a time, in launch order
  across all its device communicators and its compute. A batch is one kernel, a compute
  event is one kernel; an op completes when its kernel is at the head of its device and
  its partners' kernels are at the heads of theirs, and a kernel completes when all its
  ops have. `host` communicators keep their own in-order streams. A `sync` blocks its
  thread until every kernel the rank launched before it completed; a `host_read` until
  the compute kernels its thread launched before it completed; a wait until its ops did.
  A blocked thread launches nothing. Threads of a rank launch in the logged order; a
  thread blocked where the log shows it going on (gloo let it) stops holding back the
  rank's other threads once nothing else can progress, as on a device they would launch
  ahead of it. A deadlock is reported as the chain of waits it follows, naming the ranks
  whose launches close the cycle.

The replay is event-driven: a thread blocked on an event registers with it and is woken
only when that event passes or completes, so each event is examined a bounded number of
times (the strict model re-examines a rank's threads once per round in which every
thread waits, at most once per event that leaves the logged order). Under `streams` the
system is monotone (nothing that could complete becomes unable to), so the final state,
and hence the report, does not depend on the order of work; under `strict` the launch
order is the logged one wherever the model lets it be.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

P2P = ("send", "recv")
WAIT = "wait"
DEVICE_EVENTS = ("compute", "sync", "host_read")
FORMATS = (1, 2)  # the log formats this replay reads (communicator.LOG_FORMAT writes the newest)
MODELS = ("strict", "streams")
DEVICE = "the device"  # the stream name of a rank's device under the strict model
MAX_LISTED = 50  # findings of one kind kept in a report; the rest are counted
_RANK_FILE = re.compile(r"rank-(0|[1-9][0-9]*)\.jsonl")


@dataclass
class Finding:
    kind: str  # "format" | "malformed" | "threads" | "mismatch" | "deadlock"
    message: str  # one line

    def line(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass
class Report:
    ranks: int
    comms: int
    ops: int
    findings: list[Finding]
    waits: int = 0
    device_events: int = 0  # compute, sync and host_read events
    model: str = "strict"

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        if self.ok:
            device = f", {self.device_events} device events" if self.device_events else ""
            model = " and a strict device (one kernel at a time)" if self.model == "strict" else ""
            return (f"commcheck: {self.ranks} ranks, {self.comms} communicators, {self.ops} ops, "
                    f"{self.waits} waits{device}: clean under NCCL's rules{model}")
        more = f" (+{len(self.findings) - 1} more)" if len(self.findings) > 1 else ""
        return f"commcheck: {self.findings[0].line()}{more}"


@dataclass(slots=True, eq=False)
class Event:
    """One line of a rank's log, plus the replay's state for it."""

    rank: int
    seq: int
    thread: str
    op: str
    line: int  # line number in the file, for messages
    after: tuple[int, ...] = ()
    waits: tuple[int, ...] = ()
    comm: str = ""
    members: tuple[int, ...] = ()
    peer: int | None = None
    nbytes: int | None = None
    batch: int | None = None
    # What equal byte counts hide, where the log has it.
    dtype: str | None = None
    reduce_op: str | None = None
    src: int | None = None
    send_splits: tuple[int, ...] | None = None
    recv_splits: tuple[int, ...] | None = None
    row_bytes: int | None = None
    host: bool = False  # a gloo communicator on CPU tensors: never on the device
    label: str = ""  # a compute event's action, a sync's or host read's where
    # Static matching: the P2P partner, or the collective instance; `nth` counts from 1.
    partner: Event | None = None
    group: _Group | None = None
    nth: int = 0
    # Replay state.
    passed: bool = False  # issued, or (for a wait) returned
    done: bool = False  # op completed
    at_head: bool = False  # in its stream's head batch
    stream: _Stream | None = None
    watchers: list | None = None  # threads blocked until this event passes or completes
    targets: tuple[Event, ...] | None = None  # a sync's or host read's kernels, fixed when reached

    @property
    def is_wait(self) -> bool:
        return self.op == WAIT

    @property
    def is_comm(self) -> bool:
        """An op on a communicator (not a wait, not a device event)."""
        return self.op != WAIT and self.op not in DEVICE_EVENTS

    @property
    def is_p2p(self) -> bool:
        return self.op in P2P


@dataclass
class Logs:
    """What `load` read: each rank's events in file order, and what could not be read."""

    dir: Path
    ranks: dict[int, list[Event]]
    findings: list[Finding]


# ---------------------------------------------------------------------------- reading


def load(dir: Path) -> Logs:
    """Read every `rank-R.jsonl` in `dir`. Unreadable input becomes malformed findings."""
    dir = Path(dir)
    if not dir.is_dir():
        why = "not a directory" if dir.exists() else "no such directory"
        return Logs(dir, {}, [Finding("malformed", f"{dir}: {why}")])
    ranks: dict[int, list[Event]] = {}
    findings: list[Finding] = []
    for path in sorted(dir.glob("rank-*.jsonl")):
        m = _RANK_FILE.fullmatch(path.name)
        if m is None:
            findings.append(Finding("malformed", f"{path.name}: not named rank-R.jsonl with R a rank"))
            continue
        ranks[int(m[1])] = _read(path, int(m[1]), findings)
        if findings and findings[-1].kind == "format":  # a newer writer: read nothing, say so once
            return Logs(dir, {}, [findings[-1]])
    if not ranks and not findings:
        findings.append(Finding("malformed", f"{dir}: no rank-*.jsonl files"))
    return Logs(dir, dict(sorted(ranks.items())), findings)


def _read(path: Path, rank: int, findings: list[Finding]) -> list[Event]:
    events: list[Event] = []
    bad = 0
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        findings.append(Finding("malformed", f"{path.name}: cannot read ({e.strerror})"))
        return events
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if not events and not bad and raw.startswith('{"format"'):
            fmt = _format(raw)
            if fmt not in FORMATS:
                findings.append(Finding("format", f"{path.name}: log format {fmt} is not one this commcheck reads "
                                                  f"({', '.join(map(str, FORMATS))}); use the trirace that wrote it"))
                return events
            continue
        try:
            ev = _parse(raw, lineno)
            if ev.rank != rank:
                raise ValueError(f"rank {ev.rank} in the log of rank {rank}")
            if events and ev.seq <= events[-1].seq:
                raise ValueError(f"seq {ev.seq} does not increase (previous {events[-1].seq})")
        except ValueError as e:
            bad += 1
            if bad <= 10:  # a garbage file would otherwise flood the report
                findings.append(Finding("malformed", f"{path.name}:{lineno}: {e}"))
            continue
        events.append(ev)
    if bad > 10:
        findings.append(Finding("malformed", f"{path.name}: {bad - 10} more malformed lines"))
    return events


def _format(raw: str):
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return raw[:40]
    return obj.get("format") if isinstance(obj, dict) else raw[:40]


def _parse(raw: str, lineno: int) -> Event:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"bad JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    ev = Event(rank=_field(obj, "rank", int), seq=_field(obj, "seq", int), thread=_field(obj, "thread", str),
               op=_field(obj, "op", str), line=lineno, after=_ints(obj, "after", optional=True))
    if ev.is_wait:
        ev.waits = _ints(obj, "waits")
        return ev
    if ev.op in DEVICE_EVENTS:
        ev.label = _field(obj, "action" if ev.op == "compute" else "where", str, optional=ev.op != "compute") or ""
        return ev
    ev.comm = _field(obj, "comm", str)
    members = _ints(obj, "members")
    if not members or len(set(members)) != len(members) or min(members) < 0:
        raise ValueError(f"members {list(members)} must be distinct ranks, at least one")
    ev.members = tuple(sorted(members))
    ev.batch = _field(obj, "batch", int)
    ev.nbytes = _field(obj, "nbytes", int, optional=True)
    ev.peer = _field(obj, "peer", int, optional=True)
    if ev.is_p2p and ev.peer is None:
        raise ValueError(f"{ev.op} without a peer")
    ev.dtype = _field(obj, "dtype", str, optional=True)
    ev.reduce_op = _field(obj, "reduce_op", str, optional=True)
    ev.src = _field(obj, "src", int, optional=True)
    ev.row_bytes = _field(obj, "row_bytes", int, optional=True)
    ev.host = bool(_field(obj, "host", bool, optional=True))
    for name in ("send_splits", "recv_splits"):
        if obj.get(name) is not None:
            splits = _ints(obj, name)
            if len(splits) != len(ev.members) or min(splits, default=0) < 0:
                raise ValueError(f"{name} {list(splits)} must be one count per member of {ev.comm}")
            setattr(ev, name, splits)
    return ev


def _field(obj: dict, name: str, kind: type, optional: bool = False):
    if name not in obj or (optional and obj[name] is None):
        if optional:
            return None
        raise ValueError(f"missing field {name!r}")
    value = obj[name]
    if type(value) is not kind:  # exact type: a bool is an int to Python, never a rank or size
        what = {int: "an int", str: "a string", bool: "true or false"}[kind]
        raise ValueError(f"field {name!r} is not {what}: {value!r}")
    return value


def _ints(obj: dict, name: str, optional: bool = False) -> tuple[int, ...]:
    if optional and obj.get(name) is None:
        return ()
    if name not in obj:
        raise ValueError(f"missing field {name!r}")
    value = obj[name]
    if type(value) is not list or {*map(type, value)} - {int}:
        raise ValueError(f"field {name!r} is not a list of ints: {value!r}")
    return tuple(value)


# ---------------------------------------------------------------------- static checks


def _malformed(rank: int, ev: Event | None, message: str) -> Finding:
    where = f"rank-{rank}.jsonl:{ev.line}" if ev is not None else f"rank-{rank}.jsonl"
    return Finding("malformed", f"{where}: {message}")


def _check_refs(rank: int, events: list[Event]) -> list[Finding]:
    """Every `after` and `waits` seq names an event of this rank; waits name ops."""
    by_seq = {e.seq: e for e in events}
    out = []
    for e in events:
        for s in e.after:
            if s not in by_seq:
                out.append(_malformed(rank, e, f"after names unknown seq {s}"))
        for s in e.waits:
            if s not in by_seq:
                out.append(_malformed(rank, e, f"wait on unknown seq {s}"))
            elif not by_seq[s].is_comm:
                out.append(_malformed(rank, e, f"wait on seq {s}, which is a {by_seq[s].op}, not an op"))
    return out


def _check_members(logs: Logs) -> tuple[dict[str, tuple[int, ...]], list[Finding]]:
    """One members list per communicator, containing the issuer (and the peer, for P2P)."""
    members: dict[str, tuple[int, ...]] = {}
    first: dict[str, tuple[int, Event]] = {}
    reported: set[tuple[str, int]] = set()
    out = []
    for rank, events in logs.ranks.items():
        for e in events:
            if not e.is_comm:
                continue
            if rank not in e.members:
                out.append(_malformed(rank, e, f"rank {rank} issues on {e.comm} but is not in its members "
                                               f"{list(e.members)}"))
            if e.is_p2p and (e.peer == rank or e.peer not in e.members):
                out.append(_malformed(rank, e, f"{e.op} peer {e.peer} is not another member of {e.comm} "
                                               f"{list(e.members)}"))
            if e.comm not in members:
                members[e.comm], first[e.comm] = e.members, (rank, e)
            elif e.members != members[e.comm] and (e.comm, rank) not in reported:
                reported.add((e.comm, rank))
                r0, e0 = first[e.comm]
                out.append(_malformed(rank, e, f"{e.comm} has members {list(e.members)} here but "
                                               f"{list(members[e.comm])} on rank {r0} (seq {e0.seq})"))
    return members, out


def _check_ranks(logs: Logs) -> list[Finding]:
    """Every rank 0..N-1 has a log, N covering every member named on any line."""
    named: dict[int, set[str]] = defaultdict(set)
    for events in logs.ranks.values():
        for e in events:
            for m in e.members:
                named[m].add(e.comm)
    top = max([*logs.ranks, *named], default=-1)
    out = []
    for r in range(top + 1):
        if r in logs.ranks:
            continue
        comms = sorted(named.get(r, ()))
        why = f"a member of {', '.join(comms[:3])}{' ...' if len(comms) > 3 else ''}" if comms \
            else f"ranks run to {top}"
        out.append(Finding("malformed", f"no log for rank {r} (rank-{r}.jsonl; {why})"))
    return out


def _check_batches(rank: int, events: list[Event]) -> list[Finding]:
    """Ops of one batch are consecutive events of one thread, on one communicator."""
    out = []
    seen: set[int] = set()
    by_thread: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_thread[e.thread].append(e)
    for evs in by_thread.values():
        prev: Event | None = None
        for e in evs:
            if not e.is_comm:
                prev = None
            elif prev is not None and e.batch == prev.batch:
                if e.comm != prev.comm:
                    out.append(_malformed(rank, e, f"batch {e.batch} spans {prev.comm} and {e.comm}"))
            elif e.batch in seen:
                out.append(_malformed(rank, e, f"batch {e.batch} is not consecutive ops of one thread"))
            else:
                seen.add(e.batch)
            prev = e if e.is_comm else None
    return out


def _check_threads(rank: int, events: list[Event]) -> list[Finding]:
    """NCCL's runtime promises one issuing thread per communicator per rank."""
    firsts: dict[str, dict[str, int]] = defaultdict(dict)  # comm -> thread -> first seq
    for e in events:
        if e.is_comm:
            firsts[e.comm].setdefault(e.thread, e.seq)
    out = []
    for comm, threads in firsts.items():
        if len(threads) > 1:
            who = ", ".join(f"{t!r} (first seq {s})" for t, s in threads.items())
            out.append(Finding("threads", f"rank {rank} issues on {comm} from {len(threads)} threads: {who}"))
    return out


@dataclass(eq=False)
class _Group:
    """The k-th collective (nth = k) of every member of one communicator."""

    comm: str
    nth: int
    members: tuple[int, ...]
    ops: dict[int, Event]  # rank -> its op; a member that never issues it is absent
    ready: int = 0  # ops of it in their stream's head batch


def _pair_p2p(logs: Logs) -> list[Finding]:
    """The n-th send a->b on a communicator meets the n-th recv at b from a."""
    sends: dict[tuple, list[Event]] = defaultdict(list)
    recvs: dict[tuple, list[Event]] = defaultdict(list)
    for rank, events in logs.ranks.items():
        for e in events:
            if e.op == "send":
                sends[(e.comm, rank, e.peer)].append(e)
            elif e.op == "recv":
                recvs[(e.comm, e.peer, rank)].append(e)
    out = []
    for side in (sends, recvs):
        for evs in side.values():
            for n, e in enumerate(evs, start=1):
                e.nth = n
    for key, ss in sends.items():
        for s, r in zip(ss, recvs.get(key, ())):
            s.partner, r.partner = r, s
            sizes = s.nbytes is not None and r.nbytes is not None and s.nbytes != r.nbytes
            if sizes or (s.dtype and r.dtype and s.dtype != r.dtype):
                # Equal bytes of another dtype arrive intact and are read as garbage.
                out.append(Finding("mismatch", f"send #{s.nth} from {s.rank} to {r.rank} on {s.comm}: rank {s.rank} "
                                               f"sends {_size(s)} (seq {s.seq}), rank {r.rank} receives "
                                               f"{_size(r)} (seq {r.seq})"))
    return out


def _size(e: Event) -> str:
    """'4096 B' or '4096 B of bfloat16', as the log has it."""
    size = "? B" if e.nbytes is None else f"{e.nbytes} B"
    return f"{size} of {e.dtype}" if e.dtype else size


def _group_collectives(logs: Logs, members: dict[str, tuple[int, ...]]) -> list[Finding]:
    """Form each communicator's k-th collective instance; report disagreeing ones."""
    per: dict[tuple[str, int], list[Event]] = defaultdict(list)
    for rank, events in logs.ranks.items():
        for e in events:
            if e.is_comm and not e.is_p2p:
                per[(e.comm, rank)].append(e)
    out = []
    for comm, ms in sorted(members.items()):
        depth = max((len(per.get((comm, m), ())) for m in ms), default=0)
        for k in range(depth):
            ops = {m: per[(comm, m)][k] for m in ms if k < len(per.get((comm, m), ()))}
            group = _Group(comm, k + 1, ms, ops)
            for e in ops.values():
                e.group, e.nth = group, k + 1
            if _disagree(ops.values()):
                out.append(Finding("mismatch", f"collective #{k + 1} on {comm}: {_describe_variants(ops)}"))
            elif (splits := _split_mismatch(ops, ms)) is not None:
                out.append(Finding("mismatch", f"all_to_all #{k + 1} on {comm}: {splits}"))
    return out


_AGREED = ("dtype", "reduce_op", "src")  # fields every member of a collective must give alike, if logged


def _disagree(ops) -> bool:
    ops = list(ops)
    sizes = {e.nbytes for e in ops if e.nbytes is not None}
    if len({e.op for e in ops}) > 1 or len(sizes) > 1:
        return True
    return any(len({getattr(e, f) for e in ops if getattr(e, f) is not None}) > 1 for f in _AGREED)


def _describe_variants(ops: dict[int, Event]) -> str:
    """'all_reduce 4096 B on ranks 0 (seq 7), 2 (seq 7); all_reduce 8192 B on rank 1 (seq 9)',
    with the dtype, reduce op and broadcast source where logged."""
    variants: dict[tuple, list[Event]] = defaultdict(list)
    for e in ops.values():
        variants[(e.op, e.nbytes, e.dtype, e.reduce_op, e.src)].append(e)
    parts = []
    for (op, nbytes, dtype, reduce_op, src), evs in variants.items():
        what = f"{op} {'? B' if nbytes is None else f'{nbytes} B'}"
        what += "".join(f" {x}" for x in (dtype, reduce_op) if x) + (f" from {src}" if src is not None else "")
        who = ", ".join(f"{e.rank} (seq {e.seq})" for e in evs[:8]) + (" ..." if len(evs) > 8 else "")
        parts.append(f"{what} on rank{'s' if len(evs) > 1 else ''} {who}")
    return "; ".join(parts)


def _split_mismatch(ops: dict[int, Event], members: tuple[int, ...]) -> str | None:
    """What rank i sends rank j in an all-to-all is what j expects from i: rows times row
    bytes, in group order (members sorted, as torch numbers a group's ranks)."""
    for i in members:
        a = ops.get(i)
        if a is None or a.op != "all_to_all" or a.send_splits is None:
            continue
        for jx, j in enumerate(members):
            b = ops.get(j)
            if b is None or b.recv_splits is None:
                continue
            ix = members.index(i)
            sent, expected = a.send_splits[jx], b.recv_splits[ix]
            if a.row_bytes is not None and b.row_bytes is not None and a.row_bytes != b.row_bytes:
                if sent * a.row_bytes != expected * b.row_bytes:
                    return (f"rank {i} sends {sent * a.row_bytes} B to rank {j} (seq {a.seq}), rank {j} expects "
                            f"{expected * b.row_bytes} B from rank {i} (seq {b.seq})")
            elif sent != expected:
                return (f"rank {i} sends {_plural(sent, 'row')} to rank {j} (seq {a.seq}), rank {j} expects "
                        f"{expected} from rank {i} (seq {b.seq})")
    return None


# ----------------------------------------------------------------------------- replay


@dataclass(eq=False)
class _Stream:
    """One (rank, communicator): fully issued batches in issue order."""

    rank: int
    comm: str
    batches: list[list[Event]] = field(default_factory=list)
    head: int = 0  # index of the head batch
    left: int = 0  # incomplete ops in the head batch

    def head_op(self) -> Event | None:
        if self.head >= len(self.batches):
            return None
        return next(e for e in self.batches[self.head] if not e.done)


@dataclass(eq=False)
class _Thread:
    rank: int
    name: str
    events: list[Event]
    pos: int = 0  # next event to pass
    buf: list[Event] = field(default_factory=list)  # ops of a batch being issued
    last_compute: Event | None = None  # the latest compute kernel it launched (strict)
    gated: bool = False  # held behind an earlier logged event of another thread (strict)
    stalled: bool = False  # blocked where the log shows it going on: holds no thread back (strict)

    @property
    def finished(self) -> bool:
        return self.pos >= len(self.events)


class _Replay:
    def __init__(self, logs: Logs, model: str = "strict"):
        self.strict = model == "strict"
        self.by_seq = {r: {e.seq: e for e in evs} for r, evs in logs.ranks.items()}
        self.threads: dict[tuple[int, str], _Thread] = {}
        self.of_rank: dict[int, list[_Thread]] = defaultdict(list)
        for rank, events in logs.ranks.items():
            for e in events:
                key = (rank, e.thread)
                if key not in self.threads:
                    self.threads[key] = _Thread(rank, e.thread, [])
                    self.of_rank[rank].append(self.threads[key])
                self.threads[key].events.append(e)
        self.streams: dict[tuple[int, str], _Stream] = {}
        self.work: deque[_Thread] = deque()  # threads to try to advance
        self.ready: deque[Event] = deque()  # ops that just reached their stream's head
        self.passes = 0

    def run(self) -> list[Finding]:
        self.work.extend(self.threads.values())
        mark = -1  # passes at the last release
        while True:
            while self.work or self.ready:
                while self.ready:
                    self._on_head(self.ready.popleft())
                if self.work:
                    self._advance(self.work.popleft())
            if not self.strict:
                break
            stalled, gated = self._stall()
            if not gated or (self.passes == mark and not stalled):  # a round that moved nothing
                break
            mark = self.passes
            for t in gated:
                t.gated = False
            self.work.extend(gated)
        return self._strict_deadlock() if self.strict else self._deadlock()

    def _stall(self) -> tuple[int, list[_Thread]]:
        """Nothing moves. In a rank where a thread is held behind an earlier logged event of
        a blocked thread, the blocked threads stop holding back the others, which then launch
        ahead of them. Returns how many threads newly stalled, and the held threads to free
        (one freed now may block in turn and free the ones behind it in the next round)."""
        stalled, gated = 0, []
        for threads in self.of_rank.values():
            held = [t for t in threads if t.gated and not t.finished]
            if not held:
                continue
            for t in threads:
                if not t.finished and not t.gated and not t.stalled:
                    t.stalled = True
                    stalled += 1
            gated += held
        return stalled, gated

    # A thread passes its events in order until one has an unmet dependency.
    def _advance(self, t: _Thread) -> None:
        while not t.finished:
            ev = t.events[t.pos]
            if self.strict:
                ahead = self._ahead(t, ev)
                if ahead is not None:  # the log has another thread launch first
                    t.gated = True
                    self._watch(ahead, t)
                    return
                t.gated = False
                self._reach(t, ev)
            dep = self._unmet(ev)
            if dep is not None:
                self._watch(dep, t)
                return
            ev.passed = True
            t.stalled = False
            self.passes += 1
            if ev.is_comm or (self.strict and ev.op == "compute"):
                self._issue(t, ev)
            self._wake(ev)
            t.pos += 1

    def _ahead(self, t: _Thread, ev: Event) -> Event | None:
        """An earlier logged event of another thread of the rank that has yet to pass, unless
        that thread is stalled."""
        for u in self.of_rank[t.rank]:
            if u is not t and not u.finished and not u.stalled and u.events[u.pos].seq < ev.seq:
                return u.events[u.pos]
        return None

    def _reach(self, t: _Thread, ev: Event) -> None:
        """Fix what a sync or host read waits for, at the point its thread reaches it."""
        if ev.targets is not None:
            return
        if ev.op == "sync":
            stream = self.streams.get((ev.rank, DEVICE))
            ev.targets = tuple(stream.batches[-1]) if stream and stream.batches else ()
        elif ev.op == "host_read":
            ev.targets = (t.last_compute,) if t.last_compute is not None else ()

    def _watch(self, ev: Event, t: _Thread) -> None:
        if ev.watchers is None:
            ev.watchers = []
        ev.watchers.append(t)

    def _unmet(self, ev: Event) -> Event | None:
        """The first event that `ev` still waits for: an `after` not passed, an op not done."""
        seqs = self.by_seq[ev.rank]
        for s in ev.after:
            if not seqs[s].passed:
                return seqs[s]
        for s in ev.waits:
            if not seqs[s].done:
                return seqs[s]
        for op in ev.targets or ():
            if not op.done:
                return op
        return None

    def _wake(self, ev: Event) -> None:
        if ev.watchers:
            self.work.extend(ev.watchers)
            ev.watchers = None

    def _issue(self, t: _Thread, ev: Event) -> None:
        # A batch joins its stream only once all of it is issued (ncclGroupEnd).
        t.buf.append(ev)
        nxt = t.events[t.pos + 1] if t.pos + 1 < len(t.events) else None
        if ev.is_comm and nxt is not None and nxt.is_comm and nxt.batch == ev.batch:
            return
        batch, t.buf = t.buf, []
        if ev.op == "compute":
            t.last_compute = ev
        key = (ev.rank, DEVICE if self.strict and not ev.host else ev.comm)
        if key not in self.streams:
            self.streams[key] = _Stream(ev.rank, key[1])
        stream = self.streams[key]
        for op in batch:
            op.stream = stream
        stream.batches.append(batch)
        if stream.head == len(stream.batches) - 1:
            self._open(stream)

    def _open(self, stream: _Stream) -> None:
        batch = stream.batches[stream.head]
        stream.left = len(batch)
        for op in batch:
            op.at_head = True
            self.ready.append(op)

    def _on_head(self, op: Event) -> None:
        if op.done:
            return
        if op.op == "compute":  # needs nothing but the device
            self._complete(op)
            return
        if op.is_p2p:
            if op.partner is not None and op.partner.at_head:
                self._complete(op)
                self._complete(op.partner)
            return
        group = op.group
        group.ready += 1
        if group.ready == len(group.members):
            for member_op in group.ops.values():
                self._complete(member_op)

    def _complete(self, op: Event) -> None:
        op.done = True
        self._wake(op)
        stream = op.stream
        stream.left -= 1
        if stream.left == 0:
            stream.head += 1
            if stream.head < len(stream.batches):
                self._open(stream)

    # ------------------------------------------------------------ explaining a deadlock

    def _stuck(self) -> tuple[list[Event], int, list[_Thread]]:
        ops = [e for by_seq in self.by_seq.values() for e in by_seq.values() if e.is_comm]
        stuck = [e for e in ops if e.passed and not e.done]
        never = sum(1 for e in ops if not e.passed)
        blocked = [t for t in self.threads.values() if not t.finished]
        return stuck, never, blocked

    def _tally(self, stuck: list[Event], never: int, blocked: list[_Thread]) -> str:
        return (f"{_plural(len(stuck) + never, 'op')} stuck in all: {len(stuck)} issued, {never} never issued; "
                f"{_plural(len(blocked), 'thread')} blocked")

    def _deadlock(self) -> list[Finding]:
        stuck, never, blocked = self._stuck()
        if not stuck and not blocked:
            return []
        first = min(stuck + [t.events[t.pos] for t in blocked], key=lambda e: (e.rank, e.seq))
        tally = self._tally(stuck, never, blocked)
        return [Finding("deadlock", f"{_name(first)} waits: {self._why(first)} ({tally})")]

    def _why(self, ev: Event) -> str:
        if ev.passed:  # an issued op that never completes
            return self._why_op(ev)
        dep = self._unmet(ev)  # a thread is blocked at `ev` on `dep`
        if dep.passed:  # only an op waited on can be passed and still unmet
            return f"{_name(dep)}, which never completes: {self._why_op(dep)}"
        return (f"seq {dep.seq} ({_what(dep)} of thread {dep.thread}), which is never passed: "
                f"{self._where(dep.rank, dep.thread)}")

    def _why_op(self, op: Event) -> str:
        hold = self._hold(op)
        if hold is not None:
            return hold
        if op.is_p2p:
            if op.partner is None:
                other = f"recv from {op.rank}" if op.op == "send" else f"send to {op.rank}"
                return f"rank {op.peer} never posts a matching {other} on {op.comm} (this is {op.op} #{op.nth})"
            return self._hold(op.partner) or "its partner is at its head too (replay error)"
        return self._why_collective(op)

    def _hold(self, op: Event) -> str | None:
        """Why `op` is not in its stream's head batch, or None if it is."""
        if not op.passed:
            return f"rank {op.rank} has not issued {_what(op)} (seq {op.seq}): {self._where(op.rank, op.thread)}"
        if op.stream is None:
            return (f"rank {op.rank}'s batch {op.batch} on {op.comm} is not fully issued: "
                    f"{self._where(op.rank, op.thread)}")
        if op.at_head:
            return None
        head = op.stream.head_op()
        return (f"rank {op.rank}'s head on {op.comm} is {_what(head)} (seq {head.seq}), "
                f"ahead of {_what(op)} (seq {op.seq})")

    def _why_collective(self, op: Event) -> str:
        group = op.group
        missing = []
        for m in group.members:
            other = group.ops.get(m)
            if other is None:
                count = sum(1 for o in self.by_seq[m].values()
                            if not o.is_wait and not o.is_p2p and o.comm == op.comm)
                missing.append(f"rank {m} never reaches it (issues {count} collectives on {op.comm}; "
                               f"{self._where_rank(m)})")
            elif not other.at_head:
                missing.append(self._hold(other))
        listed = "; ".join(missing[:4]) + (f"; and {len(missing) - 4} more" if len(missing) > 4 else "")
        return f"{len(missing)} of {len(group.members)} members not there: {listed}"

    def _where(self, rank: int, thread: str) -> str:
        t = self.threads[(rank, thread)]
        if t.finished:
            return f"thread {thread} finished"
        ev = t.events[t.pos]
        dep = self._unmet(ev)
        if dep.passed:  # an issued op that has not completed
            return f"thread {thread} is blocked at wait (seq {ev.seq}) on {_name(dep)}"
        return (f"thread {thread} is blocked at {_what(ev)} (seq {ev.seq}) until seq {dep.seq} "
                f"({_what(dep)} of thread {dep.thread}) passes")

    def _where_rank(self, rank: int) -> str:
        blocked = [t for (r, _), t in self.threads.items() if r == rank and not t.finished]
        if not blocked:
            return "all its threads finished"
        return "; ".join(self._where(rank, t.name) for t in blocked[:2])

    # -------------------------------------------- explaining a deadlock, strict model

    def _strict_deadlock(self) -> list[Finding]:
        """Follow what waits for what from the first blocked thread (or stuck op) until the
        chain closes on itself (a cycle: the ranks named are the ones whose launches form
        it) or ends at something that never comes."""
        stuck, never, blocked = self._stuck()
        if not stuck and not blocked:
            return []
        node: _Thread | Event = min(blocked, key=lambda t: (t.rank, t.events[t.pos].seq)) if blocked \
            else min(stuck, key=lambda e: (e.rank, e.seq))
        path: list = []
        seen: dict[int, int] = {}
        while node is not None and id(node) not in seen:
            seen[id(node)] = len(path)
            nxt, text = self._blocker(node)
            path.append((node, text))
            node = nxt
        tally = self._tally(stuck, never, blocked)
        if node is None:  # a chain: its last link never comes
            return [Finding("deadlock", f"{self._render(path)} ({tally})")]
        cycle = path[seen[id(node)]:]
        lead = min(range(len(cycle)), key=lambda i: (cycle[i][0].rank, isinstance(cycle[i][0], Event)))
        cycle = cycle[lead:] + cycle[:lead]
        ranks = list(dict.fromkeys(n.rank for n, _ in cycle))
        who = f"ranks {', '.join(map(str, ranks))} wait on each other" if len(ranks) > 1 \
            else f"rank {ranks[0]} waits on itself"
        return [Finding("deadlock", f"{who}: {self._render(cycle)} ({tally})")]

    def _render(self, path: list) -> str:
        """One sentence: a thread's clause names what it waits for, and each op's clause
        (', which ...') names what that op waits for in turn."""
        out = ""
        for i, (node, text) in enumerate(path):
            if isinstance(node, _Thread):
                out += ("" if i == 0 else ": ") + text
            else:
                out += (f"rank {node.rank}'s {_kernel(node)}" if i == 0 else "") + text
        return out

    def _blocker(self, node) -> tuple[object, str]:
        """(what `node` waits for, or None if nothing will ever come; the words for it)."""
        if isinstance(node, _Thread):
            ev = node.events[node.pos]
            self._reach(node, ev)
            dep = self._unmet(ev)
            who = f"rank {node.rank} {node.name}"
            at = {"wait": f"waits (seq {ev.seq})", "sync": f"syncs the device (seq {ev.seq}, {ev.label})",
                  "host_read": f"reads a device value (seq {ev.seq}, {ev.label})"}.get(
                ev.op, f"is held at {_what(ev)} (seq {ev.seq})")
            if dep is None:  # held only by the logged order (a replay that stopped early)
                ahead = self._ahead(node, ev)
                return self.threads[(ahead.rank, ahead.thread)], f"{who} {at} behind seq {ahead.seq} of {ahead.thread}"
            if dep.passed or dep.thread == node.name:
                return dep, f"{who} {at} for {_kernel(dep)}"
            return self.threads[(dep.rank, dep.thread)], f"{who} {at} until {dep.thread} passes seq {dep.seq}"
        op: Event = node
        if not op.passed:
            return self.threads[(op.rank, op.thread)], f", which rank {op.rank} has not launched"
        if not op.at_head:
            head = op.stream.head_op()
            where = "its device" if op.stream.comm == DEVICE else f"its stream of {op.stream.comm}"
            return head, f", which is behind {_kernel(head)} on {where}"
        if op.is_p2p:
            p = op.partner
            if p is None:
                other = f"recv from {op.rank}" if op.op == "send" else f"send to {op.rank}"
                return None, f", which rank {op.peer} never matches with a {other} (this is {op.op} #{op.nth})"
            return p, f", which needs rank {p.rank}'s {_kernel(p)}"
        group = op.group
        for m in group.members:
            other = group.ops.get(m)
            if other is None:
                count = sum(1 for o in self.by_seq[m].values() if o.is_comm and not o.is_p2p and o.comm == op.comm)
                return None, f", which rank {m} never reaches (it issues {count} collectives on {op.comm})"
            if not other.at_head:
                return other, f", which needs rank {m}'s {_kernel(other)}"
        return None, ", which has every member at its head (a replay error)"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _what(ev: Event) -> str:
    if ev.op == "send":
        return f"send to {ev.peer}"
    if ev.op == "recv":
        return f"recv from {ev.peer}"
    return ev.op


def _kernel(ev: Event) -> str:
    """A kernel as the strict model's messages name it: 'F0 (seq 11)', 'recv from 1 on
    bwd/1>0 (seq 5)', 'all_reduce on dp/s0 (seq 9)'."""
    if ev.op == "compute":
        return f"{ev.label} (seq {ev.seq})"
    return f"{_what(ev)} on {ev.comm} (seq {ev.seq})"


def _name(ev: Event) -> str:
    if ev.is_wait:
        return f"rank {ev.rank} thread {ev.thread} wait (seq {ev.seq})"
    if ev.is_p2p:
        return f"rank {ev.rank} {_what(ev)} on {ev.comm} (seq {ev.seq})"
    return f"rank {ev.rank} {ev.op} on {ev.comm} {list(ev.members)} (seq {ev.seq})"


# ------------------------------------------------------------------------------ entry


def _capped(findings: list[Finding]) -> list[Finding]:
    """At most MAX_LISTED findings per kind, plus one that counts the rest."""
    out, count = [], defaultdict(int)
    for f in findings:
        count[f.kind] += 1
        if count[f.kind] <= MAX_LISTED:
            out.append(f)
    for kind, n in count.items():
        if n > MAX_LISTED:
            out.append(Finding(kind, f"... and {n - MAX_LISTED} more {kind} findings not listed"))
    return out


def check(dir: str | Path, model: str = "strict") -> Report:
    """Load `dir` and replay it under `model` ("strict" or "streams"). Malformed logs are
    reported and not replayed, since a replay of a partial log would only report the gaps
    as deadlocks."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {MODELS}")
    logs = load(Path(dir))
    events = [e for evs in logs.ranks.values() for e in evs]
    n_waits = sum(1 for e in events if e.is_wait)
    n_device = sum(1 for e in events if e.op in DEVICE_EVENTS)
    findings = list(logs.findings)
    members, member_findings = _check_members(logs)
    if not findings:
        for rank, evs in logs.ranks.items():
            findings += _check_refs(rank, evs) + _check_batches(rank, evs)
        findings += member_findings + _check_ranks(logs)
    if not findings:
        for rank, evs in logs.ranks.items():
            findings += _check_threads(rank, evs)
        findings += _pair_p2p(logs) + _group_collectives(logs, members)
        findings += _Replay(logs, model).run()
    order = {"format": 0, "malformed": 1, "threads": 2, "mismatch": 3, "deadlock": 4}
    findings.sort(key=lambda f: order.get(f.kind, 5))  # stable: detection order within a kind
    return Report(ranks=len(logs.ranks), comms=len(members), ops=len(events) - n_waits - n_device,
                  findings=_capped(findings), waits=n_waits, device_events=n_device, model=model)


def main(dir: str, model: str = "strict") -> int:
    """Print the summary line, then each finding; 0 when clean, else 1."""
    report = check(dir, model)
    print(report.summary())
    if len(report.findings) > 1:  # a single one is the summary already
        for f in report.findings:
            print(f"  {f.line()}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]) if len(sys.argv) in (2, 3) else 2)
