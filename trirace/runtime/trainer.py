"""Training on an initialised process group: each rank builds its stage and runs its actions."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from ..config import TrainConfig
from ..data import BatchSampler, load_tokens
from ..errors import UsageError
from ..models import layer_names, layer_param_counts
from ..plan import Layout, balance, build_schedule, stage_ranges
from .engine import BatchFn, Engine, StepRecord
from .groups import Groups, make_groups
from .profile import profile_layers
from .stage import StageModel


def sampler_for(cfg: TrainConfig) -> BatchSampler:
    stream = load_tokens(cfg.data, cfg.spec.vocab_size)
    return BatchSampler(stream, cfg.tokens_seq, cfg.micro_batch_size, cfg.seed)


def batch_fn(cfg: TrainConfig, sampler: BatchSampler) -> BatchFn:
    return sampler.micro_batch if cfg.spec.arch == "gpt" else sampler.mlm_micro_batch


def plan_partition(cfg: TrainConfig, sampler: BatchSampler | None = None) -> list[int]:
    """Layers per stage: the explicit override, or a balance of parameters or measured time."""
    if cfg.partition is not None:
        return list(cfg.partition)
    if cfg.balance == "params":
        return balance([float(c) for c in layer_param_counts(cfg.spec)], cfg.pp)
    sampler = sampler or sampler_for(cfg)
    inputs, targets = batch_fn(cfg, sampler)(0, 0)
    return balance(profile_layers(cfg.spec, inputs, targets, cfg.seed), cfg.pp)


def default_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


class Trainer:
    """Runs `cfg` on the default process group, whose size must be pp * dp.

    Every rank calls `run()`; the reporter rank (last stage, replica 0) returns the per-step
    metrics, shows progress and writes `metrics_out`; the others return None.
    """

    def __init__(self, cfg: TrainConfig, device: torch.device | None = None):
        if not dist.is_initialized():
            raise UsageError("Trainer needs an initialised torch.distributed process group")
        if dist.get_world_size() != cfg.world_size:
            raise UsageError(f"pp x dp = {cfg.pp} x {cfg.dp} = {cfg.world_size} but the world has "
                             f"{dist.get_world_size()} ranks")
        self.cfg = cfg
        self.device = device or default_device()
        self.layout = Layout(cfg.pp, cfg.dp, cfg.rank_order)
        self.sampler = sampler_for(cfg)
        self.sizes = self._agree_on_partition()
        self.groups: Groups = make_groups(self.layout, self.device)
        layers = stage_ranges(self.sizes)[self.groups.stage]
        self.schedule = build_schedule(cfg.schedule, cfg.pp, cfg.micro_batches, cfg.steps)
        self.model = StageModel(cfg.spec, layers, cfg.seed, n_versions=self.schedule.staleness + 1,
                                optimizer=cfg.optimizer, lr=cfg.learning_rate, device=self.device)

    def _agree_on_partition(self) -> list[int]:
        """Measured times differ between ranks, so rank 0 decides and everyone follows."""
        if self.cfg.partition is not None or self.cfg.balance == "params":
            return plan_partition(self.cfg)
        box = [plan_partition(self.cfg, self.sampler) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def run(self) -> list[dict] | None:
        cfg, g = self.cfg, self.groups
        report = _Reporter(cfg, self.sizes) if g.is_reporter else None
        shape = (cfg.micro_batch_size, cfg.tokens_seq, cfg.spec.d_model)

        def on_step(rec: StepRecord) -> None:
            if not self.model.is_last:
                return
            loss = torch.tensor([sum(rec.losses) / len(rec.losses)])
            if g.metrics is not None:  # mean over replicas; they are in step already
                dist.all_reduce(loss, group=g.metrics)
                loss /= cfg.dp
            if report:
                report.step(rec.step, loss.item(), rec.end_time)

        engine = Engine(self.schedule, self.model, g, batch_fn(cfg, self.sampler), shape, self.device, on_step)
        dist.barrier()
        if report:
            report.start()
        engine.run(self.schedule.actions[g.stage])
        dist.barrier()
        return report.finish() if report else None


class _Reporter:
    """Progress bar, per-step metrics file and the closing summary, on one rank."""

    def __init__(self, cfg: TrainConfig, sizes: list[int]):
        self.cfg, self.sizes, self.rows = cfg, sizes, []
        self.bar = tqdm(total=cfg.steps, desc=f"train {cfg.model} {cfg.schedule} pp={cfg.pp} dp={cfg.dp}",
                        unit="step", disable=not cfg.progress, file=sys.stderr, dynamic_ncols=True)
        self.out = None
        if cfg.metrics_out:
            Path(cfg.metrics_out).parent.mkdir(parents=True, exist_ok=True)
            self.out = open(cfg.metrics_out, "w")

    def start(self) -> None:
        self.last = time.perf_counter()

    def step(self, step: int, loss: float, end: float) -> None:
        dt, self.last = end - self.last, end
        row = {"step": step, "loss": loss, "step_time_s": dt, "tokens_per_s": self.cfg.tokens_per_step / dt,
               "schedule": self.cfg.schedule, "pp": self.cfg.pp, "dp": self.cfg.dp}
        self.rows.append(row)
        if self.out:
            self.out.write(json.dumps(row) + "\n")
            self.out.flush()
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
        self.bar.update()

    def finish(self) -> list[dict]:
        self.bar.close()
        if self.out:
            self.out.close()
        steady = self.rows[1:] or self.rows  # the first step includes warm-up
        mean_dt = sum(r["step_time_s"] for r in steady) / len(steady)
        if self.cfg.progress:
            print(f"done: {self.cfg.model} {self.cfg.schedule} pp={self.cfg.pp} dp={self.cfg.dp} "
                  f"stages={self.sizes} | {len(self.rows)} steps, final loss {self.rows[-1]['loss']:.4f}, "
                  f"{self.cfg.tokens_per_step / mean_dt:.0f} tokens/s, {mean_dt:.3f} s/step "
                  f"(mean after step 0)", flush=True)
        return self.rows
