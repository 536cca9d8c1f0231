"""commcheck's strict device model on hand-written logs: each planted fault is reported, as
a deadlock naming the ranks of its cycle or a mismatch naming the ranks that disagree, and
its fix passes. Logs are written as CommLog writes them (format 2: device events, metadata)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trirace.obs.commcheck import Report, check, main


class Rank:
    """One rank's log; every call returns the seq of the (first) event it wrote."""

    def __init__(self, rank: int):
        self.rank = rank
        self.lines: list[dict] = []

    def _add(self, row: dict, thread: str, after=()) -> int:
        seq = len(self.lines)
        self.lines.append({**row, "seq": seq, "rank": self.rank, "thread": thread, "after": list(after)})
        return seq

    def batch(self, comm: str, members, *ops: dict, thread: str = "engine", after=(), host: bool = False) -> list[int]:
        """ops: dicts with "op" and optional "peer", "nbytes", metadata; issued together."""
        first = len(self.lines)
        for op in ops:
            row = {"comm": comm, "members": sorted(members), "peer": None, "nbytes": 64, "batch": first, **op}
            if host:
                row["host"] = True
            self._add(row, thread, after)
        return list(range(first, len(self.lines)))

    def send(self, comm: str, peer: int, nbytes: int = 64, dtype: str = "float32", **kw) -> int:
        return self.batch(comm, {self.rank, peer}, {"op": "send", "peer": peer, "nbytes": nbytes, "dtype": dtype},
                          **kw)[0]

    def recv(self, comm: str, peer: int, nbytes: int = 64, dtype: str = "float32", **kw) -> int:
        return self.batch(comm, {self.rank, peer}, {"op": "recv", "peer": peer, "nbytes": nbytes, "dtype": dtype},
                          **kw)[0]

    def coll(self, comm: str, members, op: str = "all_reduce", **kw) -> int:
        meta = {k: kw.pop(k) for k in ("nbytes", "dtype", "reduce_op", "src", "send_splits", "recv_splits",
                                       "row_bytes") if k in kw}
        return self.batch(comm, members, {"op": op, **meta}, **kw)[0]

    def wait(self, *seqs: int, thread: str = "engine", after=()) -> int:
        return self._add({"op": "wait", "waits": list(seqs)}, thread, after)

    def compute(self, action: str, thread: str = "engine") -> int:
        return self._add({"op": "compute", "action": action}, thread)

    def sync(self, where: str, thread: str = "engine") -> int:
        return self._add({"op": "sync", "where": where}, thread)

    def host_read(self, where: str, thread: str = "engine") -> int:
        return self._add({"op": "host_read", "where": where}, thread)


def write(dir: Path, ranks: list[Rank]) -> Path:
    dir.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        lines = [{"format": 2}] + r.lines
        (dir / f"rank-{r.rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return dir


def only(report: Report, kind: str) -> str:
    assert [f.kind for f in report.findings] == [kind], report.findings
    return report.findings[0].message


# ---------------------------------------------------- today's engine, in miniature


def two_stages(sync_after_compute: bool, recv_ahead: bool) -> list[Rank]:
    """Stage 0 (rank 0) and stage 1 (rank 1) of a pipeline, two micro-batches, as the engine
    runs them: compute actions, each followed by a device sync if `sync_after_compute`;
    stage 0 posts its gradient receives before its forwards if `recv_ahead`, else each one
    after the send that precedes it in the schedule."""
    r0, r1 = Rank(0), Rank(1)

    def compute(r: Rank, action: str) -> None:
        r.compute(action)
        if sync_after_compute:
            r.sync(f"after {action}")

    rb = [r0.recv("bwd/1>0", 1) for _ in range(2)] if recv_ahead else []
    for m in range(2):
        compute(r0, f"F{m}")
        r0.send("fwd/0>1", 1)
        if not recv_ahead:
            rb.append(r0.recv("bwd/1>0", 1))
    for m in range(2):
        r0.wait(rb[m])
        compute(r0, f"B{m}")
    for m in range(2):
        r1.wait(r1.recv("fwd/0>1", 0))
        compute(r1, f"F{m}")
        compute(r1, f"B{m}")
        r1.send("bwd/1>0", 0)
    return [r0, r1]


def test_sync_after_compute_with_receives_ahead_deadlocks_naming_both_ranks(tmp_path):
    message = only(check(write(tmp_path, two_stages(sync_after_compute=True, recv_ahead=True))), "deadlock")
    assert message.startswith(
        "ranks 0, 1 wait on each other: rank 0 engine syncs the device (seq 3, after F0) for F0 (seq 2), "
        "which is behind recv from 1 on bwd/1>0 (seq 0) on its device, which needs rank 1's send to 0 on "
        "bwd/1>0 (seq 6), which rank 1 has not launched: rank 1 engine waits (seq 1) for recv from 0 on "
        "fwd/0>1 (seq 0), which needs rank 0's send to 1 on fwd/0>1 (seq 4), which rank 0 has not launched")
    # gloo forgives it: the per-communicator model sees no cycle.
    assert check(tmp_path, model="streams").ok


def test_receives_ahead_deadlock_without_the_sync_too(tmp_path):
    """A device runs one kernel at a time: stage 0's send queues behind its posted receive."""
    message = only(check(write(tmp_path, two_stages(sync_after_compute=False, recv_ahead=True))), "deadlock")
    assert message.startswith("ranks 0, 1 wait on each other: rank 0's recv from 1 on bwd/1>0 (seq 0), "
                              "which needs rank 1's send to 0 on bwd/1>0")
    assert "rank 0's send to 1 on fwd/0>1 (seq 3), which is behind recv from 1 on bwd/1>0 (seq 0) on its device" \
        in message


@pytest.mark.parametrize("sync", [True, False])
def test_receives_after_the_sends_before_them_are_clean(tmp_path, sync):
    report = check(write(tmp_path, two_stages(sync_after_compute=sync, recv_ahead=False)))
    assert report.ok, report.findings
    assert report.summary().endswith("clean under NCCL's rules and a strict device (one kernel at a time)")


# ---------------------------------------------- two communicators, opposite orders


def opposite_orders(same: bool) -> list[Rank]:
    """Two ranks launch all-reduces on communicators A and B, then wait for both."""
    ranks = []
    for rank, order in ((0, "AB"), (1, "AB" if same else "BA")):
        r = Rank(rank)
        r.wait(*[r.coll(c, [0, 1]) for c in order])
        ranks.append(r)
    return ranks


def test_two_communicators_in_opposite_orders_deadlock_only_on_a_device(tmp_path):
    d = write(tmp_path / "opposite", opposite_orders(same=False))
    message = only(check(d), "deadlock")
    assert message.startswith(
        "ranks 0, 1 wait on each other: rank 0's all_reduce on A (seq 0), which needs "
        "rank 1's all_reduce on A (seq 1), which is behind all_reduce on B (seq 0) on its device, which needs "
        "rank 0's all_reduce on B (seq 1), which is behind all_reduce on A (seq 0) on its device")
    assert check(d, model="streams").ok  # each communicator alone is in order
    assert check(write(tmp_path / "same", opposite_orders(same=True))).ok


# ------------------------------------------- a receive ahead of a send the peer needs


def recv_before_send(fix: str | None) -> list[Rank]:
    """Rank 1 answers rank 0's message. Rank 0 posts its receive for the answer before its
    send (fix None), after it ("after"), or in one batch with it on a pair's communicator
    ("batched")."""
    r0, r1 = Rank(0), Rank(1)
    if fix == "batched":
        r0.wait(*r0.batch("pair", {0, 1}, {"op": "send", "peer": 1}, {"op": "recv", "peer": 1}))
        r1.wait(r1.recv("pair", 0))
        r1.wait(r1.send("pair", 0))
        return [r0, r1]
    if fix == "after":
        s = r0.send("fwd/0>1", 1)
        r = r0.recv("bwd/1>0", 1)
    else:
        r = r0.recv("bwd/1>0", 1)
        s = r0.send("fwd/0>1", 1)
    r0.wait(s, r)
    r1.wait(r1.recv("fwd/0>1", 0))
    r1.wait(r1.send("bwd/1>0", 0))
    return [r0, r1]


def test_receive_posted_ahead_of_the_send_its_peer_needs_deadlocks(tmp_path):
    d = write(tmp_path / "ahead", recv_before_send(fix=None))
    message = only(check(d), "deadlock")
    assert message.startswith(
        "ranks 0, 1 wait on each other: rank 0's send to 1 on fwd/0>1 (seq 1), which is behind recv from 1 on "
        "bwd/1>0 (seq 0) on its device, which needs rank 1's send to 0 on bwd/1>0 (seq 2), which rank 1 has not "
        "launched: rank 1 engine waits (seq 1) for recv from 0 on fwd/0>1 (seq 0), which needs rank 0's send to 1 "
        "on fwd/0>1 (seq 1) (")
    assert check(d, model="streams").ok


@pytest.mark.parametrize("fix", ["after", "batched"])
def test_receive_after_or_batched_with_the_send_is_clean(tmp_path, fix):
    report = check(write(tmp_path, recv_before_send(fix)))
    assert report.ok, report.findings


# --------------------------------------------------------------------- metadata


def test_bf16_against_fp32_of_equal_bytes_is_a_mismatch(tmp_path):
    def pair(dtype_sent: str) -> list[Rank]:
        r0, r1 = Rank(0), Rank(1)
        r0.wait(r0.send("fwd/0>1", 1, nbytes=4096, dtype=dtype_sent))
        r1.wait(r1.recv("fwd/0>1", 0, nbytes=4096, dtype="float32"))
        return [r0, r1]

    message = only(check(write(tmp_path / "bad", pair("bfloat16"))), "mismatch")
    assert message == ("send #1 from 0 to 1 on fwd/0>1: rank 0 sends 4096 B of bfloat16 (seq 0), "
                       "rank 1 receives 4096 B of float32 (seq 0)")
    assert check(write(tmp_path / "good", pair("float32"))).ok


@pytest.mark.parametrize("field, values, expected", [
    ("dtype", ("bfloat16", "float32"), "all_reduce 4096 B bfloat16 sum on rank 0 (seq 0); "
                                       "all_reduce 4096 B float32 sum on rank 1 (seq 0)"),
    ("reduce_op", ("sum", "max"), "all_reduce 4096 B float32 sum on rank 0 (seq 0); "
                                  "all_reduce 4096 B float32 max on rank 1 (seq 0)"),
])
def test_collective_dtype_and_reduce_op_must_agree(tmp_path, field, values, expected):
    ranks = []
    for rank, value in zip((0, 1), values):
        r = Rank(rank)
        meta = {"nbytes": 4096, "dtype": "float32", "reduce_op": "sum", field: value}
        r.wait(r.coll("dp/s0", [0, 1], **meta))
        ranks.append(r)
    assert only(check(write(tmp_path, ranks)), "mismatch") == f"collective #1 on dp/s0: {expected}"


def test_broadcast_source_must_agree(tmp_path):
    ranks = []
    for rank, src in ((0, 0), (1, 1), (2, 0)):
        r = Rank(rank)
        r.wait(r.coll("tie", [0, 1, 2], op="broadcast", nbytes=256, dtype="float32", src=src))
        ranks.append(r)
    assert only(check(write(tmp_path, ranks)), "mismatch") == (
        "collective #1 on tie: broadcast 256 B float32 from 0 on ranks 0 (seq 0), 2 (seq 0); "
        "broadcast 256 B float32 from 1 on rank 1 (seq 0)")


def all_to_all(splits: dict[int, tuple[list[int], list[int]]]) -> list[Rank]:
    """Three ranks' all-to-all with (send_splits, recv_splits) each, in rows of 72 B."""
    ranks = []
    for rank, (send, recv) in splits.items():
        r = Rank(rank)
        r.wait(r.coll("dp/s0", [0, 1, 2], op="all_to_all", nbytes=None, dtype="uint8", send_splits=send,
                      recv_splits=recv, row_bytes=72))
        ranks.append(r)
    return ranks


def test_all_to_all_splits_must_agree_pairwise(tmp_path):
    agreed = {0: ([1, 2, 3], [1, 4, 7]), 1: ([4, 5, 6], [2, 5, 8]), 2: ([7, 8, 9], [3, 6, 9])}
    assert check(write(tmp_path / "good", all_to_all(agreed))).ok
    disagree = {**agreed, 1: ([4, 5, 6], [2, 5, 7])}  # rank 1 expects 7 rows from rank 2, which sends 8
    message = only(check(write(tmp_path / "bad", all_to_all(disagree))), "mismatch")
    assert message == "all_to_all #1 on dp/s0: rank 2 sends 8 rows to rank 1 (seq 0), rank 1 expects 7 from rank 2 (seq 0)"


# ------------------------------------------------------- threads, syncs, host reads


def sync_then_helper(helper_on_host: bool) -> list[Rank]:
    """Rank 0's engine posts a receive and syncs the device (free on gloo, so the log goes
    on); its helper thread then all-reduces with rank 1, which sends only after that."""
    r0, r1 = Rank(0), Rank(1)
    r0.recv("p", 1)
    r0.sync("after posting")
    r0.wait(r0.coll("q", [0, 1], thread="helper", host=helper_on_host), thread="helper")
    r1.wait(r1.coll("q", [0, 1], host=helper_on_host))
    r1.wait(r1.send("p", 0))
    return [r0, r1]


def test_a_thread_blocked_in_a_sync_lets_the_rank_s_other_threads_launch(tmp_path):
    # The helper's all-reduce is logged after the sync, yet launches while the engine waits.
    assert check(write(tmp_path / "host", sync_then_helper(helper_on_host=True))).ok
    # On the device, the all-reduce queues behind the posted receive, which needs it first.
    message = only(check(write(tmp_path / "device", sync_then_helper(helper_on_host=False))), "deadlock")
    assert message.startswith("ranks 0, 1 wait on each other: rank 0's recv from 1 on p (seq 0), which needs "
                              "rank 1's send to 0 on p (seq 2), which rank 1 has not launched: rank 1 engine waits "
                              "(seq 1) for all_reduce on q (seq 0), which needs rank 0's all_reduce on q (seq 2), "
                              "which is behind recv from 1 on p (seq 0) on its device")


def test_host_read_waits_for_the_thread_s_compute_only(tmp_path):
    """A loss read after the forward waits for the forward, which waits for the receive
    posted ahead of it on the device; a read with no compute before it waits for nothing."""
    def ranks(compute_first: bool) -> list[Rank]:
        r0, r1 = Rank(0), Rank(1)
        r0.recv("p", 1)
        if compute_first:
            r0.compute("F0")
        r0.host_read("loss.item() in F0")
        r0.coll("q", [0, 1], host=True)
        r1.wait(r1.coll("q", [0, 1], host=True))
        r1.send("p", 0)
        return [r0, r1]

    assert check(write(tmp_path / "none", ranks(compute_first=False))).ok
    message = only(check(write(tmp_path / "read", ranks(compute_first=True))), "deadlock")
    assert message.startswith("ranks 0, 1 wait on each other: rank 0 engine reads a device value "
                              "(seq 2, loss.item() in F0) for F0 (seq 1), which is behind recv from 1 on p (seq 0)")


# ------------------------------------------------------------------ format, CLI


def test_an_unknown_format_is_refused_in_one_line(tmp_path, capsys):
    write(tmp_path, two_stages(sync_after_compute=False, recv_ahead=False))
    for r in (0, 1):
        f = tmp_path / f"rank-{r}.jsonl"
        f.write_text(f.read_text().replace('{"format": 2}', '{"format": 9}'))
    assert main(str(tmp_path)) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["commcheck: format: rank-0.jsonl: log format 9 is not one this commcheck reads (1, 2); "
                   "use the trirace that wrote it"]


def test_the_cli_takes_the_model(tmp_path, capsys):
    from trirace.cli import main as cli

    d = write(tmp_path, opposite_orders(same=False))
    assert cli(["commcheck", str(d)]) == 1
    assert capsys.readouterr().out.startswith("commcheck: deadlock: ranks 0, 1 wait on each other")
    assert cli(["commcheck", "--model", "streams", str(d)]) == 0
    assert capsys.readouterr().out.strip().endswith("clean under NCCL's rules")


# ------------------------------------------------------------------------ speed


def strict_pipeline(stages: int, replicas: int, micro: int, steps: int) -> list[Rank]:
    """GPipe on every replica, clean on a strict device: each receive is posted where it is
    needed, compute actions are logged kernels with a host read of the loss on the last
    stage, and a launcher thread all-reduces each step's gradient after the engine's last
    backward, which the engine waits for before the next step."""
    ranks = [Rank(r) for r in range(stages * replicas)]
    for s in range(stages):
        dp = [s * replicas + d for d in range(replicas)]
        for d in range(replicas):
            me, r = s * replicas + d, ranks[s * replicas + d]
            prev = me - replicas if s > 0 else None
            nxt = me + replicas if s < stages - 1 else None
            for _ in range(steps):
                for m in range(micro):
                    if prev is not None:
                        r.wait(r.recv(f"fwd/{prev}>{me}", prev))
                    r.compute(f"F{m}")
                    if nxt is not None:
                        r.send(f"fwd/{me}>{nxt}", nxt)
                    else:
                        r.host_read(f"loss.item() in F{m}")
                for m in range(micro):
                    if nxt is not None:
                        r.wait(r.recv(f"bwd/{nxt}>{me}", nxt))
                    r.compute(f"B{m}")
                    if prev is not None:
                        r.send(f"bwd/{me}>{prev}", prev)
                last = len(r.lines) - 1
                ar = r.coll(f"dp/s{s}", dp, thread="launcher", after=[last])
                r.wait(ar)
    return ranks


def test_100k_events_over_8_ranks_check_in_seconds_under_strict(tmp_path):
    ranks = strict_pipeline(stages=4, replicas=2, micro=8, steps=220)
    events = sum(len(r.lines) for r in ranks)
    assert 95_000 <= events <= 115_000, events
    write(tmp_path, ranks)
    t0 = time.perf_counter()
    report = check(tmp_path)
    elapsed = time.perf_counter() - t0
    assert report.ok, report.findings[:3]
    assert report.ops + report.waits + report.device_events == events
    assert elapsed < 10, f"{elapsed:.1f} s"


def test_threads_blocked_in_turn_each_release_the_ones_behind(tmp_path):
    """Two threads of rank 0 sync behind a posted receive, one after the other in the log;
    the third thread, logged last, sends what lets rank 1 answer (on a host communicator)."""
    r0, r1 = Rank(0), Rank(1)
    r0.recv("p", 1, thread="a")
    r0.sync("a's sync", thread="a")
    r0.sync("c's sync", thread="c")
    r0.wait(r0.coll("q", [0, 1], thread="b", host=True), thread="b")
    r1.wait(r1.coll("q", [0, 1], host=True))
    r1.wait(r1.send("p", 0))
    report = check(write(tmp_path, [r0, r1]))
    assert report.ok, report.findings


# ------------------------------------- what the streams model's tests plant, strict


def test_strict_explains_a_send_nobody_receives(tmp_path):
    r0, r1 = Rank(0), Rank(1)
    r0.wait(r0.send("p", 1))
    r0.send("p", 1)
    r1.wait(r1.recv("p", 0))
    assert only(check(write(tmp_path, [r0, r1])), "deadlock") == (
        "rank 0's send to 1 on p (seq 2), which rank 1 never matches with a recv from 0 (this is send #2) "
        "(1 op stuck in all: 1 issued, 0 never issued; 0 threads blocked)")


def test_strict_explains_a_collective_one_member_skips(tmp_path):
    ranks = [Rank(r) for r in range(3)]
    for r in ranks[:2]:
        r.wait(r.coll("dp", [0, 1, 2]))
    ranks[2].wait(ranks[2].coll("solo/2", [2]))
    assert only(check(write(tmp_path, ranks)), "deadlock").startswith(
        "rank 0 engine waits (seq 1) for all_reduce on dp (seq 0), which rank 2 never reaches "
        "(it issues 0 collectives on dp)")


def test_strict_names_a_cycle_inside_one_rank(tmp_path):
    """The engine waits for an all-reduce its launcher issues only after a later event of
    the engine."""
    r0, r1 = Rank(0), Rank(1)
    ar = r0.coll("dp", [0, 1], thread="launcher", after=[2])
    r0.wait(ar)
    r0.compute("F0")
    r1.wait(r1.coll("dp", [0, 1]))
    assert only(check(write(tmp_path, [r0, r1])), "deadlock").startswith(
        "rank 0 waits on itself: rank 0 launcher is held at all_reduce (seq 0) until engine passes seq 2: "
        "rank 0 engine waits (seq 1) until launcher passes seq 0 (")


def test_a_log_without_a_format_line_is_format_1(tmp_path):
    d = write(tmp_path, recv_before_send(fix="after"))
    for f in d.glob("rank-*.jsonl"):
        f.write_text("".join(f.read_text().splitlines(keepends=True)[1:]))
    assert check(d).ok


def test_a_compute_event_without_its_action_is_malformed(tmp_path):
    ranks = two_stages(sync_after_compute=False, recv_ahead=False)
    next(line for line in ranks[0].lines if line["op"] == "compute").pop("action")
    assert only(check(write(tmp_path, ranks)), "malformed") == "rank-0.jsonl:2: missing field 'action'"
