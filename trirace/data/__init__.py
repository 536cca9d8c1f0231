"""Corpora (in memory or memory-mapped shards), tokenizer and deterministic micro-batches for training."""

from trirace.data.corpus import STDLIB, STDLIB_MAX_BYTES, discover
from trirace.data.dataset import (
    IGNORE_INDEX, SYNTHETIC, BatchSampler, TokenStream, corpus_split, default_cache_dir, load_tokens,
    split_held_out, synthetic_stream,
)
from trirace.data.shards import ShardStream
from trirace.data.tokenizer import (
    EOT, EOT_ID, MASK, MASK_ID, MIN_VOCAB_SIZE, PAD, PAD_ID, SPECIAL_TOKENS, load_tokenizer,
)

__all__ = [
    "STDLIB", "STDLIB_MAX_BYTES", "discover",
    "IGNORE_INDEX", "SYNTHETIC", "BatchSampler", "TokenStream", "ShardStream", "corpus_split",
    "default_cache_dir", "load_tokens", "split_held_out", "synthetic_stream",
    "EOT", "EOT_ID", "MASK", "MASK_ID", "MIN_VOCAB_SIZE", "PAD", "PAD_ID", "SPECIAL_TOKENS",
    "load_tokenizer",
]
