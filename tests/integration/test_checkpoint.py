"""Checkpoint and resume: a resumed 2BW run continues bitwise where an uninterrupted one
goes, under another policy too, and a torn checkpoint is passed over."""

import json

import pytest

from trirace.config import make_config
from trirace.obs.commcheck import check
from trirace.runtime import WorkerFailed, run_local

BASE = dict(model="gpt-test", data="synthetic", pp=2, dp=2, micro_batches=3, micro_batch_size=2, seq_len=16,
            progress=False, balance="params", partition="3,4")


def _losses(rows):
    return {r["step"]: r["loss"] for r in rows}


@pytest.mark.parametrize("schedule, optimizer", [("2bw", "adam"), ("1f1b", "muon")])
def test_resume_is_bitwise_identical(tmp_path, schedule, optimizer):
    ck = tmp_path / "ck"
    full = make_config(BASE, schedule=schedule, optimizer=optimizer, steps=7)
    first = make_config(BASE, schedule=schedule, optimizer=optimizer, steps=4, checkpoint_dir=ck, checkpoint_every=2)
    # Resumed under another policy: the checkpoint does not depend on it.
    resumed = make_config(BASE, schedule=schedule, optimizer=optimizer, steps=7, checkpoint_dir=ck, resume=True,
                          comm_policy="fifo", comm_log=tmp_path / "log-even")
    cfgs = [full, first, resumed]
    if schedule == "2bw":  # and at an odd step, where 2BW's two weight slots swap roles
        cfgs += [make_config(BASE, steps=3, checkpoint_dir=tmp_path / "ck3", checkpoint_every=1),
                 make_config(BASE, steps=7, checkpoint_dir=tmp_path / "ck3", resume=True, comm_policy="fifo",
                             comm_log=tmp_path / "log-odd")]
    a, b, c, *odd = run_local(cfgs, timeout_s=240)
    assert (ck / "step-000001").is_dir() and (ck / "step-000003").is_dir()
    whole, tail = _losses(a), _losses(c)
    assert sorted(tail) == [4, 5, 6]  # continued after the last checkpoint (step 3)
    for step, loss in tail.items():
        assert loss == whole[step], step
    assert _losses(b) == {s: whole[s] for s in range(4)}
    resumed_runs = [("even", c)] + ([("odd", odd[1])] if odd else [])
    if odd:
        assert _losses(odd[1]) == {s: whole[s] for s in range(3, 7)}
    for which, _ in resumed_runs:  # NCCL's rules hold after a resume too, on a strict device
        report = check(tmp_path / f"log-{which}")
        assert report.ok, report.summary()


def test_torn_checkpoint_is_ignored(tmp_path, capfd):
    ck = tmp_path / "ck"
    full = make_config(BASE, steps=6)
    first = make_config(BASE, steps=4, checkpoint_dir=ck, checkpoint_every=2)
    run_local([first], timeout_s=240)
    # A writer killed mid-step-3: one layer file missing, a temporary left behind.
    (ck / "step-000003" / "lm_head.pt").rename(ck / "step-000003" / "lm_head.pt.tmp123")
    resumed = make_config(BASE, steps=6, checkpoint_dir=ck, resume=True)
    typo = make_config(BASE, steps=2, checkpoint_dir=tmp_path / "ck-typo", resume="auto")
    capfd.readouterr()
    a, c, d = run_local([full, resumed, typo], timeout_s=240)
    tail = _losses(c)
    assert sorted(tail) == [2, 3, 4, 5]  # from the complete step-1 checkpoint
    for step, loss in tail.items():
        assert loss == _losses(a)[step]
    # Each resuming run says where it starts, once (rank 0): a typo must not restart silently.
    err = capfd.readouterr().err.splitlines()
    assert err.count(f"trirace: resuming from {ck / 'step-000001'} (step 2 of 6)") == 1
    assert err.count(f"trirace: no checkpoint in {tmp_path / 'ck-typo'}; training starts from step 0") == 1
    assert _losses(d) == {0: _losses(a)[0], 1: _losses(a)[1]}


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A checkpoint after 2 steps of BASE (read-only for the tests that share it)."""
    ck = tmp_path_factory.mktemp("two-steps") / "ck"
    run_local([make_config(BASE, steps=2, checkpoint_dir=ck)], timeout_s=240)
    return ck


def test_nothing_left_to_do_is_an_error(two_steps):
    from trirace.errors import UsageError

    ck = two_steps
    with pytest.raises(UsageError, match="already reaches --steps 2"):
        run_local([make_config(BASE, steps=2, checkpoint_dir=ck, resume=True)], timeout_s=240)
    with pytest.raises(UsageError, match="resume needs checkpoint_dir"):
        make_config(BASE, resume=True)


@pytest.mark.parametrize("rank, step", [(0, 1), (3, 2), (1, 3)])
def test_a_killed_rank_stops_the_job_without_a_hang(rank, step):
    """One rank of four dies mid-step: the job ends promptly, naming the rank and the step."""
    import time

    cfg = make_config(BASE, steps=6, kill=f"{rank}:{step}", fail_timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(WorkerFailed, match=f"rank {rank} was killed by signal 9 during step {step}"):
        run_local([cfg], timeout_s=120)
    assert time.monotonic() - t0 < 60


def test_a_stalled_peer_times_out_under_torchrun(tmp_path):
    """Without the local supervisor (torchrun, where each rank is on its own), the others give
    up after fail_timeout_s and say where they stopped. Rank 2 stalls: a 60 s straggler."""
    import subprocess
    import sys
    import time

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                        "-m", "trirace", "train", "--model", "gpt-test", "--data", "synthetic", "--seq-len", "16",
                        "--micro-batch-size", "2", "--micro-batches", "3", "--balance", "params", "--steps", "4",
                        "--no-progress", "--straggler", "2:60", "--fail-timeout-s", "5"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode != 0
    assert time.monotonic() - t0 < 90
    assert "stopped during step" in p.stderr


def test_torchrun_restarts_and_resumes(tmp_path):
    """Under torchrun --max-restarts 1 a rank killed at step 3 brings the job back, which
    resumes from the last complete checkpoint and ends with an uninterrupted run's losses."""
    import json
    import subprocess
    import sys

    args = ["--model", "gpt-test", "--data", "synthetic", "--seq-len", "16", "--micro-batch-size", "2",
            "--micro-batches", "3", "--partition", "3,4", "--steps", "5", "--no-progress"]
    out, ref = tmp_path / "m.jsonl", tmp_path / "ref.jsonl"
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    p = subprocess.run([*run, "--max-restarts", "1", "-m", "trirace", "train", *args, "--kill", "1:3",
                        "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "1",
                        "--metrics-out", str(out)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    q = subprocess.run([*run, "-m", "trirace", "train", *args, "--metrics-out", str(ref)],
                       capture_output=True, text=True, timeout=240)
    assert q.returncode == 0, q.stderr[-3000:]
    resumed = {r["step"]: r["loss"] for r in map(json.loads, out.read_text().splitlines())}
    whole = {r["step"]: r["loss"] for r in map(json.loads, ref.read_text().splitlines())}
    assert sorted(whole) == list(range(5))  # the plain run under torchrun (env:// rendezvous, gloo, 4 ranks)
    assert max(resumed) == 4 and min(resumed) >= 1  # the restarted attempt began after a checkpoint
    assert all(resumed[s] == whole[s] for s in resumed)


def test_a_checkpoint_of_another_format_is_refused_in_one_line(two_steps, tmp_path, capsys):
    import shutil

    from trirace.cli import main

    ck = tmp_path / "ck"
    shutil.copytree(two_steps, ck)
    meta = ck / "step-000001" / "meta.json"
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "format"}))
    code = main(["train", "--model", "gpt-test", "--data", "synthetic", "--micro-batches", "3", "--seq-len", "16",
                 "--micro-batch-size", "2", "--partition", "3,4", "--steps", "4", "--no-progress",
                 "--checkpoint-dir", str(ck), "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "has format None; this trirace reads format 2 (one file per layer)" in err[0]
