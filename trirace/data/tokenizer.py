"""Byte-level BPE trained locally on the corpus and cached by content hash."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trirace.data._cache import atomic_write, build_lock
from trirace.errors import ConfigError, DataError

EOT = "<|endoftext|>"
MASK = "[MASK]"
PAD = "[PAD]"
SPECIAL_TOKENS = (EOT, MASK, PAD)
# The trainer places special tokens first, in this order; load_tokenizer checks.
EOT_ID, MASK_ID, PAD_ID = 0, 1, 2
# 256 byte symbols plus the special tokens: the smallest byte-level vocabulary.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)
# Bump when training settings change, so stale caches are not reused.
FORMAT_VERSION = 1


def corpus_key(files: Sequence[Path], vocab_size: int) -> str:
    """Hash of everything the trained tokenizer depends on.

    Paths are taken relative to the corpus root so the same corpus checked
    out elsewhere (another machine, another user) hits the same cache.
    """
    paths = [Path(f).resolve() for f in files]
    if not paths:
        raise DataError("no text files to train a tokenizer on")
    root = Path(os.path.commonpath([p.parent for p in paths]))
    h = hashlib.sha256(f"trirace-bpe-v{FORMAT_VERSION}\0{vocab_size}\0".encode())
    for p in paths:
        data = p.read_bytes()
        # Lengths delimit the fields, so no two corpora hash the same stream.
        rel = p.relative_to(root).as_posix().encode()
        h.update(len(rel).to_bytes(8, "little") + rel)
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:32]


def read_texts(files: Sequence[Path]) -> list[str]:
    return [Path(f).read_text(encoding="utf-8") for f in files]


def load_tokenizer(
    files: Sequence[Path], vocab_size: int, cache_dir: str | os.PathLike[str]
) -> Tokenizer:
    """Tokenizer for `files` with at most `vocab_size` tokens, trained on the
    first call and read from `cache_dir` afterwards."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(
            f"vocab_size must be at least {MIN_VOCAB_SIZE} for a byte-level tokenizer, got {vocab_size}"
        )
    path = Path(cache_dir) / f"tokenizer-{corpus_key(files, vocab_size)}.json"
    if not path.exists():
        with build_lock(path.with_suffix(".lock")):
            if not path.exists():  # another process may have built it meanwhile
                tok = _train(read_texts(files), vocab_size)
                atomic_write(path, lambda f: f.write(tok.to_str().encode()))
    tok = Tokenizer.from_file(str(path))
    for token, expected in zip(SPECIAL_TOKENS, (EOT_ID, MASK_ID, PAD_ID)):
        if tok.token_to_id(token) != expected:
            raise DataError(f"tokenizer cache {path} has unexpected special tokens; delete it")
    return tok


def eot_of(tok: Tokenizer) -> int:
    """The id that joins documents: a model's own end-of-text token where it has one
    (GPT-2's, Llama's </s>), else id 0 (ours is EOT_ID = 0)."""
    return next((i for t in (EOT, "</s>", "<|end_of_text|>") if (i := tok.token_to_id(t)) is not None), 0)


def _train(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # Byte-level: every byte sequence has an encoding, so no unknown token.
    # No prefix space: code indentation and line starts stay as written.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok
