"""One process of the testbed's contention probe (testbed_contention.cpu_contention): it
computes the model over and over, beside a thread that wakes as often as a rank's
communication threads do, and times each iteration inside a window shared by all.

    python -m trirace.calibrate.contention_worker JOB THREADS GO SECONDS OUT WAKE_HZ WARM_STEPS

JOB: the job's config as JSON. The process writes OUT.ready once warm, waits for the GO
file (which holds the window's start time), and writes its iterations' times to OUT."""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from ..config import TrainConfig
from ..runtime.wakeups import Waker
from .layers import model_step


def main(argv: list[str]) -> None:
    job, threads, go, seconds, out = argv[0], int(argv[1]), argv[2], float(argv[3]), argv[4]
    wake_hz, warm_steps = float(argv[5]), int(argv[6])
    with open(job) as f:
        cfg = TrainConfig(**json.load(f))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    waker, woke = Waker(wake_hz).__enter__(), time.time()  # the job's communication threads' wake-ups, throughout
    step = model_step(cfg)
    for _ in range(warm_steps):  # a fresh process's first steps run slow: ready only after them
        step()
    open(out + ".ready", "w").close()
    while not os.path.exists(go):  # keep computing until every copy is ready
        step()
    with open(go) as f:
        start = float(f.read())
    while time.time() < start:
        step()
    times = []
    while not times or time.time() < start + seconds:  # at least one step, however slow
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    waker.__exit__()
    with open(out, "w") as f:
        json.dump({"mean": sum(times) / len(times), "best": min(times), "times": times,
                   "wake_hz": waker.wakeups / (time.time() - woke)}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
