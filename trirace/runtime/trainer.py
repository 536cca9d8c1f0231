"""Training on an initialised process group: each rank builds its stage and runs its actions."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..policy.autotune import Tuner
from ..config import TrainConfig
from ..data import BatchSampler
from ..data.batches import batch_fn, sampler_for
from ..errors import Diverged, UsageError
from ..models.build import loss_of
from ..obs.memory import reset_peak_rss
from ..obs.report import Reporter
from ..obs.timeline import Recorder, write_trace
from ..optim import UpdateRule
from ..plan.job import JobPlan
from ..plan.planner import plan_job, stage_sizes
from ..plan.topology import Topology
from . import checkpoint
from .stage_comm import StageComm
from .communicator import CommLog
from .engine import Engine, StepRecord
from .evaluate import Evaluator
from .groups import Groups, control_communicator, make_groups
from .hf_export import export_hf
from .device import job_device
from .layer_timing import profile_layers
from .link_probe import detect_topology, probe_links
from .stage import StageModel
from .step_metrics import StepMetrics


def measure_layers(cfg: TrainConfig, sampler: BatchSampler | None = None,
                   device: torch.device | None = None) -> list[float]:
    """Seconds of forward + backward per layer, measured here on the job's first micro-batch,
    on `device` (default: the one the job's ranks compute on). Emulated layers (--emulate)
    take the device's times, dilated: what their sleeps take, without the sleeps' noise, so
    every run of a job gets the same partition."""
    if (em := cfg.emulation) is not None:
        return [em.dilation * (f + b) for f, b in zip(em.times.forward_s, em.times.backward_s)]
    inputs, targets = batch_fn(cfg, sampler or sampler_for(cfg))(0, 0)
    return profile_layers(cfg.spec, inputs, targets, cfg.seed, device=device or job_device(cfg))


def plan_partition(cfg: TrainConfig, sampler: BatchSampler | None = None) -> list[int]:
    """Layers per stage: the explicit override, or a balance of parameters or measured time."""
    return stage_sizes(cfg, lambda: measure_layers(cfg, sampler))


def default_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _restarted() -> bool:
    """torchrun restarted this job: injected faults fire only in its first attempt."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


class RankFailed(RuntimeError):
    """This rank could not go on (usually: a peer died or stalled past the timeout)."""


class Trainer:
    """Runs `cfg` on the default process group, whose size must be pp * dp.

    Every rank calls `run()`; the reporter rank (last stage, replica 0) returns the per-step
    metrics, shows progress and writes `metrics_out`; the others return None.
    """

    def __init__(self, cfg: TrainConfig, device: torch.device | None = None):
        if not dist.is_initialized():
            raise UsageError("Trainer needs an initialised torch.distributed process group")
        if dist.get_world_size() != cfg.world_size:
            raise UsageError(f"pp x dp = {cfg.parallel.pp} x {cfg.parallel.dp} = {cfg.world_size} but the world has "
                             f"{dist.get_world_size()} ranks")
        self.cfg = cfg
        self.device = device or default_device()
        reset_peak_rss()  # this run's peak, not an earlier run's in the same process (run_local)
        self.sampler = sampler_for(cfg)
        # The control communicator comes first: everything agreed below travels on it, in
        # this order on every rank.
        self.log = CommLog(cfg.observe.comm_log, dist.get_rank())
        self.control = control_communicator(self.log, timedelta(seconds=cfg.faults.fail_timeout_s))
        topology = self._agree_on_topology()
        times = self._agree_on_layer_times(topology)
        found = self._find_resume_point(stage_sizes(cfg, lambda: times))
        self.plan: JobPlan = plan_job(cfg, topology, lambda: times, steps=cfg.steps - self.first_step)
        self.schedule = self.plan.schedule
        self.sizes = list(self.plan.partition)
        self.groups: Groups = make_groups(self.plan, self.device, self.control)
        self._announce(topology)
        self.model = self._build_stage()
        if found is not None:
            checkpoint.load(found, self.model)

    def _agree_on_topology(self) -> Topology:
        """The nodes and links every rank plans with: the file's, or detected, then probed."""
        cfg = self.cfg
        topology = detect_topology(str(cfg.comm.topology) if cfg.comm.topology else None, cfg.world_size, self.control)
        return probe_links(topology, self.device, control=self.control) if cfg.comm.probe else topology

    def _find_resume_point(self, sizes: list[int]) -> Path | None:
        """The newest complete checkpoint of this job, if it resumes (sets first_step)."""
        self.ident = checkpoint.manifest(self.cfg, sizes)
        found, self.first_step = checkpoint.resume_point(self.cfg)
        if dist.get_rank() == 0 and (line := checkpoint.resume_line(self.cfg, found, self.first_step)):
            print(f"trirace: {line}", file=sys.stderr, flush=True)
        return found

    def _announce(self, topology: Topology) -> None:
        if dist.get_rank() == 0 and self.cfg.observe.progress:
            print(f"{topology.describe()}{' (probed)' if self.cfg.comm.probe else ''}; rank order "
                  f"{self.plan.why_placed()}; stages {self.sizes}; hierarchical all-reduce "
                  f"{'on' if any(s.hierarchical for s in self.plan.stages) else 'off'} here",
                  file=sys.stderr, flush=True)

    def _build_stage(self) -> StageModel:
        """This rank's layers, with as many weight versions as the schedule keeps."""
        cfg, stage = self.cfg, self.plan.stages[self.groups.stage]
        model = StageModel(cfg.spec, stage.layers, cfg.seed, n_versions=self.schedule.staleness + 1,
                           optimizer=cfg.optim.optimizer, lr=cfg.optim.learning_rate, device=self.device,
                           weight_decay=cfg.optim.decay, recompute=cfg.model.recompute)
        model.offset = self.first_step
        if (tuple(model.numels), model.tied) != (stage.numels, stage.tied_param):
            raise RuntimeError(f"stage {stage.stage}'s modules disagree with the job plan's parameter layout")
        return model

    def _maybe_save(self, step: int) -> None:
        cfg = self.cfg
        if cfg.checkpoint.dir is None or self.groups.replica != 0:
            return
        last = step == cfg.steps - 1
        if last or (cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0):
            checkpoint.save(cfg.checkpoint.dir, step, self.groups.stage, self.model, self.ident)

    def _agree_on_layer_times(self, topology: Topology) -> list[float] | None:
        """Per-layer times where the plan weighs them: to balance the stages, and for auto
        placement across nodes. Measured times differ between ranks, so rank 0 measures and
        everyone uses its figures."""
        balances = self.cfg.parallel.partition is None and self.cfg.parallel.balance == "time"
        places = self.cfg.parallel.rank_order == "auto" and topology.nodes > 1
        if not (balances or places):
            return None
        box = [measure_layers(self.cfg, self.sampler, self.device) if dist.get_rank() == 0 else None]
        self.control.broadcast_object(box, src=0)
        return box[0]

    def run(self) -> list[dict] | None:
        cfg, g = self.cfg, self.groups
        stage = self.plan.stages[g.stage]
        rec = Recorder(g.rank, enabled=cfg.observe.trace_out is not None)
        tuner = Tuner(stage.policy, lag=StepMetrics.LAG) if cfg.comm.autotune else None
        try:
            comm = StageComm(stage, self.schedule, g, self.model, cfg.activation_shape, self.device, rec, tuner,
                        cfg.comm.embedding_comm, cfg.faults.fail_timeout_s,
                        torch.bfloat16 if cfg.comm.grad_comm_dtype == "bf16" else torch.float32)
            report = Reporter(cfg, self.sizes) if g.is_reporter else None
            metrics = StepMetrics(cfg, g, comm, report, self.sizes, self.model)
            evaluator = Evaluator(self.model, g, batch_fn(cfg, sampler_for(cfg, held_out=True)), cfg.data.eval_batches,
                                  cfg.data.eval_every, cfg.steps, cfg.activation_shape, self.device,
                                  cfg.model.precision, loss_of(cfg.spec)) if cfg.data.eval_every else None

            def on_step(r: StepRecord) -> None:  # r.step counts from this run's first step
                self._maybe_save(r.step + self.first_step)
                if evaluator and evaluator.due(r.step + self.first_step):
                    r.val_loss_sum, r.val_count = evaluator.run(r.step + 1)  # W(t+1), OPT t's
                metrics.step(r)

            engine = Engine(self.schedule, self.model, g, comm, batch_fn(cfg, self.sampler), self.device, rec,
                            on_step=on_step,
                            delay_s=cfg.faults.straggler[1] if cfg.faults.straggler and cfg.faults.straggler[0] == g.rank else 0.0,
                            kill_step=cfg.faults.kill[1] if cfg.faults.kill and cfg.faults.kill[0] == g.rank and not _restarted() else None,
                            rule=UpdateRule.of(cfg), precision=cfg.model.precision, loss_fn=loss_of(cfg.spec))
            g.control.barrier()
            t_start = rec.now()
            metrics.start(t_start)
            if report:
                report.start(t_start)
            try:
                engine.run(self.schedule.actions[g.stage])
            except Diverged:  # every rank, at the same update: not a failure of this rank
                metrics.flush()  # the steps before it (their all-reduces were issued by every rank)
                if report:
                    report.close()
                raise
            except Exception as e:  # a peer died or stalled: say who and where, then fail
                raise RankFailed(f"rank {g.rank} (stage {g.stage}, replica {g.replica}) stopped during step "
                                 f"{max(engine.step_now, 0)}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from e
            metrics.flush()
            if evaluator:
                evaluator.wait_sends()
            if cfg.checkpoint.export_hf is not None:
                export_hf(cfg, self.plan, g, self.model)
            if cfg.observe.trace_out is not None:
                _write_trace(cfg.observe.trace_out, rec, t_start, g)
            g.control.barrier()
            g.release()
            return report.finish() if report else None
        finally:
            self.log.close()


def _write_trace(out_dir: Path, rec: Recorder, t_start: float, g: Groups) -> None:
    """Gather every rank's events to rank 0, which writes one timeline for the job."""
    origin = torch.tensor([t_start], dtype=torch.float64)
    g.control.all_reduce(origin, op=dist.ReduceOp.MIN).wait()
    events = rec.events(origin.item())
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    g.control.gather_object(events, gathered, dst=0)
    if dist.get_rank() == 0:
        write_trace(Path(out_dir) / "trace.json", [e for evs in gathered for e in evs])


