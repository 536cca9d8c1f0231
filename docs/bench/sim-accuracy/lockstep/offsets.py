"""How far replica 1 runs ahead of replica 0: start of F(i) on rank b minus rank a, steady
micro-batches 8..23, per stage (dp-inner: ranks 0,1 are stage 0, ranks 2,3 stage 1)."""
import json, re, statistics, sys
for p in sys.argv[1:]:
    d = json.load(open(p)); ev = d["traceEvents"] if isinstance(d, dict) else d
    t = {}
    for e in ev:
        if e["ph"] == "X" and e["tid"] == 0 and re.fullmatch(r"F\d+", e["name"]):
            t.setdefault(e["pid"], {})[int(e["name"][1:])] = e["ts"] / 1e3
    for stage, a, b in ((0, 0, 1), (1, 2, 3)):
        offs = [t[b][i] - t[a][i] for i in range(8, 24)]
        print(p, f"stage {stage}: median {statistics.median(offs):.0f} ms, range {min(offs):.0f}..{max(offs):.0f}")
