"""Starting the processes: locally (one command spawns pp x dp workers, one per GPU under
NCCL) or under torchrun (env:// rendezvous). The backend is --backend, or for auto NCCL
where every local rank has a CUDA device of its own, gloo otherwise."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import typing
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import TrainConfig, make_config
from .. import preflight
from ..errors import Diverged, UsageError
from ..plan.memory import check_memory
from ..plan.topology import load_topology
from . import allocator, checkpoint, gloo
from ..data.batches import sampler_for
from .device import job_device, resolve_backend
from .trainer import RankFailed, Trainer, plan_partition


class WorkerFailed(RuntimeError):
    """A worker process exited abnormally; the others were stopped."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def quit_now(status: int) -> typing.NoReturn:
    """End a process of ours whose work is done and written: flush, then exit without the
    interpreter's teardown. Rarely (a few in a hundred runs under load, always after the
    last step, on a last-stage rank) a rank aborted in that teardown with "terminate called
    without an active exception", after its results were out; the native threads of the
    communication libraries are the likely cause. Nothing of ours needs the teardown:
    files are closed and every handle waited before this point."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def train(cfg: TrainConfig, model=None) -> list[dict] | None:
    """Train with `cfg`: under torchrun on this process's rank, otherwise by spawning
    cfg.parallel.pp * cfg.parallel.dp local processes. Returns the per-step metrics (on the reporter rank).
    `model`: your own layers (a trirace.LayerModel) instead of cfg.model.name."""
    if model is not None:
        with tempfile.TemporaryDirectory(prefix="trirace-model-") as scratch:  # a layer list's file lives here
            ref = model.ref(Path(scratch) if not under_torchrun() else None)
            return train(make_config({**cfg.flat(), "model": "custom", "layer_model": ref}))
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if world != cfg.world_size:
            raise UsageError(f"pp x dp = {cfg.parallel.pp} x {cfg.parallel.dp} = {cfg.world_size} but torchrun started {world} ranks")
        preflight.train_outputs(cfg)
        allocator.use()  # this process is a rank, as a local worker is (runtime/worker.py)
        backend = resolve_backend(cfg.comm.backend, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        if cfg.parallel.memory_check:
            check_memory(cfg, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), on_gpu=backend == "nccl")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and cfg.checkpoint.dir is not None:
            # Restarted by torchrun: go on from the checkpoint (require stays require).
            cfg = cfg.with_(resume="auto" if cfg.checkpoint.resume == "off" else cfg.checkpoint.resume)
        timeout = timedelta(seconds=cfg.faults.fail_timeout_s)
        # Keys of a failed attempt stay in torchrun's store; a fresh prefix per restart keeps
        # the new attempt's gloo mesh from dialling the old attempt's (dead) addresses.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(gloo.backend(backend), store=dist.PrefixStore(f"trirace/attempt-{attempt}", store),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
        try:
            rows = Trainer(cfg).run()
        except RankFailed as e:
            print(f"trirace: {e}", file=sys.stderr, flush=True)
            os._exit(1)  # not destroy_process_group: it may wait on a dead peer
        except Diverged as e:  # every rank stops at the same update
            if dist.get_rank() == 0:
                print(f"trirace: {e}", file=sys.stderr, flush=True)
            os._exit(Diverged.EXIT_STATUS)  # posted receives will never complete: no destroy
        dist.destroy_process_group()
        return rows
    return run_local([cfg])[0]


def prepare(cfg: TrainConfig) -> TrainConfig:
    """Work done once before spawning: validate the data (and build its token cache) and fix
    the partition, so the workers all load the same cache and cut the same stages."""
    preflight.train_outputs(cfg)
    if cfg.parallel.memory_check:  # before anything builds the model (a time-balanced partition would)
        check_memory(cfg, cfg.world_size, on_gpu=resolve_backend(cfg.comm.backend, cfg.world_size) == "nccl")
    if cfg.comm.topology is not None:
        load_topology(cfg.comm.topology).check(cfg.world_size)
    sampler = sampler_for(cfg)
    if job_device(cfg).type == "cpu":
        cfg = cfg.with_(partition=plan_partition(cfg, sampler))
        checkpoint.resume_point(cfg)  # a bad checkpoint: one line now, not a worker's traceback
    # A GPU job's layers are timed by rank 0 on its own device (Trainer): timed here, the
    # launcher would hold a CUDA context and cached buffers on a rank's GPU for the whole run.
    return cfg


def run_local(cfgs: list[TrainConfig], world_size: int | None = None, timeout_s: float | None = None,
              systems: list[str] | None = None, rank_command: Callable[[int], list[str]] | None = None,
              rank_env: Callable[[int], dict[str, str]] | None = None, quiet: bool = False) -> list[list[dict]]:
    """Run several configurations one after another in one set of worker processes (one
    start-up for all of them: what tests and benchmarks want). Each config must use
    pp * dp == world_size ranks. `systems` names what runs each config ("trirace", or a
    peer system's "MODULE:FUNCTION": runtime/worker.py); `rank_command`/`rank_env` let a caller wrap a rank's
    process (e.g. `ip netns exec NODE`) and set its environment. `quiet`: the workers'
    standard output (each job's summary line) is dropped; errors still reach stderr.
    Returns the reporter's metrics per config."""
    world_size = world_size or cfgs[0].world_size
    for c in cfgs:
        if c.world_size != world_size:
            raise UsageError(f"config needs {c.world_size} ranks but the job has {world_size}")
    backend = resolve_backend(cfgs[0].comm.backend, world_size)
    if any(resolve_backend(c.comm.backend, world_size) != backend for c in cfgs):
        raise UsageError("configs run in one set of processes must use one backend")
    cfgs = [prepare(c) for c in cfgs]
    systems = systems or ["trirace"] * len(cfgs)
    with tempfile.TemporaryDirectory(prefix="trirace-") as tmp:
        jobs = Path(tmp) / "jobs.json"
        jobs.write_text(json.dumps({"backend": backend, "jobs": [{"system": s, "config": c.model_dump(mode="json")}
                                                                 for s, c in zip(systems, cfgs)]}))
        procs = []
        try:
            for r in range(world_size):
                cmd = [*(rank_command(r) if rank_command else []), sys.executable, "-m", "trirace.runtime.worker",
                       str(jobs), str(r), str(world_size), str(Path(tmp) / "store"), tmp]
                env = {**os.environ, **(rank_env(r) if rank_env else {}),
                       "TRIRACE_PROGRESS_FILE": str(Path(tmp) / f"progress-{r}")}
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL if quiet else None))
            _supervise(procs, timeout_s, Path(tmp))
        finally:
            _stop(procs)
        out = []
        for i in range(len(cfgs)):
            f = Path(tmp) / f"result-{i}.json"
            if not f.exists():  # every rank exited 0 yet the reporter wrote nothing: never pass that off as a run
                raise WorkerFailed(f"job {i} ended without the reporter rank's metrics")
            out.append(json.loads(f.read_text()))
        return out


def _supervise(procs: list[subprocess.Popen], timeout_s: float | None, tmp: Path) -> None:
    """Wait for all workers; the first to fail stops the rest (no hung survivors). One
    waiting thread per worker turns exits into queue events: nothing polls."""
    exits: queue.Queue = queue.Queue()
    for rank, p in enumerate(procs):
        threading.Thread(target=lambda r=rank, p=p: exits.put((r, p.wait())), daemon=True).start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    for _ in procs:
        try:
            rank, code = exits.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise WorkerFailed(f"job did not finish within {timeout_s} s") from None
        if code == Diverged.EXIT_STATUS and (note := tmp / f"diverged-{rank}").exists():
            # Every rank stops at this update: let the others finish writing (metrics of the
            # steps before it) rather than kill them; _stop() ends any that do not.
            _drain(exits, len(procs) - 1, grace_s=30.0)
            found = json.loads(note.read_text())
            raise Diverged(found["step"], found["what"])
        if code != 0:
            done = tmp / f"progress-{rank}"  # the step of its latest forward
            step = int(done.read_text()) if done.exists() else 0
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise WorkerFailed(f"rank {rank} {how} during step {step}; stopped the other ranks")


def _drain(exits: queue.Queue, n: int, grace_s: float) -> None:
    """Wait up to grace_s for n more workers to exit, whatever their status."""
    deadline = time.monotonic() + grace_s
    for _ in range(n):
        try:
            exits.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
