"""Training on an initialised process group: each rank builds its stage and runs its actions."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from ..config import TrainConfig
from ..data import BatchSampler, load_tokens, split_held_out
from ..data.dataset import tokenizer_file
from ..models import hf
from ..models.build import layer_param_counts, loss_of
from ..errors import Diverged, UsageError
from ..optim import UpdateRule
from ..comm.autotune import Tuner
from ..comm.policies import MiB
from ..obs.timeline import Recorder, write_trace
from ..plan.job import JobPlan, plan_job
from ..plan.topology import Topology
from . import checkpoint
from .comm import Comm
from .comms import CommLog, Handle
from .engine import BatchFn, Engine, StepRecord
from .evaluate import Evaluator
from .groups import Groups, control_communicator, make_groups
from .hostcpu import host_cpu_s, shares
from .probe import detect_topology, probe_links
from .layer_timing import profile_layers
from .stage import StageModel
from .wakeups import others_wakeups


def sampler_for(cfg: TrainConfig, held_out: bool = False) -> BatchSampler:
    """Training micro-batches, or with `held_out` the evaluation ones. With --eval-every the
    corpus's tail is held out of training (data/dataset.py: split_held_out)."""
    stream = load_tokens(cfg.data, cfg.spec.vocab_size, tokenizer=hf.tokenizer_of(cfg.spec))
    if cfg.eval_every:
        train, tail = split_held_out(stream, cfg.tokens_seq)
        stream = tail if held_out else train
    return BatchSampler(stream, cfg.tokens_seq, cfg.micro_batch_size, cfg.seed)


def batch_fn(cfg: TrainConfig, sampler: BatchSampler) -> BatchFn:
    return sampler.micro_batch if cfg.spec.causal else sampler.mlm_micro_batch


def measure_layers(cfg: TrainConfig, sampler: BatchSampler | None = None) -> list[float]:
    """Seconds of forward + backward per layer, measured here on the job's first micro-batch."""
    inputs, targets = batch_fn(cfg, sampler or sampler_for(cfg))(0, 0)
    return profile_layers(cfg.spec, inputs, targets, cfg.seed)


def plan_partition(cfg: TrainConfig, sampler: BatchSampler | None = None) -> list[int]:
    """Layers per stage: the explicit override, or a balance of parameters or measured time."""
    return cfg.stage_sizes(lambda: measure_layers(cfg, sampler))


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
            raise UsageError(f"pp x dp = {cfg.pp} x {cfg.dp} = {cfg.world_size} but the world has "
                             f"{dist.get_world_size()} ranks")
        self.cfg = cfg
        self.device = device or default_device()
        _reset_peak_rss()  # this run's peak, not an earlier run's in the same process (run_local)
        self.sampler = sampler_for(cfg)
        # The control communicator comes first: everything agreed below travels on it.
        self.log = CommLog(cfg.comm_log, dist.get_rank())
        self.control = control_communicator(self.log, timedelta(seconds=cfg.fail_timeout_s))
        topology = detect_topology(str(cfg.topology) if cfg.topology else None, cfg.world_size, self.control)
        if cfg.probe:
            topology = probe_links(topology, self.device, control=self.control)
        times = self._agree_on_layer_times(topology)
        sizes = cfg.stage_sizes(lambda: times)
        self.ident = checkpoint.identity(cfg, sizes)
        found, self.first_step = checkpoint.resume_point(cfg, sizes)
        if dist.get_rank() == 0 and (line := checkpoint.resume_line(cfg, found, self.first_step)):
            print(f"trirace: {line}", file=sys.stderr, flush=True)
        self.plan: JobPlan = plan_job(cfg, topology, lambda: times, steps=cfg.steps - self.first_step)
        self.sizes = list(self.plan.partition)
        self.groups: Groups = make_groups(self.plan, self.device, self.control, evaluate=cfg.eval_every > 0)
        if dist.get_rank() == 0 and cfg.progress:
            print(f"{topology.describe()}{' (probed)' if cfg.probe else ''}; rank order {self.plan.why_placed()}; "
                  f"stages {self.sizes}; hierarchical all-reduce "
                  f"{'on' if any(s.hierarchical for s in self.plan.stages) else 'off'} here",
                  file=sys.stderr, flush=True)
        stage = self.plan.stages[self.groups.stage]
        self.schedule = self.plan.schedule
        self.model = StageModel(cfg.spec, stage.layers, cfg.seed, n_versions=self.schedule.staleness + 1,
                                optimizer=cfg.optimizer, lr=cfg.learning_rate, device=self.device,
                                weight_decay=cfg.decay, recompute=cfg.recompute)
        self.model.offset = self.first_step
        if (tuple(self.model.numels), self.model.tied) != (stage.numels, stage.tied_param):
            raise RuntimeError(f"stage {stage.stage}'s modules disagree with the job plan's parameter layout")
        if found is not None:
            checkpoint.load(found, self.groups.stage, self.model)

    def _maybe_save(self, step: int) -> None:
        cfg = self.cfg
        if cfg.checkpoint_dir is None or self.groups.replica != 0:
            return
        last = step == cfg.steps - 1
        if last or (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0):
            checkpoint.save(cfg.checkpoint_dir, step, self.groups.stage, self.model, self.ident)

    def _export_hf(self) -> None:
        """The trained weights as a Hugging Face directory: replica 0 of each stage writes
        its own shard into DIR.partial, rank 0 adds the index, config.json and the tokenizer,
        then renames it to DIR, so a failed job leaves no half-written model under DIR.
        (Across nodes DIR must be on storage every node shares.)"""
        cfg, g, spec = self.cfg, self.groups, self.cfg.spec
        out = Path(cfg.export_hf)
        part = out.with_name(out.name + ".partial")
        if g.rank == 0:
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir(parents=True)
        g.control.barrier()
        stage = self.plan.stages[g.stage]
        if g.replica == 0:
            # The master weights, W(steps), laid out by the buffer's modules (a buffer may hold a
            # prediction under --delay-compensation predict).
            module = self.model.module(self.schedule.steps)
            hf.write_shard(part, g.stage, cfg.pp, hf.stage_tensors(spec, stage.layers, list(module),
                                                                   self.model.master_of(module)))
        g.control.barrier()
        if g.rank == 0:
            keys = [[name for i in st.layers for name, _ in hf.names(spec, i) if hf.is_stored(spec, name)]
                    for st in self.plan.stages]
            sizes = layer_param_counts(spec)
            total = 4 * (sum(sizes) - (sizes[-1] if spec.tie_embeddings else 0))  # a tied head is not stored
            hf.write_index(part, spec, cfg.pp, keys, total,
                           hf.tokenizer_of(spec) or tokenizer_file(cfg.data, spec.vocab_size))
            if out.exists():  # --overwrite (the pre-check refused a non-empty one without it)
                shutil.rmtree(out)
            part.rename(out)
        g.control.barrier()

    def _agree_on_layer_times(self, topology: Topology) -> list[float] | None:
        """Per-layer times where the plan weighs them: to balance the stages, and for auto
        placement across nodes. Measured times differ between ranks, so rank 0 measures and
        everyone uses its figures."""
        balances = self.cfg.partition is None and self.cfg.balance == "time"
        places = self.cfg.rank_order == "auto" and topology.nodes > 1
        if not (balances or places):
            return None
        box = [measure_layers(self.cfg, self.sampler) if dist.get_rank() == 0 else None]
        self.control.broadcast_object(box, src=0)
        return box[0]

    def run(self) -> list[dict] | None:
        cfg, g = self.cfg, self.groups
        stage = self.plan.stages[g.stage]
        rec = Recorder(g.rank, enabled=cfg.trace_out is not None)
        tuner = Tuner(stage.policy, lag=_StepMetrics.LAG) if cfg.autotune else None
        try:
            comm = Comm(stage, self.schedule, g, self.model, cfg.activation_shape, self.device, rec, tuner,
                        cfg.embedding_comm, cfg.fail_timeout_s,
                        torch.bfloat16 if cfg.grad_comm_dtype == "bf16" else torch.float32)
            report = _Reporter(cfg, self.sizes) if g.is_reporter else None
            metrics = _StepMetrics(cfg, g, comm, report, self.sizes, self.model)
            evaluator = Evaluator(self.model, g, batch_fn(cfg, sampler_for(cfg, held_out=True)), cfg.eval_batches,
                                  cfg.eval_every, cfg.steps, cfg.activation_shape, self.device,
                                  cfg.precision, loss_of(cfg.spec)) if cfg.eval_every else None

            def on_step(r: StepRecord) -> None:  # r.step counts from this run's first step
                self._maybe_save(r.step + self.first_step)
                if evaluator and evaluator.due(r.step + self.first_step):
                    r.val_loss_sum, r.val_count = evaluator.run(r.step + 1)  # W(t+1), OPT t's
                metrics.step(r)

            engine = Engine(self.schedule, self.model, g, comm, batch_fn(cfg, self.sampler), self.device, rec,
                            on_step=on_step,
                            delay_s=cfg.straggler[1] if cfg.straggler and cfg.straggler[0] == g.rank else 0.0,
                            kill_step=cfg.kill[1] if cfg.kill and cfg.kill[0] == g.rank and not _restarted() else None,
                            rule=UpdateRule.of(cfg), precision=cfg.precision, loss_fn=loss_of(cfg.spec))
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
            if cfg.export_hf is not None:
                self._export_hf()
            if cfg.trace_out is not None:
                _write_trace(cfg.trace_out, rec, t_start, g)
            g.control.barrier()
            g.release()
            return report.finish() if report else None
        finally:
            self.log.close()


class _StepMetrics:
    """Per-step numbers from every rank, summed over the world with one small all-reduce per
    step on its own group. It is asynchronous and waited two steps later, so metrics never
    hold the pipeline back."""

    FIELDS = ("loss", "exposed_p2p_s", "exposed_allreduce_s", "exposed_sparse_s", "compute_s", "transfers",
              "comm_cpu_s", "step_time_s", "embedding_bytes", "embedding_method", "early_chunks", "val_loss_sum",
              "val_count", "grad_norm", "lr", "skipped")
    # per-rank figures: each rank fills its own slot of each (a sum of them is a gather)
    PER_RANK = ("compute_cpu", "tied", "rss", "peak_rss", "process_cpu", "engine_cpu", "wakeups")
    METHODS = ("dense", "allgather", "alltoall")  # embedding_method is sent as 1 + its index
    LAG = 2

    def __init__(self, cfg: TrainConfig, g: Groups, comm: Comm, report: "_Reporter | None", sizes: list[int],
                 model: StageModel):
        self.cfg, self.g, self.comm, self.report, self.sizes, self.model = cfg, g, comm, report, sizes, model
        self.pending: list[tuple[int, float, torch.Tensor, Handle]] = []
        self.last_end: float | None = None
        self.last_cpu = (0.0, 0.0)
        self.engine_tid, self.last_wakeups = 0, None
        # the reporter's host: where its cores' time went in each step (runtime/hostcpu.py)
        self.last_host, self.host_share = None, {}

    def start(self, t: float) -> None:
        """Training starts now (on the thread that runs the engine): the first step's window
        and CPU are counted from here, not from the set-up before."""
        self.last_end = t
        # all of this process's threads, and the engine's; each step's figures run to its
        # metrics.step, which on_step calls after OPT and after any checkpoint or evaluation
        # it takes (the simulator models neither; the bench takes none)
        self.last_cpu = (time.process_time(), time.thread_time())
        self.engine_tid = threading.get_native_id()
        self.last_wakeups = others_wakeups(self.engine_tid)
        if self.report is not None:
            self.last_host = host_cpu_s()

    def step(self, rec: StepRecord) -> None:
        st = self.comm.stats.take(rec.step)
        exposed, transfers, cpu_s = st["exposed"], st["transfers"], st["cpu_s"]
        loss = sum(rec.losses) / len(rec.losses) if rec.losses else 0.0
        window = rec.end_time - (self.last_end if self.last_end is not None else rec.end_time)
        self.last_end = rec.end_time
        method = self.METHODS.index(st["embedding_method"]) + 1 if st["embedding_method"] else 0
        nf, world = len(self.FIELDS), self.cfg.world_size
        vec = torch.zeros(nf + len(self.PER_RANK) * world, dtype=torch.float64)
        vec[:nf] = torch.tensor([loss, exposed.get("p2p", 0.0), exposed.get("allreduce", 0.0),
                                 exposed.get("sparse", 0.0), rec.compute_s, float(transfers), cpu_s,
                                 window, st["embedding_bytes"], method, st["early_chunks"], rec.val_loss_sum,
                                 float(rec.val_count), 0.0, 0.0, 0.0],
                                dtype=torch.float64)
        if self.g.is_reporter:  # the same on every rank: one writes them
            vec[nf - 3:nf] = torch.tensor([rec.grad_norm, rec.lr, float(rec.skipped)], dtype=torch.float64)
        mine = {"compute_cpu": rec.compute_cpu_s, "rss": _rss_mb(), "peak_rss": _peak_rss_mb()}
        if self.model.tied is not None:
            mine["tied"] = self.model.checksum(rec.step + 1, self.model.tied)
        cpu = (time.process_time(), time.thread_time())
        mine["process_cpu"], mine["engine_cpu"] = cpu[0] - self.last_cpu[0], cpu[1] - self.last_cpu[1]
        self.last_cpu = cpu
        wakeups = others_wakeups(self.engine_tid)
        if wakeups is not None and self.last_wakeups is not None:
            mine["wakeups"] = max(wakeups - self.last_wakeups, 0)
        self.last_wakeups = wakeups
        if self.report is not None:
            host = host_cpu_s()
            self.host_share[rec.step] = shares(self.last_host, host)
            self.last_host = host
        for k, value in mine.items():
            vec[nf + self.PER_RANK.index(k) * world + self.g.rank] = value
        self.pending.append((rec.step, rec.end_time, vec, self.g.control.all_reduce(vec)))
        while len(self.pending) > self.LAG:
            self._emit(*self.pending.pop(0))

    def flush(self) -> None:
        while self.pending:
            self._emit(*self.pending.pop(0))

    def _emit(self, step: int, end: float, vec: torch.Tensor, handle: Handle) -> None:
        handle.wait()
        world = self.cfg.world_size
        v = dict(zip(self.FIELDS, vec.tolist()))
        nf = len(self.FIELDS)
        compute_cpu, tied, rss, peak_rss, process_cpu, engine_cpu, wakeups = (
            vec[nf + i * world:nf + (i + 1) * world].tolist() for i in range(len(self.PER_RANK)))
        if self.comm.tuner:  # the same numbers on every rank: the same decision everywhere
            self.comm.tuner.observe(step, v["step_time_s"] / world)
        if self.report is None:
            return
        row = {"loss": v["loss"] / self.cfg.dp,  # only last-stage ranks contribute a loss
               "comm_policy": self.cfg.comm_policy, "lr": v["lr"], "skipped": bool(v["skipped"]),
               # With a table tied across stages each end's norm holds only its own part of the tied gradient.
               "grad_norm": None if self.cfg.spec.tie_embeddings and self.cfg.pp > 1 else v["grad_norm"],
               "precision": self.cfg.precision,
               "val_loss": v["val_loss_sum"] / v["val_count"] if v["val_count"] else None}
        if row["val_loss"] is not None:
            row["val_perplexity"] = math.exp(min(row["val_loss"], 700.0))
        for k in ("exposed_p2p_s", "exposed_allreduce_s", "exposed_sparse_s", "compute_s"):
            row[k] = v[k] / world  # mean per rank
        row["rank_compute_cpu_s"] = compute_cpu
        # since the rank's previous step ended: every thread of it (compute, its own
        # communication threads, gloo's), and the engine thread alone (compute, the waits'
        # bookkeeping, the data): what the simulator charges the shared cores is checked against these
        row["rank_cpu_s"] = process_cpu
        row["rank_engine_cpu_s"] = engine_cpu
        # wake-ups of the rank's other threads since its previous step (0 without /proc):
        # each preempts computation where the cores are shared (runtime/wakeups.py)
        row["rank_wakeups"] = wakeups
        # the reporter's host since its previous step: each kind's share of all its cores'
        # time (user, system, idle, irq, steal); what no rank is charged for is in idle and irq
        row["host_cpu_share"] = self.host_share.pop(step, None)
        row["rank_rss_mb"] = rss
        row["rank_peak_rss_mb"] = peak_rss  # the high-water mark since this run started
        for cls in ("intra", "inter"):  # probed at start-up, and achieved since (this rank's view)
            row[f"{cls}_probed_MBps"] = self.comm.topo.link(cls).bytes_per_s / 1e6
            row[f"{cls}_achieved_MBps"] = self.comm.links.bytes_per_s[cls] / 1e6
        replicas_with_table = self.cfg.dp  # the first stage's replicas exchange the table
        row["embedding_bytes"] = v["embedding_bytes"] / replicas_with_table
        code = round(v["embedding_method"] / replicas_with_table)
        row["embedding_method"] = self.METHODS[code - 1] if code else None
        if self.model.tied is not None or self.cfg.spec.tie_embeddings:
            row["tied_checksums"] = tied
        row["partition"] = self.sizes
        row["rank_order"] = self.g.layout.order
        row["transfers"] = int(v["transfers"])
        row["chunks_ready_early"] = int(v["early_chunks"])  # readied by gradient hooks while backward ran
        row["hierarchical_allreduce"] = self.g.hierarchy is not None
        p = self.comm.policy_for(step)
        row["partition_mb"] = p.partition_bytes / MiB if p.partition_bytes else None
        row["credit_mb"] = p.credit_bytes / MiB if p.credit_bytes else None
        row["comm_cpu_us_per_transfer"] = 1e6 * v["comm_cpu_s"] / max(v["transfers"], 1)
        self.report.step(step + self.model.offset, end, row)


def _rss_mb() -> float:
    """Resident memory of this process (Linux /proc; 0 where it is not available)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def _reset_peak_rss() -> None:
    """Restart VmHWM from the current resident size (Linux: "5" to clear_refs), so a worker
    running several jobs reports each job's own peak. Where it cannot, the peak stays the
    process's since start, an upper bound."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_mb() -> float:
    """This process's peak resident memory since the run started (_reset_peak_rss): VmHWM,
    the high-water mark of its own address space. (Not getrusage's ru_maxrss, which Linux
    carries across exec: a worker started from a large parent would report the parent's size.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def _write_trace(out_dir: Path, rec: Recorder, t_start: float, g: Groups) -> None:
    """Gather every rank's events to rank 0, which writes one timeline for the job."""
    origin = torch.tensor([t_start], dtype=torch.float64)
    g.control.all_reduce(origin, op=dist.ReduceOp.MIN).wait()
    events = rec.events(origin.item())
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    g.control.gather_object(events, gathered, dst=0)
    if dist.get_rank() == 0:
        write_trace(Path(out_dir) / "trace.json", [e for evs in gathered for e in evs])


class _Reporter:
    """Progress bar, per-step metrics file and the closing summary, on one rank."""

    def __init__(self, cfg: TrainConfig, sizes: list[int]):
        self.cfg, self.sizes, self.rows = cfg, sizes, []
        self.val: float | None = None  # the latest validation loss, shown until the next
        self.bar = tqdm(total=cfg.steps, desc=f"train {cfg.model} {cfg.schedule} pp={cfg.pp} dp={cfg.dp}",
                        unit="step", disable=not cfg.progress, file=sys.stderr, dynamic_ncols=True)
        self.out = None
        if cfg.metrics_out:
            Path(cfg.metrics_out).parent.mkdir(parents=True, exist_ok=True)
            self.out = open(cfg.metrics_out, "w")

    def start(self, t: float) -> None:
        self.last = t

    def step(self, step: int, end: float, values: dict) -> None:
        dt, self.last = end - self.last, end
        row = {"step": step, "loss": values["loss"], "step_time_s": dt, "tokens_per_s": self.cfg.tokens_per_step / dt,
               "schedule": self.cfg.schedule, "pp": self.cfg.pp, "dp": self.cfg.dp, **values}
        self.rows.append(row)
        if self.out:
            self.out.write(json.dumps(row) + "\n")
            self.out.flush()
        shown = {"loss": f"{row['loss']:.3f}"}
        if row.get("val_loss") is not None:
            self.val = row["val_loss"]
        if self.val is not None:
            shown["val"] = f"{self.val:.3f}"
        if "lr" in row:  # (the torch peer's rows have no update-rule figures)
            shown["lr"] = f"{row['lr']:.2g}"
        shown["tok_s"] = f"{row['tokens_per_s']:.0f}"
        self.bar.set_postfix(shown)
        self.bar.update()

    def close(self) -> None:
        self.bar.close()
        if self.out:
            self.out.close()

    def finish(self) -> list[dict]:
        self.close()
        steady = self.rows[1:] or self.rows  # the first step includes warm-up
        mean_dt = sum(r["step_time_s"] for r in steady) / len(steady)
        last = self.rows[-1]
        val = next((r["val_loss"] for r in reversed(self.rows) if r.get("val_loss") is not None), None)
        skipped = sum(r.get("skipped", False) for r in self.rows)
        peaks = [max(r["rank_peak_rss_mb"]) for r in self.rows if "rank_peak_rss_mb" in r]
        print(f"done: {self.cfg.model} {self.cfg.schedule} {self.cfg.comm_policy} pp={self.cfg.pp} dp={self.cfg.dp} "
              f"stages={self.sizes} {self.cfg.precision} | {len(self.rows)} steps, final loss {last['loss']:.4f}"
              + (f", val loss {val:.4f}" if val is not None else "")
              + (f", {skipped} update(s) skipped (non-finite)" if skipped else "")
              + f", {self.cfg.tokens_per_step / mean_dt:.0f} tokens/s, {mean_dt:.3f} s/step (mean after step 0)"
              + (f", lr {last['lr']:.3g}" if "lr" in last else "")
              + (f", peak {max(peaks):.0f} MB/rank" if peaks else ""), flush=True)
        return self.rows
