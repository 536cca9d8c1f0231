"""P2P transfers between pipeline stages, on the pipeline's communicator (groups.py).

The engine thread issues every P2P op: a run of adjacent transfers of the action list
(`plan.schedule.p2p_groups`) is one batch, receives and sends together, which NCCL runs as
one kernel, where the plan puts it (asynchronous policies' plans post a receive a
computation early, as a batch of its own, where the validator proves that safe on a
device). The engine waits for a receive only where its data is used (`take`, before the
computation that consumes it). Sends complete on a `Waiter` (asynchronous policies), which
measures the link; blocking waits for them at their run.
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
        self.posted: dict[Action, tuple[Handle, torch.Tensor, float]] = {}  # receives not yet taken

    def exchange(self, group: list[Action], sends: dict[Action, torch.Tensor]) -> None:
        """Launch one run of adjacent P2P actions; its receives are collected by `take`."""
        step = self.sched.step_of(group[0].index)
        comm = self.peers[group[0].op][0]
        ops = []
        for a in group:
            peer_comm, peer = self.peers[a.op]
            assert peer_comm is comm, "a run's transfers share the pipeline's communicator"
            if a.op in RECEIVES:
                t = torch.empty(self.shape, device=self.device)
                ops.append(("recv", t, peer))
            else:
                ops.append(("send", sends[a], peer))
        t0, issued = time.perf_counter(), self.rec.now()
        handles = comm.p2p(ops)
        self.stats.add(step, transfers=len(group))
        for a, (_, t, _), h in zip(group, ops, handles):
            if a.op in RECEIVES:
                self.posted[a] = (h, t, issued)
            elif not self.blocking:
                self.waiter.add(h, self._sent(a, issued, t), keep=t)
        if self.blocking:  # the run's sends, here
            for a, h in zip(group, handles):
                if a.op not in RECEIVES:
                    h.wait()
            self.stats.add(step, kind=Kind.P2P.value, exposed_s=time.perf_counter() - t0)

    def take(self, a: Action) -> torch.Tensor:
        """Receive `a`'s tensor, waiting for it if it has not arrived (exposed P2P time)."""
        handle, t, issued = self.posted.pop(a)
        t0 = time.perf_counter()
        handle.wait()
        self.stats.add(self.sched.step_of(a.index), kind=Kind.P2P.value, exposed_s=time.perf_counter() - t0)
        self.rec.span("p2p recv", str(a), issued, self.rec.now(), waited_s=time.perf_counter() - t0)
        return t

    def _sent(self, a: Action, t0: float, tensor: torch.Tensor):
        nbytes = tensor.numel() * tensor.element_size()

        def finished():
            t1 = self.rec.now()
            self.rec.span("p2p send", str(a), t0, t1, bytes=nbytes)
            self.estimates.observe(self.links[a.op], nbytes, t1 - t0, self.rec)
        return finished

    def close(self, failed: bool) -> None:
        if failed:
            return
        if self.waiter is not None:
            self.waiter.close()
        for handle, _, _ in self.posted.values():  # nothing should be left; never leave a handle unwaited
            handle.wait()
