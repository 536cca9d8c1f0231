"""k copies of the model step at once, as the contention probe runs them (one thread each): per-iteration wall and thread CPU. Diagnostic, stop 45: where the probe's k=4 loss goes.
    MALLOC_ARENA_MAX=2 python docs/bench/sim-accuracy/lockstep/probe_cpu.py"""
import json, subprocess, sys, time, statistics
CHILD = r'''
import json, sys, time, torch
from trirace.config import make_config
from trirace.runtime.calibrate import model_step
torch.set_num_threads(1)
step = model_step(make_config({}))
for _ in range(3): step()
start = float(sys.argv[1])
while time.time() < start: step()
w, c = [], []
while time.time() < start + 8:
    t0, c0 = time.perf_counter(), time.thread_time()
    step()
    w.append(time.perf_counter() - t0); c.append(time.thread_time() - c0)
print(json.dumps({"w": w, "c": c}))
'''
for k in (1, 2, 4, 1, 4):
    start = time.time() + 12
    ps = [subprocess.Popen([sys.executable, "-c", CHILD, str(start)], stdout=subprocess.PIPE) for _ in range(k)]
    got = [json.loads(p.communicate()[0]) for p in ps]
    w = [statistics.median(g["w"]) for g in got]; c = [statistics.median(g["c"]) for g in got]
    n = sum(len(g["w"]) for g in got)
    print(f"k={k}: wall {min(w)*1e3:.0f}-{max(w)*1e3:.0f} ms, thread CPU {min(c)*1e3:.0f}-{max(c)*1e3:.0f} ms, iterations {n} in 8 s", flush=True)
