"""A/B: contention readings with each process ready after 1 step (before stop 43) or 3
(WARM_STEPS), interleaved, argv[1] pairs; each reading's curve, whether it stalled, and the
k=4 processes' first iteration over their median. Stop 43, an hour after boot: the first four
readings, two in each arm, before first_touch.py's runs disturbed the rest, stalled in neither."""
import json, statistics, sys, time
from trirace.runtime import allocator
from trirace.runtime.calibrate import cpu_contention, stalled
from trirace.config import make_config
allocator.use()
cfg = make_config({"steps": 12})
pairs = int(sys.argv[1]); out = []
for i in range(pairs):
    for w in ((1, 3) if i % 2 == 0 else (3, 1)):
        t0 = time.time()
        r = cpu_contention(cfg, cfg.world_size, 1, seconds=4.0, wake_hz=300, warm_steps=w)
        firsts = []
        for k, procs in enumerate(r.times):
            med = statistics.median([x for p in procs for x in p])
            firsts.append([round(p[0] / med, 2) for p in procs])
        rec = {"warm": w, "curve": [round(x, 3) for x in r.throughput], "stalled": stalled(r),
               "first_over_median": firsts, "s": round(time.time() - t0, 1), "times": r.times}
        out.append(rec)
        print(w, rec["curve"], "stalled", rec["stalled"], "k4 firsts", firsts[-1], rec["s"], "s", flush=True)
json.dump(out, open("warm_ab.json", "w"))
