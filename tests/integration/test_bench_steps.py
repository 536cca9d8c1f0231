"""`trirace bench`'s per-step record, from real runs on loopback (gloo, two ranks)."""
import statistics

from trirace.bench.side_by_side import Cluster, run
from trirace.config import make_config
from trirace.plan.bounds import DRAIN_STEPS, WARMUP_STEPS


def test_every_steady_step_keeps_its_time_and_its_ranks_cpu():
    steps = WARMUP_STEPS + DRAIN_STEPS + 3
    base = make_config({"model": "gpt-test", "pp": 2, "dp": 1, "micro_batches": 2, "steps": steps,
                        "data": "synthetic"})
    out = run(base, Cluster(nodes=1, ranks_per_node=2, link=None), systems=("blocking", "fifo"), rounds=2)
    for r in out["results"]:
        assert len(r["steps_s"]) == 2 and len(r["steps_cpu_s"]) == 2  # one list a round
        for times, cpu in zip(r["steps_s"], r["steps_cpu_s"]):
            assert len(times) == len(cpu) == 3  # the steady steps, paired one to one
            assert all(c > 0 for c in cpu)
        # each step's CPU is both ranks' sum (one rank's alone would be about half of it)
        every = [c for rnd in r["steps_cpu_s"] for c in rnd]
        assert abs(statistics.median(every) / sum(r["cpu_s"]) - 1) < 0.25
