"""commcheck replays synthetic per-rank logs under NCCL's rules: clean schedules pass,
planted deadlocks, mismatches, thread misuse and malformed input are each reported.

Replays that assert a deadlock's explanation, or that `pipeline()` is clean, name the
streams model (one in-order stream per communicator): `pipeline()` posts every receive of a
step ahead of its sends, as today's runtime does, which a strict device (one kernel at a
time, the default model) reports as a deadlock; and the strict model explains a deadlock as
the cycle of launches it closes, asserted in tests/unit/test_commcheck_strict.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trirace.obs.commcheck import Report, check, main


class Rank:
    """Builds one rank's log; every call returns the seqs it created, numbered per rank."""

    def __init__(self, rank: int):
        self.rank = rank
        self.lines: list[dict] = []

    @property
    def next_seq(self) -> int:
        return len(self.lines)

    def batch(self, comm: str, members, *ops, thread: str = "main", after=()) -> list[int]:
        """ops: (op, peer, nbytes) issued together on `comm`."""
        first = self.next_seq
        for op, peer, nbytes in ops:
            self.lines.append({"seq": self.next_seq, "rank": self.rank, "thread": thread, "comm": comm,
                               "members": sorted(members), "op": op, "peer": peer, "nbytes": nbytes,
                               "batch": first, "after": list(after)})
        return list(range(first, self.next_seq))

    def send(self, comm: str, peer: int, nbytes: int = 64, **kw) -> int:
        return self.batch(comm, {self.rank, peer}, ("send", peer, nbytes), **kw)[0]

    def recv(self, comm: str, peer: int, nbytes: int = 64, **kw) -> int:
        return self.batch(comm, {self.rank, peer}, ("recv", peer, nbytes), **kw)[0]

    def coll(self, comm: str, members, op: str = "all_reduce", nbytes: int | None = 1024, **kw) -> int:
        return self.batch(comm, members, (op, None, nbytes), **kw)[0]

    def wait(self, *seqs: int, thread: str = "main", after=()) -> int:
        self.lines.append({"seq": self.next_seq, "rank": self.rank, "thread": thread, "op": "wait",
                           "waits": list(seqs), "after": list(after)})
        return self.next_seq - 1


def write(dir: Path, ranks: list[Rank]) -> Path:
    dir.mkdir(parents=True, exist_ok=True)
    for r in ranks:
        (dir / f"rank-{r.rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in r.lines))
    return dir


def pipeline(stages: int, replicas: int, micro: int, steps: int) -> list[Rank]:
    """Pipeline x data parallel: one comm per direction and stage pair, receivers pre-post
    every recv of a step, a launcher thread issues the stage's dp all_reduce only after the
    engine passed its last wait, and the engine waits on that all_reduce."""
    ranks = [Rank(r) for r in range(stages * replicas)]
    for s in range(stages):
        dp = [s * replicas + d for d in range(replicas)]
        for d in range(replicas):
            me, r = s * replicas + d, ranks[s * replicas + d]
            prev = me - replicas if s > 0 else None
            nxt = me + replicas if s < stages - 1 else None
            for _ in range(steps):
                fwd_in = [r.recv(f"fwd/{prev}>{me}", prev) for _ in range(micro)] if prev is not None else []
                bwd_in = [r.recv(f"bwd/{nxt}>{me}", nxt) for _ in range(micro)] if nxt is not None else []
                sends = []
                for m in range(micro):
                    if prev is not None:
                        r.wait(fwd_in[m])
                    if nxt is not None:
                        sends.append(r.send(f"fwd/{me}>{nxt}", nxt))
                for m in range(micro):
                    if nxt is not None:
                        r.wait(bwd_in[m])
                    if prev is not None:
                        sends.append(r.send(f"bwd/{me}>{prev}", prev))
                last = r.wait(*sends)
                ar = r.coll(f"dp/s{s}", dp, thread="launcher", after=[last])
                r.wait(ar)
    return ranks


def kinds(report: Report) -> list[str]:
    return [f.kind for f in report.findings]


def only(report: Report, kind: str) -> str:
    """The message of the one finding, which must be of `kind`."""
    assert kinds(report) == [kind], report.findings
    return report.findings[0].message


# ------------------------------------------------------------------------------ clean


def test_clean_two_stages_two_replicas(tmp_path):
    micro, steps = 3, 2
    report = check(write(tmp_path, pipeline(stages=2, replicas=2, micro=micro, steps=steps)), model="streams")
    assert report.ok, report.findings
    # Per rank and step: micro recvs, micro sends, one all_reduce; micro + 2 waits.
    ops, waits = 4 * steps * (2 * micro + 1), 4 * steps * (micro + 2)
    assert (report.ranks, report.comms, report.ops, report.waits) == (4, 6, ops, waits)
    assert report.summary() == (f"commcheck: 4 ranks, 6 communicators, {ops} ops, {waits} waits: "
                                "clean under NCCL's rules")


def test_main_prints_summary_and_returns_status(tmp_path, capsys):
    clean = write(tmp_path / "clean", pipeline(2, 1, 2, 1))
    assert main(str(clean), "streams") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].endswith("clean under NCCL's rules")

    r0 = Rank(0)
    r0.send("p", 1)
    r0.send("p", 1, nbytes=8)
    r1 = Rank(1)
    r1.wait(r1.recv("p", 0, nbytes=16))
    assert main(str(write(tmp_path / "bad", [r0, r1]))) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("commcheck: mismatch: send #1 from 0 to 1 on p") and out[0].endswith("(+1 more)")
    assert out[1].startswith("  mismatch: ") and out[2].startswith("  deadlock: ")


# ------------------------------------------------------------------------------- P2P


def separate_or_batched(batched: bool) -> list[Rank]:
    """Two ranks, each posting recv then send to the other on one shared comm."""
    ranks = []
    for me, peer in ((0, 1), (1, 0)):
        r = Rank(me)
        if batched:
            seqs = r.batch("pair", {0, 1}, ("recv", peer, 64), ("send", peer, 64))
        else:
            seqs = [r.recv("pair", peer), r.send("pair", peer)]
        r.wait(*seqs)
        ranks.append(r)
    return ranks


def test_recv_then_send_as_separate_batches_deadlocks(tmp_path):
    message = only(check(write(tmp_path, separate_or_batched(batched=False)), model="streams"), "deadlock")
    assert message.startswith("rank 0 recv from 1 on pair (seq 0) waits: "
                              "rank 1's head on pair is recv from 0 (seq 0), ahead of send to 0 (seq 1)")
    assert "4 ops stuck in all: 4 issued, 0 never issued; 2 threads blocked" in message


def test_recv_and_send_in_one_batch_is_clean(tmp_path):
    report = check(write(tmp_path, separate_or_batched(batched=True)))
    assert report.ok, report.findings
    assert (report.ops, report.waits) == (4, 2)


def test_unmatched_trailing_send_never_completes(tmp_path):
    r0, r1 = Rank(0), Rank(1)
    r0.wait(r0.send("p", 1))
    r0.send("p", 1)  # nobody ever receives this one, and nobody waits on it
    r1.wait(r1.recv("p", 0))
    message = only(check(write(tmp_path, [r0, r1]), model="streams"), "deadlock")
    assert message.startswith("rank 0 send to 1 on p (seq 2) waits: "
                              "rank 1 never posts a matching recv from 0 on p (this is send #2)")
    assert "1 op stuck in all" in message and "0 threads blocked" in message


def test_p2p_size_mismatch(tmp_path):
    r0, r1 = Rank(0), Rank(1)
    r0.wait(r0.send("p", 1, nbytes=100))
    r1.coll("solo/1", [1])
    r1.wait(r1.recv("p", 0, nbytes=200))
    message = only(check(write(tmp_path, [r0, r1])), "mismatch")
    assert message == "send #1 from 0 to 1 on p: rank 0 sends 100 B (seq 0), rank 1 receives 200 B (seq 1)"


# ------------------------------------------------------------------------ collectives


def test_swapped_collectives_on_two_comms_deadlock(tmp_path):
    r0, r1 = Rank(0), Rank(1)
    for r, order in ((r0, "AB"), (r1, "BA")):
        for comm in order:
            r.wait(r.coll(comm, [0, 1]))
    message = only(check(write(tmp_path, [r0, r1]), model="streams"), "deadlock")
    assert message.startswith("rank 0 all_reduce on A [0, 1] (seq 0) waits: 1 of 2 members not there: "
                              "rank 1 has not issued all_reduce (seq 2): "
                              "thread main is blocked at wait (seq 1) on rank 1 all_reduce on B [0, 1] (seq 0)")


def test_swapped_sizes_on_one_comm_mismatch(tmp_path):
    r0, r1 = Rank(0), Rank(1)
    r0.wait(r0.coll("dp", [0, 1], nbytes=100), r0.coll("dp", [0, 1], nbytes=200))
    r1.coll("solo/1", [1])  # shifts rank 1's seqs, so the message must pick the right ones
    r1.wait(r1.coll("dp", [0, 1], nbytes=200), r1.coll("dp", [0, 1], nbytes=100))
    report = check(write(tmp_path, [r0, r1]))
    assert kinds(report) == ["mismatch", "mismatch"]
    assert report.findings[0].message == ("collective #1 on dp: all_reduce 100 B on rank 0 (seq 0); "
                                          "all_reduce 200 B on rank 1 (seq 1)")
    assert report.findings[1].message == ("collective #2 on dp: all_reduce 200 B on rank 0 (seq 1); "
                                          "all_reduce 100 B on rank 1 (seq 2)")


def test_op_name_mismatch_and_unknown_sizes(tmp_path):
    r0, r1 = Rank(0), Rank(1)
    r0.wait(r0.coll("c", [0, 1], op="broadcast_object", nbytes=None))
    r1.wait(r1.coll("c", [0, 1], op="broadcast_object", nbytes=40))  # null bytes are not compared
    r0.wait(r0.coll("c", [0, 1], op="all_reduce"))
    r1.wait(r1.coll("c", [0, 1], op="broadcast"))
    message = only(check(write(tmp_path, [r0, r1])), "mismatch")
    assert message == "collective #2 on c: all_reduce 1024 B on rank 0 (seq 2); broadcast 1024 B on rank 1 (seq 2)"


def test_collective_missing_on_one_member(tmp_path):
    ranks = [Rank(r) for r in range(3)]
    for r in ranks[:2]:
        r.wait(r.coll("dp", [0, 1, 2]))
    ranks[2].wait(ranks[2].coll("solo/2", [2]))  # rank 2 goes on without the all_reduce
    message = only(check(write(tmp_path, ranks), model="streams"), "deadlock")
    assert message.startswith("rank 0 all_reduce on dp [0, 1, 2] (seq 0) waits: 1 of 3 members not there: "
                              "rank 2 never reaches it (issues 0 collectives on dp; all its threads finished)")
    assert "2 ops stuck in all" in message


# --------------------------------------------------------------------- threads, after


def after_gated(cyclic: bool) -> list[Rank]:
    """Rank 0's engine waits on an all_reduce that its launcher issues only after the
    engine passed seq 0 (fine) or seq 2, which comes after that wait (a cycle)."""
    r0, r1 = Rank(0), Rank(1)
    if cyclic:
        ar = r0.coll("dp", [0, 1], thread="launcher", after=[2])
        r0.wait(ar, thread="engine")
        r0.coll("solo/0", [0], thread="engine")
    else:
        first = r0.coll("solo/0", [0], thread="engine")
        ar = r0.coll("dp", [0, 1], thread="launcher", after=[first])
        r0.wait(ar, thread="engine")
    r1.wait(r1.coll("dp", [0, 1]))  # completes only once rank 0's launcher issued its part
    return [r0, r1]


def test_wait_on_after_gated_op_of_another_thread(tmp_path):
    assert check(write(tmp_path / "ok", after_gated(cyclic=False))).ok
    message = only(check(write(tmp_path / "cycle", after_gated(cyclic=True)), model="streams"), "deadlock")
    assert message.startswith("rank 0 all_reduce on dp [0, 1] (seq 0) waits: seq 2 (all_reduce of thread engine), "
                              "which is never passed: thread engine is blocked at wait (seq 1) until seq 0 "
                              "(all_reduce of thread launcher) passes")


def test_one_comm_issued_from_two_threads(tmp_path):
    r0, r1 = Rank(0), Rank(1)
    r0.wait(r0.coll("dp", [0, 1], thread="a"), thread="a")
    r0.wait(r0.coll("dp", [0, 1], thread="b"), thread="b")
    r1.wait(r1.coll("dp", [0, 1]), r1.coll("dp", [0, 1]))
    message = only(check(write(tmp_path, [r0, r1])), "threads")
    assert message == "rank 0 issues on dp from 2 threads: 'a' (first seq 0), 'b' (first seq 2)"


# --------------------------------------------------------------------------- malformed


def two_clean_ranks() -> list[Rank]:
    r0, r1 = Rank(0), Rank(1)
    r0.wait(r0.send("p", 1))
    r1.wait(r1.recv("p", 0))
    return [r0, r1]


def test_bad_json_line_names_file_and_line(tmp_path):
    write(tmp_path, two_clean_ranks())
    with open(tmp_path / "rank-1.jsonl", "a") as f:
        f.write('{"seq": 2, "rank": 1,\n')
    message = only(check(tmp_path), "malformed")
    assert message.startswith("rank-1.jsonl:3: bad JSON")


@pytest.mark.parametrize("edit, expected", [
    (lambda line: line.pop("thread"), "rank-0.jsonl:1: missing field 'thread'"),
    (lambda line: line.update(seq=5), "rank-0.jsonl:2: seq 1 does not increase (previous 5)"),
    (lambda line: line.update(rank=1), "rank-0.jsonl:1: rank 1 in the log of rank 0"),
    (lambda line: line.update(peer=None), "rank-0.jsonl:1: send without a peer"),
    (lambda line: line.update(members=[0, 2]), "rank-0.jsonl:1: send peer 1 is not another member of p [0, 2]"),
])
def test_malformed_fields(tmp_path, edit, expected):
    ranks = two_clean_ranks()
    edit(ranks[0].lines[0])
    report = check(write(tmp_path, ranks))
    assert kinds(report)[0] == "malformed" and set(kinds(report)) == {"malformed"}
    assert report.findings[0].message == expected


def test_unknown_waited_seq(tmp_path):
    ranks = two_clean_ranks()
    ranks[1].wait(99)
    assert only(check(write(tmp_path, ranks)), "malformed") == "rank-1.jsonl:3: wait on unknown seq 99"


def test_members_disagree_and_member_without_log(tmp_path):
    r0, r1 = Rank(0), Rank(1)
    r0.wait(r0.coll("dp", [0, 1]))
    r1.wait(r1.coll("dp", [1, 3]))
    report = check(write(tmp_path, [r0, r1]))
    messages = [f.message for f in report.findings]
    assert set(kinds(report)) == {"malformed"}
    assert "rank-1.jsonl:1: dp has members [1, 3] here but [0, 1] on rank 0 (seq 0)" in messages
    assert "no log for rank 2 (rank-2.jsonl; ranks run to 3)" in messages
    assert "no log for rank 3 (rank-3.jsonl; a member of dp)" in messages


def test_missing_or_empty_directory(tmp_path):
    missing = check(tmp_path / "nope")
    assert not missing.ok and only(missing, "malformed").endswith("nope: no such directory")
    assert only(check(tmp_path), "malformed").endswith(": no rank-*.jsonl files")
    (tmp_path / "rank-x.jsonl").write_text("")
    assert only(check(tmp_path), "malformed") == "rank-x.jsonl: not named rank-R.jsonl with R a rank"


# ------------------------------------------------------------------------------- speed


def test_100k_events_over_8_ranks_is_fast(tmp_path):
    ranks = pipeline(stages=4, replicas=2, micro=8, steps=320)
    events = sum(len(r.lines) for r in ranks)
    assert 95_000 <= events <= 110_000
    write(tmp_path, ranks)
    t0 = time.perf_counter()
    report = check(tmp_path, model="streams")
    elapsed = time.perf_counter() - t0
    assert report.ok, report.findings[:3]
    assert report.ops + report.waits == events
    assert elapsed < 10, f"{elapsed:.1f} s"
