"""A real run's comm log replayed under the strict device model: a 2x1 2bw trirace job is
clean, and the engine it replaced (receives posted ahead of the sends their peer needs
first, a device sync after every compute action), planted into the same log, deadlocks
there while gloo's per-communicator model forgives it. The log also shows what only a
device cares about: host reads, compute, dtypes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trirace.config import make_config
from trirace.obs.commcheck import check
from trirace.runtime import run_local


@pytest.fixture(scope="module")
def log_2x1(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("commlog") / "2x1-2bw-trirace"
    cfg = make_config(dict(model="gpt-test", data="synthetic", pp=2, dp=1, steps=3, micro_batch_size=2, seq_len=32,
                           progress=False, schedule="2bw", comm_policy="trirace"), comm_log=d)
    (rows,) = run_local([cfg], timeout_s=240)
    assert len(rows) == 3
    return d


def _rows(d: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (d / f"rank-{rank}.jsonl").read_text().splitlines()]


def test_the_log_records_device_events_and_metadata(log_2x1):
    for rank in (0, 1):
        rows = _rows(log_2x1, rank)
        assert rows[0] == {"format": 2}
        # Compute actions (F0, B0, OPT0, ...) and the gradient norm's kernel (norm0, ...).
        computes = [r for r in rows if r.get("op") == "compute" and not r["action"].startswith("norm")]
        assert computes and not [r for r in rows if r.get("op") == "sync"]  # compute is timed without a device sync
        assert {r["action"][0] for r in computes} >= {"F", "B", "O"}  # forward, backward, OPT
        assert [r["action"] for r in rows if r.get("op") == "compute" and r["action"].startswith("norm")] == \
            ["norm0", "norm1", "norm2"]
        p2p = [r for r in rows if r.get("op") in ("send", "recv")]
        assert p2p and all(r["dtype"] == "float32" for r in p2p)
        for r in rows:
            if r.get("comm") in ("control", "norm"):
                assert r["host"] is True  # gloo under every backend: never on the device
        reduces = [r for r in rows if r.get("op") == "all_reduce"]
        assert reduces and all(r["reduce_op"] == "sum" for r in reduces)
        # Host reads once per step for the norm (and on the last stage its losses), and once
        # for the step's compute timing: nothing per micro-batch.
        reads = [r["where"] for r in rows if r.get("op") == "host_read"]
        assert sorted(reads) == sorted([f"gradnorm and losses of step {t} .tolist()" for t in range(3)]
                                       + [f"compute timing of step {t} (an event on the compute stream)"
                                          for t in range(3)]), reads


def _renumbered(rows: list[dict]) -> list[dict]:
    """Rows in this order with seqs 0.. again (and the batches and waits naming them); a
    row without a seq (the format line) stays as it is."""
    new = {r["seq"]: i for i, r in enumerate(r for r in rows if "seq" in r)}
    for r in rows:
        for key in ("seq", "batch"):
            if key in r:
                r[key] = new[r[key]]
        for key in ("waits", "after"):
            if key in r:
                r[key] = [new[x] for x in r[key]]
    return rows


def _rewritten(src: Path, dst: Path, change) -> Path:
    dst.mkdir()
    for f in src.glob("rank-*.jsonl"):
        rows = change(f.name, [json.loads(line) for line in f.read_text().splitlines()])
        (dst / f.name).write_text("".join(json.dumps(row) + "\n" for row in _renumbered(rows)))
    return dst


def _planted_syncs(src: Path, dst: Path) -> Path:
    """The log as an engine that synchronised the device after every compute action would
    have written it: a sync event after each."""
    def change(_name: str, rows: list[dict]) -> list[dict]:
        out = []
        for row in rows:
            out.append(row)
            if row.get("op") == "compute" and not row["action"].startswith("norm"):
                out.append({"op": "sync", "where": f"after {row['action']}", "seq": row["seq"] + 0.5,
                            "rank": row["rank"], "thread": row["thread"]})
        return out
    return _rewritten(src, dst, change)


def _posted_ahead(src: Path, dst: Path) -> Path:
    """The log as an engine that posts stage 0's first backward receive ahead, before its
    first forward, would have written it: RB0 leaves its run and becomes a batch of its
    own in front of F0."""
    def change(name: str, rows: list[dict]) -> list[dict]:
        if name == "rank-0.jsonl":
            first = next(i for i, r in enumerate(rows) if r.get("op") == "compute")  # F0, after the warm-up
            recv = next(i for i, r in enumerate(rows) if r.get("op") == "recv" and i > first)
            row = rows.pop(recv)
            row["batch"] = row["seq"]
            rows.insert(first, row)
        return rows
    return _rewritten(src, dst, change)


def test_the_log_is_clean_and_the_old_engine_planted_into_it_deadlocks(log_2x1, tmp_path):
    """Clean under the strict model; with a receive posted ahead, the device holds it in
    front of F0 and SF0, which stage 1 needs before it can send what the receive waits for;
    with a sync after every compute action too, the sync waits for that receive."""
    assert check(log_2x1).ok, check(log_2x1).summary()

    ahead = _posted_ahead(log_2x1, tmp_path / "ahead")
    # On one communicator per pipeline even NCCL's in-order stream per communicator holds
    # the receive in front of the send (gloo, which matches by peer and tag, forgives it).
    assert not check(ahead, model="streams").ok
    message = check(ahead).findings[0].message
    assert message.startswith("ranks 0, 1 wait on each other: rank 0's recv from 1 on pipe/r0 (seq "), message

    report = check(_planted_syncs(ahead, tmp_path / "synced"))
    assert [f.kind for f in report.findings] == ["deadlock"], report.findings
    message = report.findings[0].message
    assert "syncs the device" in message and "which is behind recv from 1 on pipe/r0 (seq " in message, message
