"""k processes at once, one thread each, as the contention probe runs them: each iteration's
wall and thread CPU. Diagnostic, stop 45: where the probe's four-rank loss goes.
    MALLOC_ARENA_MAX=2 python docs/bench/sim-accuracy/lockstep/probe_cpu.py          the probe's whole model, k = 1, 2, 4, 1, 4
    MALLOC_ARENA_MAX=2 python docs/bench/sim-accuracy/lockstep/probe_cpu.py stages   each process a stage of [6, 1]: even ones
                                     stage 0's six layers, odd ones the head with the loss; k = 2, 4, 2, 4"""
import json, subprocess, sys, time, statistics
CHILD = r'''
import json, sys, time, torch
from trirace.config import make_config
from trirace.models import build_layers
from trirace.models.build import loss_of
from trirace.runtime.calibrate import model_step
torch.set_num_threads(1)
cfg = make_config({}); spec = cfg.spec
stage = int(sys.argv[2])  # -1: the whole model, as the probe
if stage < 0:
    step = model_step(cfg)
else:
    x = torch.randint(0, spec.vocab_size, (cfg.micro_batch_size, cfg.tokens_seq))
    layers, loss = build_layers(spec, 0), loss_of(spec)
    with torch.no_grad():
        hidden = x
        for layer in layers[:6]:
            hidden = layer(hidden)
    mine = layers[:6] if stage == 0 else layers[6:]
    def step():
        h = x if stage == 0 else hidden.clone().requires_grad_(True)
        for layer in mine:
            h = layer(h)
        (h.backward(torch.ones_like(h)) if stage == 0 else loss(h, x).backward())
for _ in range(3):
    step()
start = float(sys.argv[1])
while time.time() < start:
    step()
w, c = [], []
while time.time() < start + 8:
    t0, c0 = time.perf_counter(), time.thread_time()
    step()
    w.append(time.perf_counter() - t0); c.append(time.thread_time() - c0)
print(json.dumps({"w": w, "c": c}))
'''
stages = sys.argv[1:] == ["stages"]
for k in ((2, 4, 2, 4) if stages else (1, 2, 4, 1, 4)):
    start = time.time() + 12
    ps = [subprocess.Popen([sys.executable, "-c", CHILD, str(start), str(i % 2 if stages else -1)],
                           stdout=subprocess.PIPE) for i in range(k)]
    got = [json.loads(p.communicate()[0]) for p in ps]
    for s in ((0, 1) if stages else (None,)):
        mine = got if s is None else got[s::2]
        w = [statistics.median(g["w"]) for g in mine]; c = [statistics.median(g["c"]) for g in mine]
        print(f"k={k}{'' if s is None else f' stage {s}'}: wall {min(w)*1e3:.0f}-{max(w)*1e3:.0f} ms, "
              f"thread CPU {min(c)*1e3:.0f}-{max(c)*1e3:.0f} ms, iterations {sum(len(g['w']) for g in mine)} in 8 s",
              flush=True)
