"""A real run's comm log replayed under the strict device model: a 2x1 2bw trirace job
still deadlocks on a device through the receives it posts ahead, while gloo (and the
per-communicator model) forgive it. The log also shows what only a device cares about:
host reads, compute, dtypes."""

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


def _planted_syncs(src: Path, dst: Path) -> Path:
    """The log as an engine that synchronised the device after every compute action would
    have written it: a sync event after each, and every sequence number after it shifted."""
    dst.mkdir()
    for f in src.glob("rank-*.jsonl"):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        out, shift, new_seq = [], 0, {}
        for row in rows:
            if "seq" in row:
                new_seq[row["seq"]] = row["seq"] + shift
            out.append(row)
            if row.get("op") == "compute" and not row["action"].startswith("norm"):
                shift += 1
                out.append({"op": "sync", "where": f"after {row['action']}", "seq": row["seq"] + shift,
                            "rank": row["rank"], "thread": row["thread"]})
        for row in out:
            if row.get("op") == "sync":
                continue
            for key in ("seq", "batch"):
                if key in row:
                    row[key] = new_seq[row[key]]
            for key in ("waits", "after"):
                if key in row:
                    row[key] = [new_seq[x] for x in row[key]]
        (dst / f.name).write_text("".join(json.dumps(row) + "\n" for row in out))
    return dst


def test_a_device_sync_after_compute_deadlocks_and_the_posted_receives_still_do(log_2x1, tmp_path):
    """A sync after compute waits for every stream of the device, the receives stage 0
    posted ahead (driver.RECV_AHEAD) included; they wait for stage 1's backward, which waits
    for F0's activations, which stage 0 sends only after the sync. The engine times compute
    without that sync now, but the posted receives alone still close a cycle on the device:
    this passes with a clean report once each receive is batched with, or launched after,
    the send that precedes it in the schedule (issue 51, item 1)."""
    report = check(_planted_syncs(log_2x1, tmp_path / "synced"))
    assert [f.kind for f in report.findings] == ["deadlock"], report.findings
    message = report.findings[0].message
    assert message.startswith("ranks 0, 1 wait on each other: rank 0 MainThread syncs the device (seq ")
    assert ", after F0) for F0 (seq " in message
    assert "which is behind recv from 1 on bwd/1>0 (seq " in message

    assert check(log_2x1, model="streams").ok  # what gloo checks per communicator: nothing wrong

    message = check(log_2x1).findings[0].message
    assert message.startswith("ranks 0, 1 wait on each other: rank 0's recv from 1 on bwd/1>0 (seq ")
    assert "rank 0's send to 1 on fwd/0>1 (seq " in message and "which is behind recv from 1 on bwd/1>0" in message
