"""Starting the processes: locally (one command spawns pp x dp workers on gloo) or under
torchrun (env:// rendezvous, NCCL on GPUs, gloo on CPUs)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import tempfile
import traceback
from multiprocessing.connection import wait
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import TrainConfig
from ..errors import UsageError
from .trainer import Trainer, plan_partition, sampler_for


class WorkerFailed(RuntimeError):
    """A worker process exited abnormally; the others were stopped."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def train(cfg: TrainConfig) -> list[dict] | None:
    """Train with `cfg`: under torchrun on this process's rank, otherwise by spawning
    cfg.pp * cfg.dp local processes. Returns the per-step metrics (on the reporter rank)."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.world_size:
            raise UsageError(f"pp x dp = {cfg.pp} x {cfg.dp} = {cfg.world_size} but torchrun started {world} ranks")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
        try:
            return Trainer(cfg).run()
        finally:
            dist.destroy_process_group()
    return run_local([cfg])[0]


def prepare(cfg: TrainConfig) -> TrainConfig:
    """Work done once before spawning: validate the data (and build its token cache) and fix
    the partition, so the workers all load the same cache and cut the same stages."""
    sampler = sampler_for(cfg)
    return cfg.model_copy(update={"partition": plan_partition(cfg, sampler)})


def run_local(cfgs: list[TrainConfig], world_size: int | None = None, timeout_s: float | None = None) -> list[list[dict]]:
    """Run several configurations one after another in one set of local processes (one
    process start-up for all of them: what tests and benchmarks want). Each config must use
    pp * dp == world_size ranks. Returns the reporter's metrics per config."""
    world_size = world_size or cfgs[0].world_size
    for c in cfgs:
        if c.world_size != world_size:
            raise UsageError(f"config needs {c.world_size} ranks but the job has {world_size}")
    cfgs = [prepare(c) for c in cfgs]
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="trirace-") as tmp:
        store = Path(tmp) / "store"
        procs = [ctx.Process(target=_worker, args=(r, world_size, str(store), cfgs, tmp), daemon=True)
                 for r in range(world_size)]
        for p in procs:
            p.start()
        _supervise(procs, timeout_s)
        out = []
        for i in range(len(cfgs)):
            f = Path(tmp) / f"result-{i}.json"
            out.append(json.loads(f.read_text()) if f.exists() else [])
        return out


def _supervise(procs: list, timeout_s: float | None) -> None:
    """Wait for all workers; the first to fail stops the rest (no hung survivors)."""
    alive = {p.sentinel: (r, p) for r, p in enumerate(procs)}
    try:
        while alive:
            ready = wait(list(alive), timeout=timeout_s)
            if not ready:
                raise WorkerFailed(f"job did not finish within {timeout_s} s")
            for s in ready:
                rank, p = alive.pop(s)
                p.join()
                if p.exitcode != 0:
                    raise WorkerFailed(f"rank {rank} exited with status {p.exitcode}")
    finally:
        for _, p in alive.values():
            p.terminate()
        for _, p in alive.values():
            p.join(5)
            if p.is_alive():
                p.kill()


def _worker(rank: int, world_size: int, store: str, cfgs: list[TrainConfig], tmp: str) -> None:
    # Processes share the cores: one intra-op thread each unless cores are plentiful.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        for i, cfg in enumerate(cfgs):
            rows = Trainer(cfg).run()
            if rows is not None:
                part = Path(tmp) / f"result-{i}.json.part"
                part.write_text(json.dumps(rows))
                part.replace(part.with_suffix(""))
    except Exception:
        traceback.print_exc()
        raise SystemExit(1)
    finally:
        dist.destroy_process_group()
