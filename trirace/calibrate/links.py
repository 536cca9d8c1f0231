"""Links as a job's ranks see them, measured between real processes: latency and
bandwidth by the same ping-pong as the runtime's start-up probe, on this host's loopback
(the intra-node link) or across two nodes of the emulated testbed (the inter-node link);
and, on the testbed's shaped links, what a blocking send leaves in flight, how two
transfers leaving one node share its uplink, and what a transfer waits behind in its queue.

Each probe runs `python -m trirace.calibrate.<worker>` once per rank (link_pair,
uplink_share, uplink_queue), inside the testbed's namespaces where there is one; rank 0
writes the result as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

from .. import testbed
from ..errors import UsageError


def run_ranks(what: str, worker: str, world: int, tb: testbed.Testbed | None, args: list[str], out: Path,
              timeout_s: float) -> None:
    """Run `python -m trirace.calibrate.<worker>` as `world` processes, each given its rank
    and then `args` (in the testbed `tb`'s namespaces where there is one); `out` is what
    rank 0 must have written."""
    procs = [subprocess.Popen(["timeout", "-k", "5", str(timeout_s), *(tb.rank_command(r) if tb else []),
                               sys.executable, "-m", f"trirace.calibrate.{worker}", str(r), *args],
                              env={**os.environ, **(tb.rank_env(r) if tb else {})}) for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes) or not out.exists():
        raise UsageError(f"{what} failed (exit status {codes})")


def on_testbed(what: str, worker: str, nodes: int, ranks_per_node: int, link: str, mtu: int, args: list,
               timeout_s: float):
    """Run a probe `worker` as one process per rank of a testbed held for it (nodes x
    ranks_per_node at `link`); each gets its rank, a store, the file rank 0 writes its JSON
    result to, then `args`. Returns that result."""
    with testbed.held(nodes, ranks_per_node, link, mtu) as tb, tempfile.TemporaryDirectory(prefix="trirace-probe-") as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "result.json"
        run_ranks(what, worker, nodes * ranks_per_node, tb, [str(store), str(out), *map(str, args)], out, timeout_s)
        return json.loads(out.read_text())


def probe_pair(across_nodes: bool, link: str | None = None, mtu: int = 9000, transfer_cpu: bool = False,
               timeout_s: float = 120) -> dict:
    """Ping-pong between two real processes, on two testbed nodes (`link` rate) or on
    loopback: {"bits_per_s", "latency_s"}; across nodes also "send_buffer_bytes" (what a
    blocking send leaves in flight), and with `transfer_cpu` the CPU a message and a byte
    cost both ends ("cpu_per_message_s", "cpu_per_byte_s", link_pair.transfer_cpu)."""
    held = testbed.held(2, 1, link, mtu) if across_nodes else nullcontext(None)
    with held as tb, tempfile.TemporaryDirectory(prefix="trirace-profile-") as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "link.json"
        run_ranks("link probe", "link_pair", 2, tb,
                  [str(store), str(out), "2" if tb else "1", "1" if transfer_cpu else "0"], out, timeout_s)
        return json.loads(out.read_text())


def link_share(link: str, nbytes: int, mtu: int = 9000, reps: int = 21, timeout_s: float = 120) -> float:
    """How two transfers of `nbytes` that leave one testbed node together share its uplink:
    the first to finish had this fraction of the link while both moved (0.5: fair; 1: one
    after the other). TCP through the shaper is not fair: the first flow to fill its queue
    keeps most of it. The mean of `reps`, since the split is bimodal."""
    return float(on_testbed("link share probe", "uplink_share", 2, 2, link, mtu, [nbytes, reps], timeout_s))


def link_queue(link: str, nbytes: int, bytes_per_s: float, mtu: int = 9000, reps: int = 30,
               timeout_s: float = 120) -> float:
    """Bytes a transfer keeps queued ahead of another on a testbed node's shaped uplink: the
    small all-reduce of two nodes' row counts, timed idle and while each node sends
    `nbytes` messages back to back to a third, as stage 0's replicas exchange while sending
    activations. The shaper is one FIFO queue, so the small message waits behind what is
    queued, where a fluid model would share the link at once. The median of `reps` each
    way; the difference, at `bytes_per_s`, in bytes."""
    got = on_testbed("link queue probe", "uplink_queue", 4, 1, link, mtu, [nbytes, reps], timeout_s)
    return max(got["busy_s"] - got["idle_s"], 0.0) * bytes_per_s
