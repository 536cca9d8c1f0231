"""How many ranks compute at once, by share of the steady window, and each rank's compute
per step, from traces (diagnostic, stop 40): a real run's (--trace-out, or trace_real.py)
beside the simulator's (trirace simulate --trace-out). The window runs from the last
rank's end of OPT.1 to the first rank's end of OPT.5 (steps 2-5).
    python docs/bench/sim-accuracy/lockstep/computing_at_once.py REAL/trace.json SIM/trace.json"""
import collections, json, re, sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    events = d["traceEvents"] if isinstance(d, dict) else d
    comp = [e for e in events if e.get("ph") == "X" and re.match(r"(F|B|OPT)\.?\d+$", e["name"])]
    pids = sorted({e["pid"] for e in comp})
    opt = {(e["pid"], int(re.findall(r"\d+", e["name"])[0])): e for e in comp if e["name"].startswith("OPT")}
    t0 = max(opt[(p, 1)]["ts"] + opt[(p, 1)]["dur"] for p in pids)
    t1 = min(opt[(p, 5)]["ts"] + opt[(p, 5)]["dur"] for p in pids)
    edges, per_rank = [], collections.defaultdict(float)
    for e in comp:
        a, b = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
        if b > a:
            edges += [(a, 1), (b, -1)]
            per_rank[e["pid"]] += b - a
    share, k, last = collections.Counter(), 0, t0
    for t, step in sorted(edges):
        share[k] += t - last
        k, last = k + step, t
    share[k] += t1 - last
    span = t1 - t0
    print(f"{path}: {span / 4e6:.3f} s a step; " + " ".join(f"{k} at once {v / span:.0%}" for k, v in sorted(share.items()))
          + f"; mean {sum(k * v for k, v in share.items()) / span:.2f}; each rank's compute a step "
          + " ".join(f"{per_rank[p] / 4e6:.3f}" for p in pids))
