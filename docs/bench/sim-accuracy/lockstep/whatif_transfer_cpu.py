"""Diagnostic (stop 38): re-predict a matrix with each rate's transfer_cpu taken from another matrix's calibration at that rate.
    python docs/bench/sim-accuracy/lockstep/whatif_transfer_cpu.py docs/bench/sim-accuracy/accuracy.json docs/bench/sim-accuracy/ace5679"""
import dataclasses, json, statistics, sys; sys.path.insert(0, ".")
from pathlib import Path
from trirace.config import make_config
from trirace.sim.calibration import load_calibration
from trirace.sim.cluster import load_cluster
from trirace.sim.run import simulate
src = Path(sys.argv[1]); other = Path(sys.argv[2]); p = json.loads(src.read_text())
errs = []
for cell in p["cells"]:
    got = cell["config"]; nodes, rpn, link = cell["cluster"]
    job = make_config({k: got[k] for k in ("model", "pp", "dp", "schedule", "micro_batches", "micro_batch_size",
                                           "seq_len", "steps", "partition", "rank_order", "seed", "optimizer")})
    cal = load_calibration(src.parent / cell["calibration"])
    cal = dataclasses.replace(cal, transfer_cpu=load_calibration(other / cell["calibration"]).transfer_cpu)
    out = []
    for m in cell["measured"]:
        e = simulate(job, load_cluster("testbed", nodes, rpn, link), m["system"], cal).iteration_time_s / m["step_time_s"] - 1
        errs.append(e); out.append(f"{m['system']} {e * 100:+.1f}%")
    print(cell["name"], " ".join(out), flush=True)
a = [abs(e) for e in errs]
print(f"{sum(x <= 0.05 for x in a)} of {len(a)} within 5%, mean |error| {statistics.fmean(a) * 100:.2f}%, "
      f"signed mean {statistics.fmean(errs) * 100:+.2f}%, worst {max(a) * 100:.1f}%")
