"""trirace data prepare and the corpora read by memory map (prepared directories, nanoGPT
.bin files), on real files: the ids equal start-up tokenising, shards and index agree, the
held-out split does not move the training draw, and bad input is one line and exit 2."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from data_corpus import jsonl, text, text_dir, word_tokenizer
from trirace.cli import main
from trirace.config import make_config
from trirace.data import EOT_ID, BatchSampler, load_tokens
from trirace.data.batches import sampler_for
from trirace.data.dataset import corpus_split
from trirace.data.prepare import prepare
from trirace.data.shards import INDEX, ShardStream
from trirace.errors import DataError, UsageError

VOCAB = 512
SHARD = 100_000  # bytes of text per shard: the large file is cut into several


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return text_dir(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def prepared(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "out"
    prepare(str(corpus), str(out), vocab=VOCAB, shard_bytes=SHARD, workers=2, progress=False)
    return out


def _ids(stream) -> np.ndarray:
    if isinstance(stream, ShardStream):
        return stream.read(0, len(stream)).astype(np.int64)
    return stream.ids.numpy().astype(np.int64)


def test_prepared_shards_hold_the_ids_start_up_tokenising_gives(corpus: Path, prepared: Path, tmp_path: Path) -> None:
    index = json.loads((prepared / INDEX).read_text())
    assert index["dtype"] == "uint16" and index["documents"] == 3
    assert index["tokenizer"]["vocab_size"] <= VOCAB and index["tokenizer"]["eot_id"] == EOT_ID
    assert len(index["shards"]) >= 5  # the large file is cut, and pieces of files share shards
    assert {p[0] for e in index["shards"] for p in e["source"]} == {"a.txt", "b.md", "sub/c.txt"}
    parts = []
    for e in index["shards"]:
        raw = (prepared / e["file"]).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == e["sha256"] and len(raw) == 2 * e["tokens"]
        ids = np.memmap(prepared / e["file"], dtype=np.uint16, mode="r")
        assert int(ids.max()) == e["max_id"] and int((ids == EOT_ID).sum()) == e["documents"] - (e is index["shards"][0])
        parts.append(np.array(ids))
    in_memory = load_tokens(str(corpus), VOCAB, cache_dir=tmp_path)  # --data DIR: tokenised at start-up
    assert np.array_equal(np.concatenate(parts).astype(np.int64), _ids(in_memory))
    assert index["tokens"] == len(in_memory)
    # So the two draw the same micro-batches, from the same split.
    on_disk = load_tokens(str(prepared), VOCAB)
    assert isinstance(on_disk, ShardStream)
    for s in (0, 3):
        a, b = BatchSampler(on_disk, 64, 4, seed=5).micro_batch(s, 1), BatchSampler(in_memory, 64, 4, seed=5).micro_batch(s, 1)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # Windows that cross a shard's end read both shards.
    first = index["shards"][0]["tokens"]
    assert np.array_equal(on_disk.read(first - 3, 7), _ids(in_memory)[first - 3:first + 4])


def test_rerun_keeps_every_finished_shard(corpus: Path, prepared: Path) -> None:
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in prepared.iterdir()}
    again = prepare(str(corpus), str(prepared), vocab=VOCAB, shard_bytes=SHARD, progress=False)
    assert again.kept == len(again.index["shards"])
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in prepared.iterdir()}
    assert after == before  # nothing rewritten, nothing left over


def test_jsonl_documents_under_a_field(tmp_path: Path) -> None:
    docs = [text(300 + 40 * i, 10 + i) for i in range(40)]
    src = jsonl(tmp_path / "docs.jsonl", docs, field="body")
    with open(src, "a") as f:  # a blank line and a blank document are no documents
        f.write("\n" + json.dumps({"body": "  "}) + "\n")
    out = tmp_path / "out"
    prepare(str(src), str(out), vocab=VOCAB, field="body", shard_bytes=4_000, workers=2, progress=False)
    index = json.loads((out / INDEX).read_text())
    assert index["documents"] == 40 and index["field"] == "body" and len(index["shards"]) > 2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = _ids(load_tokens(str(out), VOCAB)).tolist()
    cuts = [i for i, t in enumerate(ids) if t == EOT_ID]
    assert len(cuts) == 39
    pieces = [ids[a + 1:b] for a, b in zip([-1, *cuts], [*cuts, len(ids)])]
    assert [tok.decode(p) for p in pieces] == docs


def test_a_model_tokenizer_beyond_uint16_writes_uint32(tmp_path: Path) -> None:
    hf = word_tokenizer(tmp_path / "tok", 70_000)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text(" ".join(f"w{i}" for i in range(60_000, 70_000, 7)) + "\n")
    out = tmp_path / "out"
    prepare(str(tmp_path / "src"), str(out), tokenizer=f"hf:{hf}", progress=False)
    index = json.loads((out / INDEX).read_text())
    assert index["dtype"] == "uint32" and index["shards"][0]["max_id"] == 69_996
    assert _ids(load_tokens(str(out), 70_000)).tolist() == list(range(60_000, 70_000, 7))
    with pytest.raises(UsageError, match="uint16 holds ids below 65536"):
        prepare(str(tmp_path / "src"), str(tmp_path / "u16"), tokenizer=f"hf:{hf}", dtype="uint16", progress=False)
    assert not (tmp_path / "u16").exists()


def _cfg(source: str, eval_every: int, **kw):
    return make_config(dict(model="gpt-test", data=source, seq_len=32, micro_batch_size=3, progress=False,
                            eval_every=eval_every, **kw))


def _nano_bin(directory: Path, n: int, seed: int, name: str = "train.bin") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(seed).integers(3, 2048, n).astype(np.uint16)
    ids.tofile(directory / name)
    return directory / name


@pytest.mark.parametrize("kind", ["synthetic", "text", "prepared", "bin"])
def test_evaluation_leaves_the_training_draw_as_it_was(kind: str, corpus: Path, prepared: Path, tmp_path: Path) -> None:
    if kind == "bin":
        _nano_bin(tmp_path / "nano", 50_000, 1)
        _nano_bin(tmp_path / "nano", 5_000, 2, "val.bin")
    source = {"synthetic": "synthetic", "text": str(corpus), "prepared": str(prepared),
              "bin": str(tmp_path / "nano" / "train.bin")}[kind]
    off, on = sampler_for(_cfg(source, 0)), sampler_for(_cfg(source, 2))
    for key in [(0, 0), (1, 3), (7, 2)]:
        assert torch.equal(off.micro_batch(*key)[0], on.micro_batch(*key)[0])
    held = sampler_for(_cfg(source, 2), held_out=True).stream
    if kind in ("text", "prepared"):  # the tail, one cut: no training window reaches it
        whole = load_tokens(source, 2048)
        assert len(off.stream) + len(held) == len(whole)
        assert np.array_equal(_ids(held), _ids(whole)[len(off.stream):])
    if kind == "bin":
        assert np.array_equal(_ids(held), np.fromfile(tmp_path / "nano" / "val.bin", dtype=np.uint16))
        assert len(off.stream) == 50_000  # train.bin whole
    if kind == "synthetic":
        assert len(off.stream) == 1 << 21 and not torch.equal(held.ids[:100], off.stream.ids[:100])


def test_bin_reads_uint32_with_data_dtype(tmp_path: Path) -> None:
    ids = np.random.default_rng(0).integers(0, 2048, 10_000).astype(np.uint32)
    ids.tofile(tmp_path / "train.bin")
    stream = load_tokens(str(tmp_path / "train.bin"), 2048, dtype="uint32")
    assert np.array_equal(_ids(stream), ids)
    train, held = corpus_split(str(tmp_path / "train.bin"), 2048, 16, evaluate=True, dtype="uint32")
    assert len(train) + len(held) == 10_000  # no val.bin: the tail is held out


# Bad input: one line, exit status 2, nothing written ----------------------------------------

def _bad(capsys, tmp_path: Path, *argv: str) -> str:
    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ckpt"
    code = main(["train", "--model", "gpt-test", "--steps", "1", "--no-progress", *argv, "--metrics-out", str(metrics),
                 "--checkpoint-dir", str(ckpt)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("trirace: error: "), err
    assert not metrics.exists() and not ckpt.exists()
    return lines[0]


@pytest.fixture
def copy(prepared: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(prepared, tmp_path / "copy"))


def test_index_that_does_not_match_its_shards(capsys, copy: Path, tmp_path: Path) -> None:
    index = json.loads((copy / INDEX).read_text())
    index["shards"][1]["tokens"] += 1
    (copy / INDEX).write_text(json.dumps(index))
    assert "shard-00001.bin holds" in _bad(capsys, tmp_path, "--data", str(copy))
    index["shards"][1]["tokens"] -= 1
    (copy / INDEX).write_text(json.dumps(index))
    a, b = copy / "shard-00001.bin", copy / "shard-00002.bin"
    raw = np.fromfile(a, dtype=np.uint16)
    raw[:10] = raw[:10][::-1] + 1  # same size, other content
    raw.tofile(a)
    assert "shard-00001.bin does not match its index.json entry" in _bad(capsys, tmp_path, "--data", str(copy))
    (copy / INDEX).write_text("{not json")
    assert "index.json: unreadable" in _bad(capsys, tmp_path, "--data", str(copy))
    assert b.exists()


def test_truncated_shard(capsys, copy: Path, tmp_path: Path) -> None:
    shard = copy / "shard-00002.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    line = _bad(capsys, tmp_path, "--data", str(copy))
    assert "shard-00002.bin holds" in line and "truncated" in line


def test_missing_shard(capsys, copy: Path, tmp_path: Path) -> None:
    (copy / "shard-00003.bin").unlink()
    assert "shard shard-00003.bin is missing" in _bad(capsys, tmp_path, "--data", str(copy))


def test_token_id_beyond_the_vocabulary(capsys, tmp_path: Path) -> None:
    hf = word_tokenizer(tmp_path / "tok", 5000)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text(" ".join(f"w{i}" for i in range(2, 5000)) + "\n")
    prepare(str(tmp_path / "src"), str(tmp_path / "out"), tokenizer=str(hf), progress=False)
    line = _bad(capsys, tmp_path, "--data", str(tmp_path / "out"))  # gpt-test: 2048 ids
    assert "token id 4999 is beyond the model's vocabulary of 2048" in line
    big = np.array([5, 9, 60_000, 7] * 50, dtype=np.uint16)
    big.tofile(tmp_path / "train.bin")
    assert "token id 60000 is beyond" in _bad(capsys, tmp_path, "--data", str(tmp_path / "train.bin"))


def test_truncated_bin(capsys, tmp_path: Path) -> None:
    _nano_bin(tmp_path, 1001, 0)
    (tmp_path / "odd.bin").write_bytes((tmp_path / "train.bin").read_bytes()[:-1])
    assert "2001 bytes is not a whole number of uint16 tokens" in _bad(capsys, tmp_path, "--data",
                                                                        str(tmp_path / "odd.bin"))
    assert "not a whole number of uint32" in _bad(capsys, tmp_path, "--data", str(tmp_path / "train.bin"),
                                                  "--data-dtype", "uint32")


def _bad_prepare(capsys, *argv: str) -> str:
    code = main(["data", "prepare", *argv, "--no-progress"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("trirace: error: "), err
    return lines[0]


def test_bad_prepare_input_leaves_nothing(capsys, tmp_path: Path) -> None:
    docs = [text(2_000, i) for i in range(30)]
    src = jsonl(tmp_path / "docs.jsonl", docs)
    with open(src, "a") as f:
        f.write('{"title": "no text here"}\n')
    out = tmp_path / "out"
    assert "docs.jsonl line 31: no 'text' field" in _bad_prepare(capsys, str(src), "--out", str(out), "--vocab",
                                                                  "300", "--shard-mb", "0.01")
    assert not out.exists()  # not even the shards finished before the bad line
    assert "no 'body' field" in _bad_prepare(capsys, str(src), "--out", str(out), "--field", "body")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert "not empty" in _bad_prepare(capsys, str(src), "--out", str(tmp_path / "busy"))
    assert "data path not found" in _bad_prepare(capsys, str(tmp_path / "nope"), "--out", str(out))
    assert "not a tokenizer.json" in _bad_prepare(capsys, str(src), "--out", str(out), "--tokenizer", str(src))
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "docs.jsonl"]
    assert ["notes.txt"] == [p.name for p in (tmp_path / "busy").iterdir()]


def test_a_changed_source_rewrites_only_its_shards(tmp_path: Path) -> None:
    hf = word_tokenizer(tmp_path / "tok", 3000)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"{i}.txt").write_text("\n".join(" ".join(f"w{(i * 7 + j * 13) % 3000}" for j in range(40))
                                                for _ in range(30 + i)) + "\n")
    out, clean = tmp_path / "out", tmp_path / "clean"
    prepare(str(src), str(out), tokenizer=str(hf), shard_bytes=3_000, progress=False)
    (src / "2.txt").write_text((src / "2.txt").read_text() + "w5 w6 w7\n")
    (src / "3.txt").unlink()  # and the plan is shorter: its shards go
    again = prepare(str(src), str(out), tokenizer=str(hf), shard_bytes=3_000, progress=False)
    prepare(str(src), str(clean), tokenizer=str(hf), shard_bytes=3_000, progress=False)
    n = len(again.index["shards"])
    assert 0 < again.kept < n
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in clean.iterdir()}
