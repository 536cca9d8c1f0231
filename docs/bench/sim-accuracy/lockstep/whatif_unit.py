"""Re-predict saved matrices with each calibration's contention curve counted in its own
layers' iteration, as `trirace profile` does since stop 47, where their files count in each
round's lone probe process's fastest iteration (diagnostic):
    python docs/bench/sim-accuracy/lockstep/whatif_unit.py docs/bench/sim-accuracy/a940347 ..."""
import dataclasses, sys; sys.path.insert(0, "docs/bench/sim-accuracy/lockstep"); sys.path.insert(0, ".")
from pathlib import Path
from whatif import repredict
from trirace.runtime.calibrate import Contention, median_contention


def in_layers_unit(cal, cell):
    """The file's rounds (which keep each process's iteration times) re-read in the layers' unit."""
    rounds = [Contention(r["cpu_throughput"], r["compute_spread"], [0.0] * len(r["cpu_throughput"]),
                         best_s=min(r["iteration_times"][0][0])) for r in cal.probe_rounds]
    return dataclasses.replace(cal, cpu_throughput=median_contention(rounds, cal.iteration_s).throughput)


if __name__ == "__main__":
    for d in sys.argv[1:]:
        repredict(Path(d) / "accuracy.json", in_layers_unit, d)
