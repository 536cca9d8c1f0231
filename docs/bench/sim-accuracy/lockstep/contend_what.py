"""What makes k processes computing at once on the shared cores lose work (diagnostic,
stop 40). Each process runs a slice of gpt-tiny's layers (forward and backward, one
micro-batch, one thread) for 6 s after a common start, beside a thread waking `hz` times
a second as the contention probe's do (runtime/wakeups.py); work is best-alone / mean.
    python docs/bench/sim-accuracy/lockstep/contend_what.py stages   whole model vs stage [6,1] mix
    python docs/bench/sim-accuracy/lockstep/contend_what.py wake     0 / 670 / 855 / 1200 wake-ups a second"""
import json, os, subprocess, sys, tempfile, time
from pathlib import Path

CHILD = r"""
import json, os, sys, time, torch
from trirace.config import make_config
from trirace.models.build import build_layers, loss_of
from trirace.runtime.wakeups import Waker
lo, hi, go, seconds, out, hz = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5], float(sys.argv[6])
torch.set_num_threads(1); torch.manual_seed(0)
cfg = make_config({"steps": 8})
layers = build_layers(cfg.spec, cfg.seed)
x = torch.randint(0, cfg.spec.vocab_size, (cfg.micro_batch_size, cfg.tokens_seq))
with torch.no_grad():
    h0 = x
    for layer in layers[:lo]:
        h0 = layer(h0)
loss = loss_of(cfg.spec)
def step():
    h = h0.detach().requires_grad_(True) if lo else h0
    for layer in layers[lo:hi]:
        h = layer(h)
    (loss(h, x) if hi == len(layers) else h.sum()).backward()
Waker(hz).__enter__()
step(); open(out + ".ready", "w").close()
while not os.path.exists(go): step()
start = float(open(go).read())
while time.time() < start: step()
ts = []
while not ts or time.time() < start + seconds:
    t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
json.dump({"mean": sum(ts) / len(ts), "best": min(ts)}, open(out, "w"))
"""


def run(slices: list[tuple[int, int]], hz: float, seconds: float = 6.0) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        files, go = [f"{tmp}/{i}.json" for i in range(len(slices))], f"{tmp}/go"
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(lo), str(hi), go, str(seconds), f, str(hz)])
                 for (lo, hi), f in zip(slices, files)]
        deadline = time.time() + 120
        while not all(os.path.exists(f + ".ready") for f in files):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                sys.exit("a process failed to start")
            time.sleep(0.05)
        Path(go + ".t").write_text(str(time.time() + 0.5)); os.replace(go + ".t", go)
        for p in procs:
            p.wait()
        return [json.load(open(f)) for f in files]


WHOLE, S0, S1 = (0, 7), (0, 6), (6, 7)
if __name__ == "__main__":
    for r in range(3):
        if sys.argv[1] == "stages":  # stage 1 of [6, 1] is the head alone
            hz = 800.0
            a, a0, a1 = (run([s], hz)[0]["best"] for s in (WHOLE, S0, S1))
            whole, mix = run([WHOLE] * 4, hz), run([S0, S0, S1, S1], hz)
            print(f"round {r}: alone whole {a * 1e3:.0f} ms, stage 0 {a0 * 1e3:.0f}, stage 1 {a1 * 1e3:.0f}; four at once: "
                  f"whole {sum(a / g['mean'] for g in whole):.3f}, two of each stage "
                  f"{sum((a0 if i < 2 else a1) / g['mean'] for i, g in enumerate(mix)):.3f}", flush=True)
        else:
            row = []
            for hz in (0.0, 670.0, 855.0, 1200.0):
                a = run([WHOLE], hz)[0]["best"]
                two, four = run([WHOLE] * 2, hz), run([WHOLE] * 4, hz)
                row.append(f"{hz:.0f}/s: two {sum(a / g['mean'] for g in two):.3f} four {sum(a / g['mean'] for g in four):.3f}")
            print(f"round {r}: " + " | ".join(row), flush=True)
