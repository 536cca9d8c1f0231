"""The token table's sparse exchange alone between two testbed nodes (diagnostic, as root):
gpt-tiny's 16384 x 256 fp32 table, 670 rows touched per replica, 12 exchanges; wall and
thread CPU of each, and the scan for touched rows plus zeroing the table by themselves.
    python docs/bench/sim-accuracy/lockstep/exchange_alone.py 100mbit"""
import os, subprocess, sys, tempfile; sys.path.insert(0, ".")
from trirace.testbed.cluster import held
RANK = r"""
import sys, time, torch, torch.distributed as dist
sys.path.insert(0, ".")
from trirace.runtime.sparse_exchange import exchange, touched_rows
torch.set_num_threads(1)
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
V, d, k = 16384, 256, 670
g = torch.Generator().manual_seed(rank)
grad = torch.zeros(V, d); grad[torch.randperm(V, generator=g)[:k]] = torch.randn(k, d, generator=g)
for rep in range(12):
    gg = grad.clone(); dist.barrier()
    t0, c0 = time.perf_counter(), time.thread_time()
    _, st = exchange(gg, method="auto", out=gg, alpha_s=1e-4, bytes_per_s=12.5e6)
    t1, c1 = time.perf_counter(), time.thread_time()
    touched_rows(grad); gg.zero_(); t2 = time.perf_counter()
    if rank == 0: print(st["method"], st["bytes_sent"], "bytes: wall", round(t1 - t0, 4), "cpu", round(c1 - c0, 4), "scan+zero", round(t2 - t1, 4), flush=True)
dist.destroy_process_group()
"""
with held(2, 1, sys.argv[1]) as tb, tempfile.TemporaryDirectory() as tmp:
    ps = [subprocess.Popen(["timeout", "120", *tb.rank_command(r), sys.executable, "-c", RANK, str(r), tmp + "/store"],
                           env={**os.environ, **tb.rank_env(r)}) for r in range(2)]
    print("exit", [p.wait() for p in ps])
