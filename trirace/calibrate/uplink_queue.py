"""One rank of the uplink-queue probe (links.link_queue): four processes, one a testbed
node. Nodes 0 and 1 time a small all-reduce between them, idle and while each also sends
`NBYTES` messages back to back to node 2 or 3.

    python -m trirace.calibrate.uplink_queue RANK STORE OUT NBYTES REPS

Rank 0 writes {"idle_s", "busy_s"}: the all-reduce's median time each way."""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

from ..runtime.gloo import backend


def main(argv: list[str]) -> None:
    rank, store, out, nbytes, reps = int(argv[0]), argv[1], argv[2], int(argv[3]), int(argv[4])
    torch.set_num_threads(1)
    dist.init_process_group(backend("gloo"), init_method=f"file://{store}", rank=rank, world_size=4)
    bulk_group = dist.new_group([0, 1, 2, 3])  # the bulk thread's own communicator
    pair = dist.new_group([0, 1])  # nodes 0 and 1: the small all-reduces
    t, x = torch.zeros(nbytes // 4), torch.zeros(2)

    def bulk(stop: threading.Event) -> None:
        """0 -> 2 and 1 -> 3 back to back; the sender marks its last message, so pairs stay matched."""
        while True:
            if rank < 2:
                t[0] = float(stop.is_set())
                dist.send(t, rank + 2, group=bulk_group)
            else:
                dist.recv(t, rank - 2, group=bulk_group)
            if t[0]:
                return

    def small() -> float:
        got = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dist.all_reduce(x, group=pair)
            got.append(time.perf_counter() - t0)
            time.sleep(0.005)
        return statistics.median(got)
    idle = busy = 0.0
    if rank < 2:
        small()  # opens the pair's connections
        idle = small()
    dist.barrier()
    stop = threading.Event()
    th = threading.Thread(target=bulk, args=(stop,))
    th.start()
    if rank < 2:
        time.sleep(0.3)  # the bulk streams fill their queues
        busy = small()
        stop.set()
    th.join()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"idle_s": idle, "busy_s": busy}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
