"""The real executor: stages, the engine that runs their actions, process groups, launch."""

from .launch import WorkerFailed, run_local, train
from .trainer import Trainer

__all__ = ["Trainer", "WorkerFailed", "run_local", "train"]
