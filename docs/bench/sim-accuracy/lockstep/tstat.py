"""Seconds per step on each rank of a trace, by kind (F, B, OPT compute; RF, RB waits;
SF, SB, AR, SP transfers in flight), over the steady steps 2..5 (micro-batches 8..23, m=4)."""
import collections, json, re, sys
for p in sys.argv[1:]:
    d = json.load(open(p)); ev = d["traceEvents"] if isinstance(d, dict) else d
    print(p)
    for pid in sorted({e["pid"] for e in ev if e["ph"] == "X"}):
        tot = collections.defaultdict(float)
        for e in ev:
            m = re.match(r"([A-Z]+)\.?(\d+)", e["name"]) if e["ph"] == "X" and e["pid"] == pid else None
            if not m:
                continue
            kind, i = m.group(1), int(m.group(2))
            if (2 <= i < 6) if kind in ("OPT", "AR", "SP") else (8 <= i < 24):
                tot[kind] += e["dur"] / 1e6 / 4
        print(" rank", pid, {k: round(v, 3) for k, v in sorted(tot.items())})
