"""A process's gloo groups share one transport device, so one loop thread, not one per group."""

import json
import subprocess
import sys

import pytest

from trirace.runtime.wakeups import others_wakeups

pytestmark = pytest.mark.skipif(others_wakeups(0) is None, reason="needs Linux's /proc")

_RANK = r"""
import json, os, sys, torch, torch.distributed as dist
from trirace.runtime import gloo
rank, store, out, name = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
backend = gloo.backend("gloo") if name == "shared" else "gloo"
dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=3)
members = [[0, 1], [1, 2], [0, 2], [0, 1, 2], [0, 1, 2]]
groups = [dist.new_group(m, backend=backend) for m in members]  # every rank, one order
sums = []
for m, g in zip(members, groups):
    if rank in m:
        t = torch.full((1 << 16,), float(rank + 1))
        dist.all_reduce(t, group=g)
        sums.append(t.unique().tolist())
peer = (rank + 1) % 3  # a ring of P2P on the world: post the receive first, then the send
got = torch.empty(1 << 16)
recv = dist.irecv(got, (rank - 1) % 3)
dist.isend(torch.full((1 << 16,), float(rank)), peer).wait()
recv.wait()
loops = sum(open(f"/proc/self/task/{t}/comm").read().strip() == "gloo_tcp_loop" for t in os.listdir("/proc/self/task"))
json.dump({"backend": dist.get_backend(), "sums": sums, "got": got.unique().tolist(), "loops": loops}, open(out, "w"))
dist.barrier()
for g in groups:
    if g != dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(g)
dist.destroy_process_group()
"""


def _run(tmp_path, name: str) -> list[dict]:
    outs = [tmp_path / f"{name}-{r}.json" for r in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(tmp_path / f"store-{name}"), str(o), name])
             for r, o in enumerate(outs)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    return [json.loads(o.read_text()) for o in outs]


def test_every_gloo_group_of_a_process_runs_on_one_loop_thread(tmp_path):
    """Five groups a process (the world, two of the three pairs, two of all three): torch's own gloo makes a
    device, so a loop thread waking 100-180 times a second, for each; ours makes one."""
    shared, own = _run(tmp_path, "shared"), _run(tmp_path, "own")
    sums = {0: [[3.0], [4.0], [6.0], [6.0]], 1: [[3.0], [5.0], [6.0], [6.0]], 2: [[5.0], [4.0], [6.0], [6.0]]}
    for r, (s, o) in enumerate(zip(shared, own)):
        assert s["sums"] == o["sums"] == sums[r]  # same results on the shared device
        assert s["got"] == o["got"] == [float((r - 1) % 3)]
        assert s["backend"] == "gloo_shared" and o["backend"] == "gloo"
        assert s["loops"] == 1 and o["loops"] == 5
