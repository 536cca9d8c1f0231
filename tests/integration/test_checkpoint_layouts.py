"""Layout-free checkpoints: a checkpoint written at pp=2 x dp=2 resumes at pp=4 x dp=1,
pp=1 x dp=4 and pp=2 x dp=2 with another partition and rank order (1f1b's there under
gpipe), continuing an uninterrupted run's losses (bitwise where the layout is the same),
under 1f1b with AdamW and under 2bw with Muon and weight prediction (so both weight buffers
differ from the master weights and both must come back). Then what `trirace checkpoint
info` and a resume refuse."""

import json
import shutil

import pytest

from trirace.cli import main
from trirace.config import make_config
from trirace.runtime import run_local

# Per replica: 2 micro-batches of 2 at dp=2, so 4 micro-batches per step at every layout.
BASE = dict(model="gpt-test", data="synthetic", pp=2, dp=2, micro_batches=2, micro_batch_size=2, seq_len=16,
            progress=False, balance="params", partition="3,4", steps=8)
RUNS = {"1f1b-adamw": dict(schedule="1f1b", optimizer="adamw", weight_decay=0.1),
        "2bw-muon": dict(schedule="2bw", optimizer="muon", delay_compensation="predict")}
# Each resumed layout: same global batch (dp x micro_batches = 4), another cut of the 7 layers.
LAYOUTS = {"same": dict(),
           "pp4": dict(pp=4, dp=1, micro_batches=4, partition="2,2,2,1"),
           "pp1": dict(pp=1, dp=4, micro_batches=1, partition="7"),
           "cut": dict(partition="5,2", rank_order="pp-inner")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Uninterrupted 8-step runs that checkpoint after steps 3 and 7, then every layout
    resumed from a copy of step 3 (each copy its own directory: a resumed run saves too)."""
    tmp = tmp_path_factory.mktemp("layouts")
    full = run_local([make_config(BASE, **opts, checkpoint_dir=tmp / name, checkpoint_every=4)
                      for name, opts in RUNS.items()], timeout_s=240)
    cfgs = {}
    for name, opts in RUNS.items():
        for where, layout in LAYOUTS.items():
            ck = tmp / f"{name}-{where}"
            shutil.copytree(tmp / name / "step-000003", ck / "step-000003")
            # gpipe computes 1f1b's updates with the same single weight version: it resumes too.
            other = dict(schedule="gpipe") if (name, where) == ("1f1b-adamw", "cut") else {}
            cfgs[name, where] = make_config(BASE, **{**opts, **other}, **layout, checkpoint_dir=ck, resume="require")
    resumed = run_local(list(cfgs.values()), timeout_s=240)
    return tmp, dict(zip(RUNS, full)), dict(zip(cfgs, resumed))


@pytest.mark.parametrize("name", RUNS)
def test_every_layout_continues_the_uninterrupted_run(runs, name):
    _, full, resumed = runs
    whole = {r["step"]: r["loss"] for r in full[name]}
    assert sorted(whole) == list(range(8))
    for where in LAYOUTS:
        tail = {r["step"]: r["loss"] for r in resumed[name, where]}
        assert sorted(tail) == [4, 5, 6, 7], where
        if where == "same":
            assert tail == {s: whole[s] for s in tail}  # bitwise
        else:
            for s, loss in tail.items():
                assert abs(loss - whole[s]) <= 1e-6 * abs(whole[s]), (where, s, loss, whole[s])
    # The delay is real under 2bw (step t computes on W(t-1)): losses that matched only
    # because nothing moved would prove nothing.
    assert len(set(whole.values())) == 8


def test_a_resharded_run_writes_a_checkpoint_any_layout_reads(runs, capsys):
    """What other layouts save at step 7 holds the same layers as the pp=2 x dp=2 run's own
    step 7: bitwise the same tensors where only the partition and rank order changed (the
    reduction order is dp's), and every weight version, master weight and optimizer state
    at pp=1 x dp=4 (whose values differ in the last bits, amplified by Muon's bf16
    orthogonalisation and Adam's tiny moments of rare tokens' rows)."""
    import torch

    tmp, _, _ = runs
    a = tmp / "2bw-muon" / "step-000007"
    cut, pp1 = tmp / "2bw-muon-cut" / "step-000007", tmp / "2bw-muon-pp1" / "step-000007"
    metas = [json.loads((d / "meta.json").read_text()) for d in (a, cut, pp1)]
    assert metas[0]["layers"] == metas[1]["layers"] == metas[2]["layers"] == [
        "embedding", "block0", "block1", "block2", "block3", "final_norm", "lm_head"]
    assert metas[2]["written_by"] == {"pp": 1, "dp": 4, "partition": [7], "rank_order": "auto"}
    for name in metas[0]["layers"]:
        x, y, z = (torch.load(d / f"{name}.pt", weights_only=True) for d in (a, cut, pp1))
        assert len(x["versions"]) == len(z["versions"]) == 2
        assert x["master"].keys() == z["master"].keys() == x["optimizer"].keys() == z["optimizer"].keys()
        for k, w in x["master"].items():
            assert torch.equal(w, y["master"][k]) and w.shape == z["master"][k].shape, (name, k)
            for v in range(2):
                assert torch.equal(x["versions"][v][k], y["versions"][v][k]), (name, k, v)
            for s, t in x["optimizer"][k].items():
                assert torch.equal(t, y["optimizer"][k][s]), (name, k, s)
    assert main(["checkpoint", "info", str(tmp / "2bw-muon")]) == 0
    out = capsys.readouterr().out
    assert f"{a}: step 7, complete; a resume continues at step 8" in out
    assert "model gpt-test, optimizer muon" in out and "weight versions 2 (schedule 2bw)" in out
    assert "7 layers," in out and "  lm_head " in out


def _one_line_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


TRAIN = ["train", "--data", "synthetic", "--micro-batches", "2", "--micro-batch-size", "2", "--seq-len", "16",
         "--steps", "9", "--no-progress", "--resume"]


def test_bad_checkpoints_are_refused_in_one_line(runs, tmp_path, capsys):
    src, _, _ = runs
    ck = tmp_path / "ck"
    shutil.copytree(src / "1f1b-adamw", ck)
    # Another model, another optimizer, another weight-version count: each before any process starts.
    line = _one_line_error(capsys, [*TRAIN, "--model", "llama-test", "--checkpoint-dir", str(ck)])
    assert "is for model='gpt-test', this run has model='llama-test'" in line
    line = _one_line_error(capsys, [*TRAIN, "--model", "gpt-test", "--schedule", "1f1b", "--optimizer", "muon",
                                    "--checkpoint-dir", str(ck)])
    assert "is for optimizer='adamw', this run has optimizer='muon'" in line
    line = _one_line_error(capsys, [*TRAIN, "--model", "gpt-test", "--optimizer", "adamw",
                                    "--checkpoint-dir", str(ck)])
    assert "holds 1 weight version(s) (schedule 1f1b), this run's schedule 2bw keeps 2: resume with --schedule 1f1b" \
        in line
    # A missing layer file: the newest step is passed over; with none complete, one line.
    (ck / "step-000007" / "block2.pt").unlink()
    assert main(["checkpoint", "info", str(ck)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{ck / 'step-000003'}: step 3, complete")
    assert f"{ck / 'step-000007'}: incomplete (block2.pt missing); a resume passes over it" in out
    line = _one_line_error(capsys, ["checkpoint", "info", str(ck / "step-000007")])
    assert line == f"trirace: error: checkpoint {ck / 'step-000007'} is incomplete: block2.pt missing"
    shutil.rmtree(ck / "step-000003")
    line = _one_line_error(capsys, [*TRAIN, "--model", "gpt-test", "--schedule", "1f1b", "--optimizer", "adamw",
                                    "--checkpoint-dir", str(ck)])
    assert line.endswith(f"checkpoint {ck / 'step-000007'} is incomplete (block2.pt missing) and no earlier "
                         "step is complete")
    assert _one_line_error(capsys, ["checkpoint", "info", str(tmp_path)]).endswith(
        f"{tmp_path}: not a trirace checkpoint (no step-NNNNNN/meta.json)")

