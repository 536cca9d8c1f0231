"""Which backend and device a job's ranks use, decided the same way by the launcher, the
ranks, the partitioner's layer timing and `trirace profile`."""

from __future__ import annotations

import torch

from ..config import TrainConfig
from ..errors import UsageError


def resolve_backend(requested: str, local_ranks: int) -> str:
    """The backend a job runs on: nccl needs a CUDA device per local rank (two ranks cannot
    share one GPU), gloo runs anywhere. auto takes nccl exactly when that holds."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "nccl" if gpus >= local_ranks else "gloo"
    if requested == "nccl" and gpus < local_ranks:
        raise UsageError(f"--backend nccl needs one CUDA device per rank: {local_ranks} rank(s) here but "
                         f"{gpus} device(s) visible")
    return requested


def job_device(cfg: TrainConfig) -> torch.device:
    """The device one rank of `cfg` computes on, seen from this host: a GPU where the job's
    ranks run on NCCL here (auto takes NCCL with a GPU per rank), or wherever `--backend
    nccl` asks for it and this host has a GPU; else the CPU."""
    gpu = torch.device("cuda", 0)
    if cfg.comm.backend == "nccl" and torch.cuda.is_available():
        return gpu
    return gpu if cfg.comm.backend == "auto" and resolve_backend("auto", cfg.world_size) == "nccl" else torch.device("cpu")
