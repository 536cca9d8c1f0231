"""How long each activation and gradient took to cross, in a trace (real or simulated), for a
pp=2 job: from the end of the computation that produced it (F on stage 0, B on stage 1) to
the end of the receive that took it, counted only where the receiver was already waiting
(so the end of its receive is the arrival). Also each rank's receive wait per step and its
compute per step. Diagnostic, stop 44.
    python docs/bench/sim-accuracy/lockstep/p2p_latency.py TRACE..."""
import json, re, statistics, sys


def load(path):
    d = json.load(open(path)); ev = d["traceEvents"] if isinstance(d, dict) else d
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    spans = {}
    for e in ev:
        if e.get("ph") == "X":
            spans.setdefault(e["pid"], {})[e["name"]] = e
    return names, spans


def stage_of(pid, name, dp):
    m = re.match(r"stage (\d+)", name)
    return int(m.group(1)) if m else pid // dp  # real traces: dp-inner, rank = stage * dp + replica


def q(xs):
    xs = sorted(xs)
    return f"median {statistics.median(xs) * 1e3:6.1f} ms  [{xs[len(xs) // 10] * 1e3:5.1f}..{xs[-1 - len(xs) // 10] * 1e3:5.1f}] n={len(xs)}"


for path in sys.argv[1:]:
    names, spans = load(path)
    dp = 2
    by = {(stage_of(p, n, dp), p % dp): p for p, n in names.items()}
    print(path)
    for direction, src_stage, make, recv in (("fwd", 0, "F", "RF"), ("bwd", 1, "B", "RB")):
        lat, late = [], []
        for rep in range(dp):
            src, dst = by.get((src_stage, rep)), by.get((1 - src_stage, rep))
            if src is None or dst is None:
                continue
            for name, e in spans[dst].items():
                m = re.fullmatch(recv + r"(\d+)", name)
                k = int(m.group(1)) if m else None
                if k is None or k < 8 or f"{make}{k}" not in spans[src]:
                    continue  # the first steps warm up
                made = spans[src][f"{make}{k}"]["ts"] + spans[src][f"{make}{k}"]["dur"]
                got = e["ts"] + e["dur"]
                waiting_from = got - e["args"].get("waited_s", 0) * 1e6
                (lat if waiting_from <= made else late).append((got - made) / 1e6)
        print(f"  {direction}: waited at arrival {q(lat) if lat else '-'}; receiver came later: {len(late)}")
    for (stage, rep), p in sorted(by.items()):
        waits = sum(e["args"].get("waited_s", 0) for n, e in spans[p].items() if re.fullmatch(r"R[FB]\d+", n) and int(n[2:]) >= 8)
        comp = sum(e["dur"] for n, e in spans[p].items() if re.fullmatch(r"[FB]\d+", n) and int(n[1:]) >= 8) / 1e6
        n = len([1 for n in spans[p] if re.fullmatch(r"F\d+", n) and int(n[1:]) >= 8])
        print(f"  stage {stage} replica {rep}: {n} micro-batches from 8, receive wait {waits / max(n, 1) * 1e3:.1f} ms and "
              f"F+B {comp / max(n, 1) * 1e3:.1f} ms per micro-batch")
    for (stage, rep), p in sorted(by.items()):
        row = []
        for op in ("F", "B", "OPT"):
            es = [e for n, e in spans[p].items() if re.fullmatch(op + r"\d+", n) and int(n[len(op):]) >= (8 if op != "OPT" else 2)]
            if es:
                wall = statistics.median(e["dur"] for e in es) / 1e3
                cpu = [e["args"]["cpu_s"] * 1e3 for e in es if "cpu_s" in e["args"]]
                row.append(f"{op} wall {wall:.1f} ms" + (f" cpu {statistics.median(cpu):.1f} ms" if cpu else ""))
        print(f"  stage {stage} replica {rep}: " + ", ".join(row))
