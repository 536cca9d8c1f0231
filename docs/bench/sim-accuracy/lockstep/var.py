"""Re-predict the saved matrix with each computation's time multiplied by lognormal noise
(mean 1, coefficient of variation argv[1]; seed 0 for every simulation): does compute
variance explain the misses? Uses sim_accuracy.predict, the bench's own prediction."""
import math, random, sys; sys.path.insert(0, ".")
import json
from pathlib import Path
from trirace.bench import sim_accuracy
from trirace.sim import executor as E

DIR = Path("docs/bench/sim-accuracy")
cv = float(sys.argv[1])
rng = random.Random(0)
s2 = math.log(1 + cv * cv)
run_compute, simulate = E.Simulation.run_compute, sim_accuracy.simulate


def noisy(self, stage, seconds, done):
    f = rng.lognormvariate(-s2 / 2, math.sqrt(s2)) if cv > 0 else 1.0
    return run_compute(self, stage, seconds * f, done)


def seeded(*args, **kwargs):
    rng.seed(0)
    return simulate(*args, **kwargs)


E.Simulation.run_compute, sim_accuracy.simulate = noisy, seeded
for cell in json.loads((DIR / "accuracy.json").read_text())["cells"]:
    print(cell["name"], [f"{r['error']:+.1%}" for r in sim_accuracy.predict(cell, DIR)])
