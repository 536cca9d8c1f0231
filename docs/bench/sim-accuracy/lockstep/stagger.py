"""Two TCP flows from one testbed node to another, the second started `lag` s after the
first: the newcomer's share of the shaped uplink while both ran (0.5: fair).
    python docs/bench/sim-accuracy/lockstep/stagger.py 50mbit 1.0 [second flow's bytes]"""
import subprocess, sys, time; sys.path.insert(0, ".")
from trirace.testbed.cluster import held
_FLOWS = open("docs/bench/sim-accuracy/lockstep/flows.py").read()
SRV = _FLOWS.split('SRV = r"""')[1].split('"""')[0]  # the same receiver and sender as flows.py
CLI = _FLOWS.split('CLI = r"""')[1].split('"""')[0]
rate, lag = sys.argv[1], float(sys.argv[2])
R = float(rate.rstrip("mbit")) * 1e6 / 8
sizes = [16 << 20, int(sys.argv[3]) if len(sys.argv) > 3 else 8 << 20]
with held(2, 2, rate) as tb:
    for rep in range(3):
        ports = [5100 + 10 * rep + i for i in range(2)]
        srv = [subprocess.Popen(["ip", "netns", "exec", tb.namespace(1), sys.executable, "-c", SRV, tb.address(1),
                                 str(p), str(n)], stdout=subprocess.PIPE, text=True) for p, n in zip(ports, sizes)]
        time.sleep(0.5)
        t0, cli = time.time(), []
        for i, (p, n) in enumerate(zip(ports, sizes)):
            time.sleep(max(t0 + lag * i - time.time(), 0))
            cli.append(subprocess.Popen(["ip", "netns", "exec", tb.namespace(0), sys.executable, "-c", CLI,
                                         tb.address(1), str(p), str(n)], stdout=subprocess.PIPE, text=True))
        e1, e2 = [float(p.communicate(timeout=120)[0].split()[-1]) - t0 for p in srv]
        for p in cli:
            p.kill()
        moved = sizes[1] if e2 <= e1 else sizes[1] - R * (e2 - e1)  # the newcomer's bytes while both ran
        print(f"{rate}, second flow {sizes[1] >> 10} KiB {lag} s after the first (16 MiB): done at {e1:.2f} and "
              f"{e2:.2f} s; the newcomer's share while both ran {moved / (R * (min(e1, e2) - lag)):.2f}", flush=True)
