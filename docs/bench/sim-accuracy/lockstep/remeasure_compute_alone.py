"""Host re-measured with compute alone (the calibration's contention curve kept) against
compute and the after-cell contention reading, over the saved matrices."""
import json, statistics, sys
from pathlib import Path
from trirace.bench.sim_accuracy import at_host_speed, cell_job
from trirace.sim.calibration import load_calibration
from trirace.sim.cluster import load_cluster
from trirace.sim.run import simulate
for where in sys.argv[1:]:
    D = Path(where); d = json.loads((D / "accuracy.json").read_text())
    both, alone = [], []
    for c in d["cells"]:
        if not c.get("contention_after"): continue
        nodes, rpn, link = c["cluster"]; job = cell_job(c); cal = load_calibration(D / c["calibration"])
        cl = load_cluster("testbed", nodes, rpn, link)
        a, _ = at_host_speed(cal, statistics.mean(c["compute_s"]))
        b, _ = at_host_speed(cal, statistics.mean(c["compute_s"]), c["contention_after"])
        for m, r in zip(c["measured"], c["results"]):
            both.append(simulate(job, cl, m["system"], b).iteration_time_s / m["step_time_s"] - 1)
            alone.append(simulate(job, cl, m["system"], a).iteration_time_s / m["step_time_s"] - 1)
    f = lambda xs: f"{sum(abs(x) <= 0.05 for x in xs)}/{len(xs)} mean {100*statistics.fmean(abs(x) for x in xs):.1f}%"
    print(where, "compute+contention:", f(both), "| compute alone:", f(alone), flush=True)
