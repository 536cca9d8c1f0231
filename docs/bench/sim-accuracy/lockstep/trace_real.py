"""Run one cell's policies once each with --trace-out on the testbed (diagnostic)."""
import sys; sys.path.insert(0, ".")
from pathlib import Path
from trirace.config import make_config
from trirace.bench import side_by_side as S
from trirace.runtime import allocator, run_local
from trirace.runtime.launch import prepare
link, nodes, rpn = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = Path(sys.argv[4]); pols = sys.argv[5].split(",")
allocator.use()  # the bench's allocator settings (S.MALLOC_ENV when this ran at 7f57755)
cl = S.Cluster(nodes, rpn, link)
base = make_config({"steps": 8, "partition": [6, 1], "rank_order": sys.argv[6]})
with S._testbed(cl) as (rc, re_, topo):
    base = prepare(base.model_copy(update={"topology": topo, "progress": False}))
    cfgs = [base.model_copy(update={"comm_policy": p, "trace_out": str(out / p)}) for p in pols]
    for p, rows in zip(pols, run_local(cfgs, rank_command=rc, rank_env=re_)):
        print(p, [round(r["step_time_s"], 3) for r in rows], "cpu", [[round(x, 2) for x in r["rank_compute_cpu_s"]] for r in rows[2:4]])
