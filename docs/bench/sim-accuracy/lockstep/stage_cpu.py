"""k processes at once, each a pipeline stage's own layers ([6, 1]: even ones stage 0's six,
odd ones stage 1's head with the loss), one thread each: per-iteration wall and thread CPU
of one micro-batch's F+B. Against probe_cpu.py's whole model. Diagnostic, stop 45."""
import json, subprocess, sys, time, statistics
CHILD = r'''
import json, sys, time, torch
from trirace.config import make_config
from trirace.models import build_layers
from trirace.models.build import loss_of
torch.set_num_threads(1)
cfg = make_config({}); spec = cfg.spec
stage = int(sys.argv[2])
x = torch.randint(0, spec.vocab_size, (cfg.micro_batch_size, cfg.tokens_seq))
all_layers = build_layers(spec, 0)
with torch.no_grad():
    h = x
    for l in all_layers[:6]: h = l(h)
hidden = h.detach()
layers = all_layers[:6] if stage == 0 else all_layers[6:]
loss = loss_of(spec)
def step():
    if stage == 0:
        h = x
        for l in layers: h = l(h)
        h.backward(torch.ones_like(h))
    else:
        h = hidden.clone().requires_grad_(True)
        for l in layers: h = l(h)
        loss(h, x).backward()
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
for k in (2, 4, 2, 4):
    start = time.time() + 12
    ps = [subprocess.Popen([sys.executable, "-c", CHILD, str(start), str(i % 2)], stdout=subprocess.PIPE) for i in range(k)]
    got = [json.loads(p.communicate()[0]) for p in ps]
    for s in (0, 1):
        mine = got[s::2]
        w = [statistics.median(g["w"]) for g in mine]; c = [statistics.median(g["c"]) for g in mine]
        print(f"k={k} stage {s}: wall {min(w)*1e3:.0f}-{max(w)*1e3:.0f} ms, thread CPU {min(c)*1e3:.0f}-{max(c)*1e3:.0f} ms", flush=True)
