"""Hugging Face directories and exports refused in one line, before anything runs."""

import json
import shutil

import pytest
import torch
from hf_models import write_models  # noqa: E402

from trirace.cli import main  # noqa: E402


transformers = pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Both families saved by transformers, each with a tokenizer.json, and a text corpus."""
    return write_models(tmp_path_factory.mktemp("hf"))


def _one_line_exit_2(capsys, argv, why):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and why in err, err


def test_bad_directories_and_exports(made, tmp_path, capsys):
    train = ["train", "--data", "synthetic", "--dry-run"]
    _one_line_exit_2(capsys, [*train[:1], "--model", f"hf:{tmp_path}", *train[1:]], "no config.json")
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10}))
    _one_line_exit_2(capsys, [*train[:1], "--model", f"hf:{bert}", *train[1:]], "unsupported architecture")
    wrong = tmp_path / "wrong"
    shutil.copytree(made / "llama", wrong)
    config = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    _one_line_exit_2(capsys, [*train[:1], "--model", f"hf:{wrong}", *train[1:]], "has shape")
    bare = tmp_path / "bare"  # config only: a random init of that shape
    bare.mkdir()
    shutil.copy(made / "llama" / "config.json", bare / "config.json")
    assert main([*train[:1], "--model", f"hf:{bare}", *train[1:]]) == 0
    capsys.readouterr()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    _one_line_exit_2(capsys, [*train[:1], "--model", "gpt-test", "--export-hf", str(full), *train[1:]],
                     "--overwrite")
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    _one_line_exit_2(capsys, [*train[:1], "--model", "bert-test", "--export-hf", str(tmp_path / "x"), *train[1:]],
                     "export_hf")
    assert main([*train[:1], "--model", "gpt-test", "--export-hf", str(full), "--overwrite", *train[1:]]) == 0
