"""The job's micro-batches: its corpus as a sampler, and the function a stage draws from."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import TrainConfig
from ..models import hf
from .dataset import BatchSampler, load_tokens, split_held_out

# (step, index within the step's global batch) -> (inputs, targets)
BatchFn = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


def sampler_for(cfg: TrainConfig, held_out: bool = False) -> BatchSampler:
    """Training micro-batches, or with `held_out` the evaluation ones. With --eval-every the
    corpus's tail is held out of training (data/dataset.py: split_held_out)."""
    stream = load_tokens(cfg.data.source, cfg.spec.vocab_size, tokenizer=hf.tokenizer_of(cfg.spec))
    if cfg.data.eval_every:
        train, tail = split_held_out(stream, cfg.tokens_seq)
        stream = tail if held_out else train
    return BatchSampler(stream, cfg.tokens_seq, cfg.parallel.micro_batch_size, cfg.seed)


def batch_fn(cfg: TrainConfig, sampler: BatchSampler) -> BatchFn:
    return sampler.micro_batch if cfg.spec.causal else sampler.mlm_micro_batch
