"""Where in a contention window the stalled iterations fall: over every kept calibration's
readings (stood and refused), each iteration over 1.75x its k's median (runtime/calibrate.py
`stalled`), by its index in its process's window and the second it began. Stop 43: 30 of
36 were a window's first or second iteration. Run from the repository root."""
import glob, json, statistics
from collections import Counter

at, began = Counter(), []
for f in sorted(glob.glob("docs/bench/sim-accuracy/**/calibration-*.json", recursive=True)):
    readings = []
    for r in json.load(open(f)).get("probe_rounds", []):
        readings += [r["iteration_times"]] if r.get("iteration_times") else []
        readings += [x["iteration_times"] for x in r.get("refused", [])]
    for reading in readings:
        for procs in reading:
            median = statistics.median(t for p in procs for t in p)
            for p in procs:
                clock = 0.0
                for i, t in enumerate(p):
                    if t > 1.75 * median:
                        at[min(i, 5)] += 1
                        began.append(round(clock, 2))
                    clock += t
print("stalled iterations by index in the window (5 = 5 or later):", sorted(at.items()))
print("the second each began:", sorted(began))
