"""P2P transfers between pipeline stages, on the pipeline's communicator (groups.py).

The engine thread issues every P2P op: a run of adjacent transfers of the action list
(`plan.schedule.p2p_groups`) is one batch, receives and sends together, which NCCL runs as
one kernel. Nothing is posted ahead of its run, so the device never holds a receive in
front of the kernels its peer waits for; the schedule validator proves the runs free of
deadlock. The engine then waits for the run's receives, the data it needs next. Sends
complete on a `Waiter` (asynchronous policies), which measures the link; blocking waits
for them too.
"""

from __future__ import annotations

import time

import torch

from ..obs.timeline import Recorder
from ..plan import Action, Op, Schedule
from ..plan.transfers import Kind
from .communicator import Communicator, Handle, Waiter
from .stats import CommStats, LinkEstimates

RECEIVES = (Op.RF, Op.RB)


class PipelineP2P:
    def __init__(self, schedule: Schedule, peers: dict[Op, tuple[Communicator, int]], links: dict[Op, str],
                 activation_shape: tuple[int, ...], device: torch.device, blocking: bool, stats: CommStats,
                 link_estimates: LinkEstimates, rec: Recorder):
        """`peers`: each transfer op's communicator and peer rank; `links`: the link class
        each crosses."""
        self.sched, self.peers, self.links, self.shape, self.device = schedule, peers, links, activation_shape, device
        self.blocking, self.stats, self.estimates, self.rec = blocking, stats, link_estimates, rec
        self.waiter = None if blocking else Waiter("trirace-send")

    def exchange(self, group: list[Action], sends: dict[Action, torch.Tensor]) -> dict[Action, torch.Tensor]:
        """Run one group of adjacent P2P actions; return the received tensors."""
        step = self.sched.step_of(group[0].index)
        comm = self.peers[group[0].op][0]
        ops, received = [], {}
        for a in group:
            peer_comm, peer = self.peers[a.op]
            assert peer_comm is comm, "a run's transfers share the pipeline's communicator"
            if a.op in RECEIVES:
                received[a] = torch.empty(self.shape, device=self.device)
                ops.append(("recv", received[a], peer))
            else:
                ops.append(("send", sends[a], peer))
        t0, issued = time.perf_counter(), self.rec.now()
        handles = comm.p2p(ops)
        self.stats.add(step, transfers=len(group))
        for a, h in zip(group, handles):
            if a.op not in RECEIVES and not self.blocking:
                self.waiter.add(h, self._sent(a, issued, sends[a]), keep=sends[a])
        for a, h in zip(group, handles):
            if a.op in RECEIVES or self.blocking:
                h.wait()
        now = self.rec.now()
        for a in received:
            self.rec.span("p2p recv", str(a), issued, now, waited_s=time.perf_counter() - t0)
        self.stats.add(step, kind=Kind.P2P.value, exposed_s=time.perf_counter() - t0)
        return received

    def _sent(self, a: Action, t0: float, tensor: torch.Tensor):
        nbytes = tensor.numel() * tensor.element_size()

        def finished():
            t1 = self.rec.now()
            self.rec.span("p2p send", str(a), t0, t1, bytes=nbytes)
            self.estimates.observe(self.links[a.op], nbytes, t1 - t0, self.rec)
        return finished

    def close(self, failed: bool) -> None:
        if not failed and self.waiter is not None:
            self.waiter.close()
