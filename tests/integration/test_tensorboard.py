"""--tensorboard DIR: every step's metrics as TensorBoard scalars, read back with
tensorboard's own reader; without the package, one line before anything starts."""

import os
import subprocess
import sys

import pytest

from trirace.config import make_config
from trirace.runtime import run_local

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_every_scalar_of_every_step_is_written(tmp_path):
    board = tmp_path / "tb"
    cfg = make_config(model="gpt-test", data="synthetic", pp=2, dp=2, steps=4, micro_batch_size=2, seq_len=32,
                      progress=False, balance="params", eval_every=2, eval_batches=1, tensorboard=board)
    (rows,) = run_local([cfg], timeout_s=240)
    acc = event_accumulator.EventAccumulator(str(board), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    every_step = {"train/loss", "train/lr", "train/grad_norm", "speed/tokens_per_s", "speed/step_time_s",
                  "speed/compute_s", "comm/exposed_p2p_s", "comm/exposed_allreduce_s", "comm/exposed_sparse_s",
                  "memory/peak_rss_mb_max_rank"}
    assert every_step | {"val/loss", "val/perplexity"} <= tags, tags
    for tag in every_step:
        assert [e.step for e in acc.Scalars(tag)] == [0, 1, 2, 3], tag
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([r["loss"] for r in rows], rel=1e-6)
    assert [e.step for e in acc.Scalars("val/loss")] == [1, 3]  # after every 2 steps and the last
    assert [e.value for e in acc.Scalars("val/loss")] == pytest.approx([rows[1]["val_loss"], rows[3]["val_loss"]],
                                                                       rel=1e-6)


def test_without_the_package_the_flag_is_one_line(tmp_path):
    """A `tensorboard` module that cannot be imported stands for a machine without it."""
    stub = tmp_path / "stub" / "tensorboard"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no tensorboard here')\n")
    path = os.pathsep.join(filter(None, [str(tmp_path / "stub"), os.environ.get("PYTHONPATH")]))
    p = subprocess.run([sys.executable, "-m", "trirace", "train", "--model", "gpt-test", "--data", "synthetic",
                        "--tensorboard", str(tmp_path / "tb"), "--dry-run"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": path})
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "tensorboard: needs the tensorboard package: pip install 'trirace[tensorboard]'" in p.stderr
    assert not (tmp_path / "tb").exists()
