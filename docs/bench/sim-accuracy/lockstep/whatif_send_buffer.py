"""The 2x2 cells of 16dfd1f's matrix predicted with and without the calibrated send
buffer, beside the measured step and exposed P2P (stop 43). Run from the repository root."""
import json
from dataclasses import replace
from pathlib import Path
from trirace.bench.sim_accuracy import cell_job
from trirace.sim.calibration import load_calibration
from trirace.sim.cluster import load_cluster
from trirace.sim.run import simulate
D = Path("docs/bench/sim-accuracy/16dfd1f")  # the matrix installed at stop 43
d = json.loads((D / "accuracy.json").read_text())
for c in d["cells"]:
    if not c["name"].startswith("2x2"): continue
    nodes, rpn, link = c["cluster"]
    job = cell_job(c); cal = load_calibration(D / c["calibration"]); cl = load_cluster("testbed", nodes, rpn, link)
    m = {r["system"]: r for r in c["measured"]}
    for pol in ("blocking", "fifo"):
        a = simulate(job, cl, pol, cal); b = simulate(job, cl, pol, replace(cal, send_buffer=None))
        print(c["name"], pol, "meas %.3f p2p %.3f" % (m[pol]["step_time_s"], m[pol]["exposed_p2p_s"]),
              "| sim %.3f p2p %.3f" % (a.iteration_time_s, a.exposed_comm_s["p2p"]),
              "| no send buffer %.3f p2p %.3f" % (b.iteration_time_s, b.exposed_comm_s["p2p"]))
