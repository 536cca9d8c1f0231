"""Diagnostic (stop 38; rerun stop 39 after the buffers moved out of the windows): the per-byte probe's raw windows with its buffer walk (span 128, 64 MiB) and without (span 1), alternating, on a held testbed.
    python docs/bench/sim-accuracy/lockstep/beside_span.py 50mbit 6.25e6   (link, bytes per second per rank)"""
import json, sys, tempfile
from pathlib import Path
from trirace.bench.sim_accuracy import make_config
from trirace.runtime import calibrate as C, allocator
from trirace import testbed
allocator.use()
cfg = make_config({"steps": 8})
link, rate = sys.argv[1], float(sys.argv[2])
world, iteration_s = cfg.world_size, 0.222
seconds = 8 * iteration_s * world / 2
nbytes = cfg.activation_bytes
for span in [128, 1, 128, 1]:
    with testbed.held(world, 1, link, 9000) as tb, tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "cfg.json", Path(tmp) / "b.json"
        job.write_text(json.dumps(cfg.model_dump(mode="json")))
        C._run_ranks("x", C._BESIDE, world, tb, [str(world), str(Path(tmp) / "store"), str(out), str(job), "1", str(rate),
                     str(seconds), "2", str(span), str(nbytes), "[]", "860"], out, 600)
        got = json.loads(out.read_text())
    windows = C.beside_windows(got, iteration_s)
    work = [round(sum(w[i]["work_per_s"] or 0 for w in windows), 3) for i in range(5)]
    print(f"span {span} ({span * nbytes >> 20} MiB)", [f"{x*1e9:.2f}" for x in C.per_byte_beside(windows, 2.3e-4)], work,
          f"copy {C.copy_rate()/1e9:.1f} GB/s", flush=True)
