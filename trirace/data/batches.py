"""The job's micro-batches: its corpus as a sampler, and the function a stage draws from."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import TrainConfig
from ..models import hf
from ..errors import DataError
from .dataset import BatchSampler, corpus_split

# (step, index within the step's global batch) -> (inputs, targets)
BatchFn = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


def sampler_for(cfg: TrainConfig, held_out: bool = False) -> BatchSampler:
    """Training micro-batches, or with `held_out` the evaluation ones. The held-out part is
    kept out of training whether or not the run evaluates (data/dataset.py: corpus_split)."""
    train, held = corpus_split(cfg.data.source, cfg.spec.vocab_size, cfg.tokens_seq, cfg.data.eval_every > 0,
                               tokenizer=hf.tokenizer_of(cfg.spec), dtype=cfg.data.dtype)
    if held_out and held is None:
        raise DataError(f"{cfg.data.source} is too short to hold out a part for evaluation")
    return BatchSampler(held if held_out else train, cfg.tokens_seq, cfg.parallel.micro_batch_size, cfg.seed)


def batch_fn(cfg: TrainConfig, sampler: BatchSampler) -> BatchFn:
    return sampler.micro_batch if cfg.spec.causal else sampler.mlm_micro_batch
