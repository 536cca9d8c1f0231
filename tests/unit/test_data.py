"""trirace.data on real files: discovery, tokenizer cache, deterministic batches."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from trirace.data import (
    EOT_ID, IGNORE_INDEX, MASK_ID, STDLIB, BatchSampler, TokenStream, default_cache_dir,
    discover, load_tokenizer, load_tokens, synthetic_stream,


)
from trirace.data.corpus import stdlib_root
from trirace.errors import DataError

SMALL = 150_000  # bytes of stdlib: trains in well under a second

VOCAB = 1024


@pytest.fixture(scope="module")
def small_files() -> list[Path]:
    return discover(STDLIB, max_bytes=SMALL)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def stream(cache: Path) -> TokenStream:
    return load_tokens(STDLIB, VOCAB, cache_dir=cache, max_bytes=SMALL)


def _one_line_error(source: str, match: str) -> None:
    with pytest.raises(DataError, match=match) as info:
        discover(source)
    assert "\n" not in str(info.value)


def test_discover_keeps_text_skips_binary_hidden_blank(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (tmp_path / "b.txt").write_text("beta\n")
    (tmp_path / "a.md").write_text("alpha ünïcode\n")
    (tmp_path / "sub" / "deeper" / "c.py").write_text("print('c')\n")
    (tmp_path / "sub" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "blank.txt").write_text("  \n\t")
    (tmp_path / ".hidden.txt").write_text("hidden")
    (tmp_path / ".git" / "config").write_text("[core]")

    found = [p.relative_to(tmp_path).as_posix() for p in discover(str(tmp_path))]
    assert found == ["a.md", "b.txt", "sub/deeper/c.py"]


def test_discover_single_file_and_budget(tmp_path: Path) -> None:
    f = tmp_path / "one.txt"
    f.write_text("x" * 100)
    assert discover(str(f)) == [f]
    for name in "abc":
        (tmp_path / f"{name}.log").write_text("y" * 100)
    # Whole files only; the first is kept even when it alone is over budget.
    assert [p.name for p in discover(str(tmp_path), max_bytes=250)] == ["a.log", "b.log"]
    assert [p.name for p in discover(str(tmp_path), max_bytes=10)] == ["a.log"]


def test_missing_empty_and_binary_sources_raise(tmp_path: Path) -> None:
    _one_line_error(str(tmp_path / "nope"), "data path not found: .*nope")
    _one_line_error(str(tmp_path), "no text files under")
    (tmp_path / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    _one_line_error(str(tmp_path), "no text files under")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    _one_line_error(str(empty), "no text in")


def test_stdlib_alias_is_sorted_filtered_and_budgeted() -> None:
    files = discover(STDLIB, max_bytes=300_000)
    root = stdlib_root()
    rel = [p.relative_to(root).as_posix() for p in files]
    assert rel == sorted(rel) and all(r.endswith(".py") for r in rel)
    assert not any(part in {"test", "tests", "site-packages", "idlelib"}
                   for r in rel for part in r.split("/"))
    assert sum(p.stat().st_size for p in files) <= 300_000
    assert discover(STDLIB, max_bytes=300_000) == files


def test_tokenizer_cache_hit_is_fast_and_identical(small_files: list[Path], tmp_path: Path) -> None:
    t0 = time.perf_counter()
    first = load_tokenizer(small_files, VOCAB, tmp_path)
    trained = time.perf_counter() - t0
    (entry,) = tmp_path.glob("tokenizer-*.json")
    written = entry.stat().st_mtime_ns
    t0 = time.perf_counter()
    second = load_tokenizer(small_files, VOCAB, tmp_path)
    cached = time.perf_counter() - t0
    assert cached < trained / 2  # ~20x in practice
    assert entry.stat().st_mtime_ns == written  # read, not retrained
    assert not list(tmp_path.glob("*.tmp"))  # atomic write left no temp files

    text = small_files[0].read_text()
    assert first.encode(text).ids == second.encode(text).ids
    assert first.get_vocab_size() <= VOCAB
    assert first.token_to_id("<|endoftext|>") == EOT_ID
    assert first.token_to_id("[MASK]") == MASK_ID
    # Byte-level: text never seen in training still round-trips exactly.
    odd = "数据 🚀 \x07\ttabs\r\n"
    assert first.decode(first.encode(odd).ids) == odd


def test_tokenizer_key_depends_on_vocab_and_content(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world, hello tokens\n" * 50)
    files = discover(str(corpus))
    load_tokenizer(files, 300, tmp_path / "c")
    load_tokenizer(files, 320, tmp_path / "c")
    (corpus / "a.txt").write_text("changed text, changed key\n" * 50)
    load_tokenizer(files, 300, tmp_path / "c")
    assert len(list((tmp_path / "c").glob("tokenizer-*.json"))) == 3


def test_real_stream_ids_and_cache(stream: TokenStream, small_files: list[Path], cache: Path) -> None:
    assert stream.ids.dtype == torch.int32 and stream.ids.dim() == 1
    assert 0 <= int(stream.ids.min()) and int(stream.ids.max()) < VOCAB
    assert stream.vocab_size == VOCAB
    # Documents are joined by exactly one end-of-text token each.
    assert int((stream.ids == EOT_ID).sum()) == len(small_files) - 1
    again = load_tokens(STDLIB, VOCAB, cache_dir=cache, max_bytes=SMALL)
    assert torch.equal(again.ids, stream.ids)


def test_synthetic_stream_is_deterministic_sparse_and_in_range() -> None:
    vocab = 16384
    a, b = load_tokens("synthetic", vocab), synthetic_stream.__wrapped__(vocab)  # made anew, not the kept one
    assert torch.equal(a.ids, b.ids) and a.vocab_size == vocab
    assert load_tokens("synthetic", vocab) is a  # kept for the process's next job
    assert int(a.ids.min()) > 2 and int(a.ids.max()) < vocab  # no special ids
    x, y = BatchSampler(a, 128, 4, seed=0).micro_batch(0, 0)
    distinct = torch.cat([x, y]).unique().numel()
    assert distinct / vocab < 0.05
    assert x.unique().numel() < 0.75 * x.numel()  # repeats, unlike uniform ids


def test_default_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRIRACE_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TRIRACE_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "trirace"


def test_micro_batch_shapes_and_shift(stream: TokenStream) -> None:
    x, y = BatchSampler(stream, 64, 3, seed=7).micro_batch(5, 1)
    assert x.shape == y.shape == (3, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    # Each row is a real window of the corpus: the target row continues it.
    ids = stream.ids.long()
    for row_x, row_y in zip(x, y):
        starts = (ids[: len(ids) - 64] == row_x[0]).nonzero().flatten()
        assert any(torch.equal(ids[s : s + 65], torch.cat([row_x, row_y[-1:]])) for s in starts)


def test_micro_batch_deterministic_across_instances_and_order(stream: TokenStream) -> None:
    keys = [(s, i) for s in range(4) for i in range(3)]
    a = BatchSampler(stream, 32, 2, seed=11)
    first = {k: a.micro_batch(*k) for k in keys}
    b = BatchSampler(stream, 32, 2, seed=11)
    for k in reversed(keys):
        assert all(torch.equal(u, v) for u, v in zip(b.micro_batch(*k), first[k]))
    assert not torch.equal(first[(0, 0)][0], first[(0, 1)][0])
    assert not torch.equal(first[(0, 0)][0], first[(1, 0)][0])
    other = BatchSampler(stream, 32, 2, seed=12).micro_batch(0, 0)[0]
    assert not torch.equal(other, first[(0, 0)][0])


def test_mlm_micro_batch_masking(stream: TokenStream) -> None:
    sampler = BatchSampler(stream, 128, 16, seed=3)
    x, y = sampler.mlm_micro_batch(2, 0)
    original, _ = sampler.micro_batch(2, 0)  # same windows, unmasked
    masked = y != IGNORE_INDEX
    assert x.shape == y.shape == (16, 128) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[masked], torch.full_like(x[masked], MASK_ID))
    assert torch.equal(y[masked], original[masked])
    assert torch.equal(x[~masked], original[~masked])
    assert 0.10 < masked.float().mean().item() < 0.20
    again = BatchSampler(stream, 128, 16, seed=3).mlm_micro_batch(2, 0)
    assert torch.equal(again[0], x) and torch.equal(again[1], y)
    # A tiny probability still masks one position in every row.
    _, y_rare = sampler.mlm_micro_batch(0, 0, mask_prob=1e-6)
    assert torch.equal((y_rare != IGNORE_INDEX).sum(dim=1), torch.ones(16, dtype=torch.int64))


def test_corpus_shorter_than_window_raises() -> None:
    tiny = TokenStream(ids=torch.arange(10, dtype=torch.int32), vocab_size=16)
    BatchSampler(tiny, 9, 1, seed=0).micro_batch(0, 0)  # exactly seq_len + 1 fits
    with pytest.raises(DataError, match="fewer than seq_len"):
        BatchSampler(tiny, 10, 1, seed=0)
