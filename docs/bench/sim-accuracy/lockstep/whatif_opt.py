"""A saved matrix predicted again with each calibration's OPT cost scaled (stop 44: the
profile timed OPT on all-zero gradients until then; opt_ab.py reads the ratio). Run from
the repository root:
    python docs/bench/sim-accuracy/lockstep/whatif_opt.py MATRIX_DIR 0.82 OUT_DIR"""
import json, shutil, subprocess, sys
from pathlib import Path
src, factor, out = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
shutil.copy(src / "accuracy.json", out / "accuracy.json")
for f in src.glob("calibration-*.json"):
    d = json.loads(f.read_text())
    d["optimizer_s_per_param"] *= factor
    (out / f.name).write_text(json.dumps(d, indent=1))
subprocess.run([sys.executable, "-m", "trirace.bench.sim_accuracy", "--resimulate", str(out / "accuracy.json"),
                "--out", str(out / "predicted")], check=True, stdout=subprocess.DEVNULL)
print(next(line for line in (out / "predicted" / "accuracy.md").read_text().splitlines() if " of 32 " in line))
