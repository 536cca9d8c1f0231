"""Per step, each rank's reduction window in a trace (real or simulated): from its first
chunk or sparse exchange issued to its last done, and when its OPT began (diagnostic).
The stage whose window ends last is the one every OPT waits for (the global norm).
    python docs/bench/sim-accuracy/lockstep/windows.py TRACE..."""
import json, re, sys
for f in sys.argv[1:]:
    d = json.load(open(f)); X = [e for e in (d["traceEvents"] if isinstance(d, dict) else d) if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in X); print(f)
    for step in range(2, 7):
        row = []
        for pid in sorted({e["pid"] for e in X}):
            comm = [e for e in X if e["pid"] == pid and re.fullmatch(rf"(AR|SP){step}\.\d+", e["name"])]
            opt = [e for e in X if e["pid"] == pid and e["name"] == f"OPT{step}"]
            if comm and opt:
                a, b = min(e["ts"] for e in comm), max(e["ts"] + e["dur"] for e in comm)
                row.append(f"r{pid} {(a - t0) / 1e6:.2f}-{(b - t0) / 1e6:.2f} ({(b - a) / 1e6:.2f}) opt@{(opt[0]['ts'] - t0) / 1e6:.2f}")
        print(f" step {step}: " + " | ".join(row))
