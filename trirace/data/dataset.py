"""Token streams (real corpus, prepared shards or synthetic), the held-out split and
deterministic micro-batches."""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tokenizers import Tokenizer

from trirace.data import shards
from trirace.data._cache import atomic_write, build_lock
from trirace.data.corpus import discover
from trirace.data.shards import ShardStream
from trirace.data.tokenizer import EOT_ID, MASK_ID, PAD_ID, corpus_key, eot_of, load_tokenizer, read_texts
from trirace.errors import ConfigError, DataError

SYNTHETIC = "synthetic"
SYNTHETIC_TOKENS = 1 << 21
SYNTHETIC_SEED = 1234
# Rank-frequency exponent: a 4x128 batch at vocab 16384 touches ~1.5% of rows,
# close to the ~1.3% measured on stdlib source with the BPE tokenizer.
ZIPF_EXPONENT = 1.1
IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default


def default_cache_dir() -> Path:
    return Path(os.environ.get("TRIRACE_CACHE") or Path.home() / ".cache" / "trirace")


@dataclass(frozen=True, eq=False)  # eq on tensors would be elementwise
class TokenStream:
    """A corpus as one 1-D int32 tensor of ids, each < vocab_size."""

    ids: torch.Tensor
    vocab_size: int  # the model's embedding rows; the tokenizer may use fewer
    eot_id: int = EOT_ID
    mask_id: int = MASK_ID
    pad_id: int = PAD_ID

    def __len__(self) -> int:
        return self.ids.numel()

    def slice(self, lo: int, hi: int) -> "TokenStream":
        return replace(self, ids=self.ids[lo:hi])

    def windows(self, starts: torch.Tensor, length: int) -> torch.Tensor:
        """int64 [len(starts), length]: the ids from each start."""
        return self.ids[starts[:, None] + torch.arange(length)].long()


Stream = TokenStream | ShardStream


def load_tokens(
    source: str,
    vocab_size: int,
    cache_dir: str | os.PathLike[str] | None = None,
    max_bytes: int | None = None,
    tokenizer: Path | None = None,
    dtype: str = "uint16",
) -> Stream:
    """Token ids of `source`: "synthetic"; a directory `trirace data prepare` wrote, or a flat
    `.bin` file of `dtype` ids (nanoGPT's), both read by memory map; or "stdlib", a text file
    or a directory of text, tokenised here by a BPE trained on the corpus, or by `tokenizer`
    (a model's own tokenizer.json), and cached."""
    if source == SYNTHETIC:
        return synthetic_stream(vocab_size)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if shards.is_prepared(source):
        return shards.open_prepared(source, vocab_size, tokenizer)
    if shards.is_bin(source):
        return shards.open_bin(source, dtype, vocab_size, cache)
    shards.refuse_unfinished(source)
    files = discover(source, max_bytes)
    key = corpus_key(files, vocab_size)
    if tokenizer is not None:
        key += "-" + hashlib.sha256(Path(tokenizer).read_bytes()).hexdigest()[:16]
    path = cache / f"tokens-{key}.pt"
    if not path.exists():
        with build_lock(path.with_suffix(".lock")):
            if not path.exists():
                ids = _encode(files, vocab_size, cache, tokenizer)
                atomic_write(path, lambda f: torch.save(ids, f))
    ids = torch.load(path, weights_only=True)
    return TokenStream(ids=ids, vocab_size=vocab_size)


def tokenizer_file(source: str, vocab_size: int, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The tokenizer of a corpus: the one a prepared directory holds, or the BPE `load_tokens`
    trained for a text corpus (None for synthetic data and .bin files)."""
    if source == SYNTHETIC or shards.is_bin(source):
        return None
    if shards.is_prepared(source):
        path = Path(source).expanduser() / "tokenizer.json"
        return path if path.is_file() else None
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"tokenizer-{corpus_key(discover(source), vocab_size)}.json"
    return path if path.is_file() else None


def _encode(files: list[Path], vocab_size: int, cache_dir: Path, tokenizer: Path | None = None) -> torch.Tensor:
    if tokenizer is None:
        tok, eot_id = load_tokenizer(files, vocab_size, cache_dir), EOT_ID
    else:
        tok = Tokenizer.from_file(str(tokenizer))
        eot_id = eot_of(tok)
        if tok.get_vocab_size() > vocab_size:
            raise DataError(f"tokenizer {tokenizer} has {tok.get_vocab_size()} tokens, more than the model's "
                            f"{vocab_size}")
    eot = torch.tensor([eot_id], dtype=torch.int32)
    parts: list[torch.Tensor] = []
    for i, enc in enumerate(tok.encode_batch(read_texts(files))):
        if i:
            parts.append(eot)  # documents are joined, not merged into one
        parts.append(torch.tensor(enc.ids, dtype=torch.int32))
    return torch.cat(parts)


@functools.lru_cache(maxsize=4)
def synthetic_stream(vocab_size: int, num_tokens: int = SYNTHETIC_TOKENS, seed: int = SYNTHETIC_SEED) -> TokenStream:
    """I.i.d. Zipf-distributed ids: no files needed, and like real text a batch
    touches few embedding rows, so sparse-gradient paths see realistic load.
    Frequent tokens get low ids, as BPE orders its merges by frequency. Kept for the
    process's next job (a worker runs many: 0.1 s each and rank, and 8 MiB), so the
    stream is shared and nothing may write to its ids (nothing does: batches index them)."""
    first = PAD_ID + 1  # special ids never occur as ordinary tokens
    if vocab_size <= first:
        raise ConfigError(f"vocab_size must be greater than {first}, got {vocab_size}")
    ranks = torch.arange(1, vocab_size - first + 1, dtype=torch.float64)
    cdf = torch.cumsum(ranks.pow(-ZIPF_EXPONENT), 0)
    cdf /= cdf[-1].clone()
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(num_tokens, generator=g, dtype=torch.float64)
    # Inverse-CDF sampling; clamp guards u landing past the last cdf value.
    idx = torch.searchsorted(cdf, u).clamp_(max=vocab_size - first - 1)
    return TokenStream(ids=(idx + first).to(torch.int32), vocab_size=vocab_size)


HELD_OUT = 0.05  # the tail of a corpus that evaluation reads and training does not
HELD_OUT_SYNTHETIC = 1 << 16  # ids of the synthetic corpus's held-out draw


def split_held_out(stream: Stream, seq_len: int) -> tuple[Stream, Stream]:
    """(training head, held-out tail): the last HELD_OUT of the tokens, and at least one
    window's worth, are kept for validation. One contiguous cut, so no window of either
    part overlaps the other."""
    tail = max(int(len(stream) * HELD_OUT), seq_len + 1)
    if len(stream) - tail < seq_len + 1:
        raise DataError(f"corpus has {len(stream)} tokens: too few to hold out {tail} for evaluation "
                        f"and still train on windows of {seq_len + 1}; use more text or no --eval-every")
    cut = len(stream) - tail
    return stream.slice(0, cut), stream.slice(cut, len(stream))


def corpus_split(source: str, vocab_size: int, seq_len: int, evaluate: bool, tokenizer: Path | None = None,
                 dtype: str = "uint16") -> tuple[Stream, Stream | None]:
    """(what training draws from, the held-out part or None). The held-out part is fixed by
    the corpus alone, never by whether this run evaluates, so turning --eval-every on
    leaves the training draw as it was: the synthetic corpus's is a second draw of its own
    seed; a `.bin` file's is its `val.bin` sibling where there is one; any other corpus's
    is its last HELD_OUT of tokens (split_held_out), held out whenever the corpus is long
    enough to split. A corpus too short to split trains whole, and refuses evaluation."""
    if source == SYNTHETIC:
        return synthetic_stream(vocab_size), synthetic_stream(vocab_size, HELD_OUT_SYNTHETIC, SYNTHETIC_SEED + 1)
    stream = load_tokens(source, vocab_size, tokenizer=tokenizer, dtype=dtype)
    if shards.is_bin(source) and (val := Path(source).expanduser().with_name("val.bin")).is_file() \
            and val.resolve() != Path(source).expanduser().resolve():
        return stream, load_tokens(str(val), vocab_size, dtype=dtype)
    try:
        return split_held_out(stream, seq_len)
    except DataError:
        if evaluate:
            raise
        return stream, None


def _mix_seed(seed: int, step: int, index: int) -> int:
    """Stable across processes and runs, unlike Python's salted hash()."""
    digest = hashlib.blake2b(struct.pack("<3q", seed, step, index), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class BatchSampler:
    """Random windows of a TokenStream, a pure function of (seed, step, index):
    every rank of a distributed job can draw any micro-batch on its own."""

    def __init__(self, stream: Stream, seq_len: int, micro_batch_size: int, seed: int = 0):
        if seq_len < 1 or micro_batch_size < 1:
            raise ConfigError(
                f"seq_len and micro_batch_size must be positive, got {seq_len} and {micro_batch_size}"
            )
        if len(stream) < seq_len + 1:
            raise DataError(
                f"corpus has {len(stream)} tokens, fewer than seq_len + 1 = {seq_len + 1}; "
                "use more text or a shorter sequence"
            )
        self.stream = stream
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.seed = seed

    def _windows(self, step: int, index: int) -> tuple[torch.Tensor, torch.Generator]:
        g = torch.Generator().manual_seed(_mix_seed(self.seed, step, index))
        # seq_len + 1 tokens per window: inputs plus the one-token-ahead target.
        starts = torch.randint(
            0, len(self.stream) - self.seq_len, (self.micro_batch_size,), generator=g
        )
        return self.stream.windows(starts, self.seq_len + 1), g

    def micro_batch(self, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token pairs: int64 [micro_batch_size, seq_len] each."""
        w, _ = self._windows(step, index)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def mlm_micro_batch(
        self, step: int, index: int, mask_prob: float = 0.15
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked-LM pairs: masked inputs; targets hold the original id where
        masked and IGNORE_INDEX elsewhere. Every row has at least one mask so
        no row contributes an empty (NaN) loss."""
        if not 0.0 < mask_prob <= 1.0:
            raise ConfigError(f"mask_prob must be in (0, 1], got {mask_prob}")
        w, g = self._windows(step, index)
        original = w[:, :-1]
        mask = torch.rand(original.shape, generator=g) < mask_prob
        # Always drawn (not only when needed) so the random stream stays fixed.
        fallback = torch.randint(0, self.seq_len, (self.micro_batch_size,), generator=g)
        empty = ~mask.any(dim=1)
        mask[empty, fallback[empty]] = True
        inputs = original.masked_fill(mask, self.stream.mask_id)
        targets = original.masked_fill(~mask, IGNORE_INDEX)
        return inputs, targets
