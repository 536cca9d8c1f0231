"""Prepared corpora and nanoGPT .bin files with real processes: a prepare interrupted and run
again equals a clean one; training runs on both; a resumed process draws the micro-batches
an uninterrupted run draws; evaluation leaves the training losses as they were."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data_corpus import text
from trirace.config import make_config
from trirace.data.batches import sampler_for
from trirace.data.prepare import prepare
from trirace.data.shards import INDEX, PARTIAL
from trirace.runtime import run_local

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["--model", "gpt-test", "--pp", "2", "--dp", "1", "--micro-batches", "2", "--micro-batch-size", "2",
         "--seq-len", "16", "--balance", "params", "--no-progress"]


def _trirace(*argv: str, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trirace", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("src")
    for i in range(6):
        (root / f"doc{i}.txt").write_text(text(250_000, 100 + i))
    return root


@pytest.fixture(scope="module")
def prepared(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "out"
    prepare(str(source), str(out), vocab=1024, shard_bytes=50_000, progress=False)
    return out


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_interrupted_prepare_goes_on_to_what_a_clean_one_writes(source: Path, prepared: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["data", "prepare", str(source), "--out", str(out), "--vocab", "1024", "--shard-mb", "0.05",
            "--workers", "1", "--no-progress"]
    p = subprocess.Popen([sys.executable, "-m", "trirace", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / ".shard-00002.bin.json").exists():  # three shards done, ~27 to go
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "run the same command again to go on" in err
    assert not (out / INDEX).exists() and (out / PARTIAL).exists()
    assert not list(out.glob(".*.tmp"))
    refused = _trirace("train", *TRAIN, "--steps", "1", "--data", str(out))
    assert refused.returncode == 2 and "an unfinished trirace data prepare" in refused.stderr

    again = _trirace(*argv)
    assert again.returncode == 0, again.stderr
    kept = int(again.stdout.split(" shard(s) kept")[0].rsplit(" ", 1)[1])
    assert kept >= 3
    assert _files(out) == _files(prepared)  # the same shards, index and tokenizer, byte for byte


def test_training_runs_on_a_prepared_directory(prepared: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    p = _trirace("train", *TRAIN, "--steps", "3", "--data", str(prepared), "--eval-every", "2", "--eval-batches", "1",
                 "--metrics-out", str(metrics))
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(np.isfinite(r["loss"]) for r in rows) and rows[-1]["val_loss"] is not None


def test_nanogpt_bin_files_train(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rng.integers(3, 2048, 200_000).astype(np.uint16).tofile(tmp_path / "train.bin")
    rng.integers(3, 2048, 20_000).astype(np.uint16).tofile(tmp_path / "val.bin")
    metrics = tmp_path / "m.jsonl"
    p = _trirace("train", *TRAIN, "--steps", "2", "--data", str(tmp_path / "train.bin"), "--eval-every", "1",
                 "--eval-batches", "1", "--metrics-out", str(metrics))
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(rows) == 2 and all(r["val_loss"] is not None for r in rows)


_DRAW = """
import hashlib, sys
from trirace.config import make_config
from trirace.data.batches import sampler_for
cfg = make_config(dict(model="gpt-test", data=sys.argv[1], pp=1, dp=2, micro_batches=3, micro_batch_size=2,
                       seq_len=16, progress=False))
sampler = sampler_for(cfg)
for step in range(int(sys.argv[2]), int(sys.argv[3])):
    for index in range(cfg.parallel.dp * cfg.parallel.micro_batches):
        x, y = sampler.micro_batch(step, index)
        print(step, index, hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest())
"""


def test_a_resumed_process_draws_the_uninterrupted_micro_batches(prepared: Path) -> None:
    """The engine asks for (global step, index) (runtime/engine.py: _global_index); a run
    resumed at step 3, in a process of its own, gets the very ids of the run that went on."""
    def draw(first: int, last: int) -> list[str]:
        p = subprocess.run([sys.executable, "-c", _DRAW, str(prepared), str(first), str(last)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()

    uninterrupted, resumed = draw(0, 6), draw(3, 6)
    assert len(resumed) == 3 * 6 and resumed == uninterrupted[3 * 6:]
    assert len(set(line.split()[2] for line in uninterrupted)) == len(uninterrupted)  # every draw differs


def test_evaluation_does_not_change_the_training_losses(prepared: Path) -> None:
    base = dict(model="gpt-test", data=str(prepared), pp=2, dp=1, micro_batches=2, micro_batch_size=2, seq_len=16,
                steps=3, progress=False, balance="params", schedule="1f1b")
    off, on = run_local([make_config(base), make_config(base, eval_every=1, eval_batches=1)], timeout_s=240)
    assert [r["loss"] for r in off] == [r["loss"] for r in on]
    assert all(r["val_loss"] is not None for r in on) and all(r.get("val_loss") is None for r in off)
