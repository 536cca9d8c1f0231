"""Per-step numbers from every rank, gathered for the reporter (obs/report.py)."""

from __future__ import annotations

import math
import threading
import time

import torch

from ..policy.driver import TIMED_OPS
from ..policy.policies import MiB
from ..config import TrainConfig
from ..obs.memory import peak_rss_mb, rss_mb
from ..obs.report import Reporter
from .stage_comm import StageComm
from .communicator import Handle
from .engine import StepRecord
from .groups import Groups
from .hostcpu import host_cpu_s, shares
from .stage import StageModel
from .wakeups import others_wakeups


class StepMetrics:
    """Per-step numbers from every rank, summed over the world with one small all-reduce per
    step on its own group. It is asynchronous and waited two steps later, so metrics never
    hold the pipeline back."""

    FIELDS = ("loss", "exposed_p2p_s", "exposed_allreduce_s", "exposed_sparse_s", "compute_s", "transfers",
              "comm_cpu_s", "step_time_s", "embedding_bytes", "embedding_method", "val_loss_sum",
              "val_count", "grad_norm", "lr", "skipped")
    # per-rank figures: each rank fills its own slot of each (a sum of them is a gather)
    PER_RANK = ("compute_cpu", "tied", "rss", "peak_rss", "process_cpu", "engine_cpu", "wakeups",
                *(f"{op.value}_s" for op in TIMED_OPS))  # the last ones: mean seconds per action of that kind
    METHODS = ("dense", "allgather", "alltoall")  # embedding_method is sent as 1 + its index
    LAG = 2

    def __init__(self, cfg: TrainConfig, g: Groups, comm: StageComm, report: Reporter | None, sizes: list[int],
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
                                 window, st["embedding_bytes"], method, rec.val_loss_sum,
                                 float(rec.val_count), 0.0, 0.0, 0.0],
                                dtype=torch.float64)
        if self.g.is_reporter:  # the same on every rank: one writes them
            vec[nf - 3:nf] = torch.tensor([rec.grad_norm, rec.lr, float(rec.skipped)], dtype=torch.float64)
        mine = {"compute_cpu": rec.compute_cpu_s, "rss": rss_mb(), "peak_rss": peak_rss_mb()}
        for op, (seconds, count) in rec.op_s.items():
            mine[f"{op}_s"] = seconds / count
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
        compute_cpu, tied, rss, peak_rss, process_cpu, engine_cpu, wakeups, *per_op = (
            vec[nf + i * world:nf + (i + 1) * world].tolist() for i in range(len(self.PER_RANK)))
        # The same numbers on every rank: the same decisions everywhere.
        if self.comm.tuner:
            self.comm.tuner.observe(step, v["step_time_s"] / world)
        replicas = self.g.plan.stages[self.g.stage].ranks  # the slowest replica of my stage
        self.comm.observe_compute(step, {op: max(times[r] for r in replicas)
                                         for op, times in zip(TIMED_OPS, per_op)})
        if self.report is None:
            return
        row = {"loss": v["loss"] / self.cfg.parallel.dp,  # only last-stage ranks contribute a loss
               "comm_policy": self.cfg.comm.policy, "lr": v["lr"], "skipped": bool(v["skipped"]),
               # With a table tied across stages each end's norm holds only its own part of the tied gradient.
               "grad_norm": None if self.cfg.spec.tie_embeddings and self.cfg.parallel.pp > 1 else v["grad_norm"],
               "precision": self.cfg.model.precision,
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
        replicas_with_table = self.cfg.parallel.dp  # the first stage's replicas exchange the table
        row["embedding_bytes"] = v["embedding_bytes"] / replicas_with_table
        code = round(v["embedding_method"] / replicas_with_table)
        row["embedding_method"] = self.METHODS[code - 1] if code else None
        if self.model.tied is not None or self.cfg.spec.tie_embeddings:
            row["tied_checksums"] = tied
        row["partition"] = self.sizes
        row["rank_order"] = self.g.layout.order
        row["transfers"] = int(v["transfers"])
        row["hierarchical_allreduce"] = self.g.hierarchy is not None
        p = self.comm.policy_for(step)
        row["partition_mb"] = p.partition_bytes / MiB if p.partition_bytes else None
        row["credit_mb"] = p.credit_bytes / MiB if p.credit_bytes else None
        row["comm_cpu_us_per_transfer"] = 1e6 * v["comm_cpu_s"] / max(v["transfers"], 1)
        self.report.step(step + self.model.offset, end, row)
