"""Re-predict a saved matrix with calibration fields overridden (diagnostic): what a model
change would have predicted for measurements already taken.
    python docs/bench/sim-accuracy/lockstep/whatif.py DIR/accuracy.json sparse_local_s=0.0085"""
import dataclasses, json, statistics, sys; sys.path.insert(0, ".")
from pathlib import Path
from trirace.bench.sim_accuracy import cell_job
from trirace.sim.calibration import load_calibration
from trirace.sim.cluster import load_cluster
from trirace.sim.run import simulate


def repredict(src: Path, adjust, label: str) -> None:
    """Print each cell's errors with its calibration passed through `adjust(cal, cell)`, then the summary."""
    errs = []
    for cell in json.loads(src.read_text())["cells"]:
        nodes, rpn, link = cell["cluster"]
        job, cal = cell_job(cell), adjust(load_calibration(src.parent / cell["calibration"]), cell)
        out = []
        for m in cell["measured"]:
            e = simulate(job, load_cluster("testbed", nodes, rpn, link), m["system"], cal).iteration_time_s / m["step_time_s"] - 1
            errs.append(e); out.append(f"{m['system']} {e * 100:+.1f}%")
        print(cell["name"], " ".join(out), flush=True)
    a = [abs(e) for e in errs]
    print(f"{label}: {sum(x <= 0.05 for x in a)} of {len(a)} within 5%, mean |error| {statistics.fmean(a) * 100:.2f}%, "
          f"signed mean {statistics.fmean(errs) * 100:+.2f}%, worst {max(a) * 100:.1f}%")


if __name__ == "__main__":
    override = {k: float(v) for k, v in (a.split("=") for a in sys.argv[2:])}
    repredict(Path(sys.argv[1]), lambda cal, cell: dataclasses.replace(cal, **override), str(override))
