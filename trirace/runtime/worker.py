"""One rank of a locally launched job: `python -m trirace.runtime.worker JOBS RANK WORLD STORE OUT`.

Runs every job in JOBS ({"backend", "jobs": [{"system", "config"}, ...]}) in order on one process group,
where a job's system is "trirace" (this package's Trainer) or "MODULE:FUNCTION", a function
that takes the TrainConfig and runs it on the initialised group (a peer system a benchmark
compares against: the runtime never imports the benchmarks),
rendezvous through a FileStore at STORE (a path: it works across network namespaces), and
the reporter rank writes OUT/result-<i>.json for job i.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import TrainConfig
from ..errors import Diverged
from . import allocator, gloo
from .launch import quit_now
from .trainer import RankFailed, Trainer


def run_job(system: str, cfg: TrainConfig) -> list[dict] | None:
    if system == "trirace":
        return Trainer(cfg).run()
    module, sep, function = system.partition(":")
    if not sep:
        raise ValueError(f"unknown system {system!r}: 'trirace' or MODULE:FUNCTION")
    return getattr(importlib.import_module(module), function)(cfg)


def run_jobs(jobs: list[dict], out: Path) -> None:
    """Run `jobs` in order on the initialised default group; the reporter writes
    OUT/result-<i>.json for job i. Each job leaves nothing behind: its process groups are
    destroyed when it ends, and its model, buffers and those groups' threads are collected
    before the next starts (a bench's twelfth job would otherwise run beside eleven jobs'
    leftovers).
    What survives the first job's collection is the process's own: torch's modules, and
    dynamo's, which the first optimizer imports (some 300,000 objects). It is frozen once,
    so later collections skip it, which makes each later job's start-up a fraction of a
    second shorter. The price: what of it dies later in a cycle is never freed."""
    for i, job in enumerate(jobs):
        rows = run_job(job["system"], TrainConfig(**job["config"]))
        gc.collect()
        if i == 0:
            gc.freeze()
        if rows is not None:
            part = out / f"result-{i}.json.part"
            part.write_text(json.dumps(rows))
            part.replace(out / f"result-{i}.json")


def main(argv: list[str]) -> int:
    jobs_file, rank, world, store, out = argv[0], int(argv[1]), int(argv[2]), argv[3], Path(argv[4])
    allocator.use()  # before the job allocates anything it will free and allocate again
    # Processes share the cores: one intra-op thread each unless cores are plentiful.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    spec = json.loads(Path(jobs_file).read_text())
    jobs, backend = spec["jobs"], spec["backend"]
    timeout = timedelta(seconds=TrainConfig(**jobs[0]["config"]).faults.fail_timeout_s)
    if backend == "nccl":  # one process per GPU: the local launcher runs every rank on this host
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(gloo.backend(backend), init_method=f"file://{store}", rank=rank, world_size=world, timeout=timeout)
    try:
        run_jobs(jobs, out)
    except RankFailed as e:
        print(f"trirace: {e}", file=sys.stderr, flush=True)
        os._exit(1)
    except Diverged as e:  # every rank stops at the same update; the launcher prints the line
        (out / f"diverged-{rank}").write_text(json.dumps({"step": e.step, "what": e.what}))
        os._exit(Diverged.EXIT_STATUS)  # not destroy_process_group: posted receives will never complete
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        # Not destroy_process_group: it may wait on work with a peer that is gone.
        os._exit(1)
    dist.destroy_process_group()
    quit_now(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
