import sys, math, random; sys.path.insert(0, ".")
from trirace.sim import executor as E
from trirace.config import make_config
from trirace.sim.calibration import load_calibration
from trirace.sim.cluster import load_cluster
from trirace.sim.run import simulate
import json
orig = E.Simulation.run_compute
cv = float(sys.argv[1])
rng = random.Random(0)
s2 = math.log(1 + cv * cv)
def patched(self, stage, seconds, done):
    f = rng.lognormvariate(-s2 / 2, math.sqrt(s2)) if cv > 0 else 1.0
    return orig(self, stage, seconds * f, done)
E.Simulation.run_compute = patched
acc = json.load(open("docs/bench/sim-accuracy/accuracy.json"))
for cell in acc["cells"]:
    got = cell["config"]; nodes, rpn, link = cell["cluster"]
    job = make_config({k: got[k] for k in ("model", "pp", "dp", "schedule", "micro_batches", "micro_batch_size", "seq_len", "steps", "partition", "rank_order", "seed", "optimizer")})
    cal = load_calibration("docs/bench/sim-accuracy/" + cell["calibration"]); cluster = load_cluster("testbed", nodes, rpn, link)
    row = []
    for m in cell["measured"]:
        rng.seed(0)
        p = simulate(job, cluster, m["system"], cal).iteration_time_s
        row.append(f"{p / m['step_time_s'] - 1:+.1%}")
    print(cell["name"], row)
