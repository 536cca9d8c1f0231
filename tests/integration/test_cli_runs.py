"""The command line run end to end: processes start, under the local launcher and torchrun."""

import json
import os
import subprocess
import sys

import pytest


QUICK = ["--model", "gpt-test", "--data", "synthetic", "--micro-batch-size", "2", "--seq-len", "16",
         "--balance", "params", "--no-progress"]


def test_workers_that_exit_0_without_metrics_fail_the_job():
    """An empty run must not pass for a run: tests compare losses run_local returns."""
    from trirace.config import make_config
    from trirace.runtime import WorkerFailed, run_local

    cfg = make_config(dict(model="gpt-test", data="synthetic", steps=1, balance="params", progress=False))
    with pytest.raises(WorkerFailed, match="job 0 ended without the reporter rank's metrics"):
        run_local([cfg], timeout_s=60, rank_command=lambda r: ["true"])  # each rank exits 0 at once


def test_world_size_mismatch_under_torchrun(tmp_path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="3", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    p = subprocess.run([sys.executable, "-m", "trirace", "train", *QUICK], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip() == "trirace: error: pp x dp = 2 x 2 = 4 but torchrun started 3 ranks"


def test_yaml_and_flags_combine(tmp_path):
    """Flags override the YAML file, which overrides defaults; the run writes its metrics."""
    f = tmp_path / "c.yaml"
    f.write_text("steps: 2\nschedule: gpipe\nmicro-batches: 3\n")
    out = tmp_path / "m.jsonl"
    p = subprocess.run([sys.executable, "-m", "trirace", "train", *QUICK, "--config", str(f), "--schedule",
                        "1f1b", "--metrics-out", str(out)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert {r["schedule"] for r in rows} == {"1f1b"}
    for r in rows:
        assert {"loss", "step_time_s", "tokens_per_s", "pp", "dp"} <= r.keys()
        assert r["tokens_per_s"] == pytest.approx(2 * 3 * 2 * 16 / r["step_time_s"])
    assert "final loss" in p.stdout
