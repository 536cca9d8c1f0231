"""Small corpora generated for the data tests: seeded, so every run and machine sees the same
text, and made of lines of words, so that large files have places to be cut."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = [f"{a}{b}{c}" for a in "bcdfgklmnprst" for b in "aeiou" for c in "nrstlm"]


def text(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    lines, size = [], 0
    while size < n_bytes:
        line = " ".join(rng.choices(WORDS, weights, k=rng.randint(3, 14))) + rng.choice(".,;:!?")
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def text_dir(root: Path) -> Path:
    """Three documents, one large enough to be cut into several shards at --shard-mb 0.1."""
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text(text(40_000, 1))
    (root / "b.md").write_text(text(350_000, 2))
    (root / "sub" / "c.txt").write_text(text(25_000, 3))
    return root


def jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def word_tokenizer(directory: Path, size: int) -> Path:
    """A Hugging Face tokenizer.json of `size` words (w0, w1, ...), "<|endoftext|>" first:
    ids as large as wanted without training anything."""
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory
