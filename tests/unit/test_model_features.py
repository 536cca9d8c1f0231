"""Model features checked in one process: bad shape files and values, Muon's parameter split, rotary attention."""

import pytest

from trirace.cli import main
from trirace.config import make_config


BASE = dict(model="gpt-test", data="synthetic", pp=2, dp=2, micro_batches=4, micro_batch_size=2, seq_len=16,
            progress=False, balance="params")

QUICK = ["--model", "gpt-test", "--data", "synthetic", "--micro-batch-size", "2", "--seq-len", "16",
         "--balance", "params", "--no-progress"]


@pytest.mark.parametrize("flags", [
    ["--lr", "inf"], ["--lr", "nan"], ["--weight-decay", "-1"], ["--lr-schedule", "step"],
    ["--warmup-steps", "-1"], ["--min-lr", "1"], ["--clip-grad", "0"], ["--clip-grad", "nan"],
    ["--on-nonfinite", "ignore"], ["--precision", "fp16"], ["--grad-comm-dtype", "int8"],
    ["--eval-every", "-1"], ["--eval-batches", "0"], ["--clip-grad", "1", "--tie-embeddings"],
    ["--optimizer", "lamb"],
])
def test_bad_values_are_one_line_and_exit_2(flags, capsys):
    assert main(["train", *QUICK, *flags, "--dry-run"]) == 2, flags
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("trirace: error:"), err


def test_rotary_attention_sees_only_relative_positions():
    """Rotary embeddings: the score of query position i against key position j depends
    only on i - j, so shifting both leaves it unchanged (and a shift of one alone does not)."""
    import torch

    from trirace.models.layers import _rotate, rotary_tables

    cos, sin = rotary_tables(16, 64, 10000.0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(16, generator=g), torch.randn(16, generator=g)

    def score(i, j):
        return float(_rotate(q, cos[i], sin[i]) @ _rotate(k, cos[j], sin[j]))

    assert score(3, 1) == pytest.approx(score(40, 38), rel=1e-5)
    assert abs(score(3, 1) - score(3, 2)) > 1e-3


@pytest.mark.parametrize("shape, why", [
    ("arch: llama\nvocab_size: 2048\nd_model: 100\nn_layers: 2\nn_heads: 6\nmax_seq_len: 64\n", "does not divide"),
    ("arch: gpt\nvocab_size: 2048\nd_model: 64\nn_layers: 2\nn_heads: 4\nn_kv_heads: 2\nmax_seq_len: 64\n",
     "n_kv_heads"),
    ("arch: llama\nvocab_size: 2048\nd_model: 64\nn_layers: 2\nn_heads: 4\nn_kv_heads: 3\nmax_seq_len: 64\n",
     "does not divide"),
    ("arch: t5\nvocab_size: 2048\nd_model: 64\nn_layers: 2\nn_heads: 4\nmax_seq_len: 64\n", "arch"),
    ("arch: gpt\nvocab_size: 2048\nd_model: 64\nn_layers: 2\nn_heads: 4\nmax_seq_len: 64\nwidth: 3\n", "unknown key"),
])
def test_bad_shape_files_are_one_line_and_exit_2(tmp_path, capsys, shape, why):
    f = tmp_path / "shape.yaml"
    f.write_text(shape)
    assert main(["train", "--model", str(f), "--data", "synthetic", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and why in err, err


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    """Muon orthogonalises 2-D updates: the blocks' weight matrices. The token table,
    positions, head and every norm and bias stay with AdamW, on every stage's slice."""
    from trirace.models import build_model
    from trirace.optim import MuonAdamW, make_optimizer, muon_matrices

    cfg = make_config(BASE, optimizer="muon")
    model = build_model(cfg.spec, 0)
    layers = list(model)
    ids = muon_matrices(layers, 0, len(layers))
    names = {n for n, p in model.named_parameters() if id(p) in ids}
    assert names and all(n.endswith(".weight") and not n.startswith(("0.", f"{len(layers) - 1}.")) for n in names)
    assert {n for n, p in model.named_parameters() if p.ndim == 2} - names == {
        n for n, p in model.named_parameters() if p.ndim == 2 and n.startswith(("0.", f"{len(layers) - 1}."))}
    # A stage's slice sees the same split as the whole model.
    tail = muon_matrices(layers[2:], 2, len(layers))
    assert tail == {i for i in ids if any(i == id(p) for layer in layers[2:] for p in layer.parameters())}
    opt = make_optimizer(list(model.parameters()), "muon", 1e-3, 0.01, ids)
    assert isinstance(opt, MuonAdamW) and [type(o).__name__ for o in opt.parts] == ["Muon", "AdamW"]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    with pytest.raises(ValueError, match="Muon"):
        opt.load_state_dict({"parts": [{}]})
