"""One rank of the uplink-share probe (links.link_share): four processes on two testbed
nodes; ranks 0 and 1 on node 0 each send `NBYTES` at once, to ranks 2 and 3 on node 1.

    python -m trirace.calibrate.uplink_share RANK STORE OUT NBYTES REPS

Rank 0 writes the mean share the first transfer to finish had of the uplink (0.5-1)."""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

from ..runtime.gloo import backend


def main(argv: list[str]) -> None:
    rank, store, out, nbytes, reps = int(argv[0]), argv[1], argv[2], int(argv[3]), int(argv[4])
    dist.init_process_group(backend("gloo"), init_method=f"file://{store}", rank=rank, world_size=4)
    t = torch.zeros(nbytes // 4)
    shares = []
    for rep in range(reps + 1):  # the first opens the connections
        h = dist.irecv(t, rank - 2) if rank >= 2 else None
        dist.barrier()
        at = torch.zeros(4, dtype=torch.float64)
        if rank < 2:  # ranks 0 and 1 share node 0's uplink, to ranks 2 and 3 on node 1
            at[rank] = time.time()  # one host, one clock: the namespaces' times compare
            dist.isend(t, rank + 2).wait()
        else:
            h.wait()
            at[rank] = time.time()
        dist.all_reduce(at)
        start = min(float(at[0]), float(at[1]))
        ends = sorted([float(at[2]) - start, float(at[3]) - start])
        if rep:
            shares.append(min(max(ends[1] / (2 * ends[0]), 0.5), 1.0))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(sum(shares) / len(shares), f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
