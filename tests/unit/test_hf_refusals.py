"""Hugging Face directories and exports refused in one line, before anything runs."""

import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from trirace.cli import main  # noqa: E402


transformers = pytest.importorskip("transformers")

TEXT = "".join(f"def add_{i}(a, b):\n    return a + b * {i % 7}\n\n" for i in range(600))


def _tokenizer(vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    return tok


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Both families saved by transformers, each with a tokenizer.json, and a text corpus."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=160, max_position_embeddings=64, bos_token_id=0, eos_token_id=0))
    tok = _tokenizer(512)
    for name, m in (("gpt2", gpt), ("llama", llama)):
        m.save_pretrained(root / name)
        tok.save(str(root / name / "tokenizer.json"))
    (root / "corpus.txt").write_text(TEXT)
    return root


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
