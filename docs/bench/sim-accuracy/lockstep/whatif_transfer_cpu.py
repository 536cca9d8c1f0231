"""Diagnostic (stop 38): re-predict a matrix with each rate's transfer_cpu taken from another matrix's calibration at that rate.
    python docs/bench/sim-accuracy/lockstep/whatif_transfer_cpu.py docs/bench/sim-accuracy/accuracy.json docs/bench/sim-accuracy/ace5679"""
import dataclasses, sys; sys.path[:0] = [".", "docs/bench/sim-accuracy/lockstep"]
from pathlib import Path
from trirace.sim.calibration import load_calibration
from whatif import repredict
other = Path(sys.argv[2])
repredict(Path(sys.argv[1]), lambda cal, cell: dataclasses.replace(
    cal, transfer_cpu=load_calibration(other / cell["calibration"]).transfer_cpu), f"transfer_cpu from {other}")
