"""P2P transfers between pipeline stages, on the per-direction communicators of groups.py.

The engine thread issues every P2P op. The stage driver decides which receives are
posted when (ahead of need for asynchronous policies; a group's own for blocking); each
direction's communicator sees its ops in schedule order on both ends, which the schedule
validator guarantees. Sends complete on a `Waiter` per direction, which releases the link
the policy yields to; the engine waits only for data it needs. Both ends tell the driver
when bytes crossed (the send's issue, a waited-for receive's arrival): what the trirace
policy forecasts the next step's P2P from.
"""

from __future__ import annotations

import time
import torch

from ..plan import Action, Op, Schedule
from ..plan.transfers import Kind
from .communicator import Handle, Waiter

ARRIVED_S = 1e-3  # a wait shorter than this found the data already there


class PipelineP2P:
    def __init__(self, comm, activation_shape: tuple[int, ...]):
        """`comm`: the stage's StageComm (runtime/stage_comm.py), which owns this part."""
        self.c, self.shape = comm, activation_shape
        self.sched: Schedule = comm.sched
        self.posted: dict[Action, tuple[Handle, torch.Tensor, float]] = {}
        self.blocking = comm.driver.policy.blocking
        self.waiters = {op: Waiter(f"trirace-send-{op.value}") for op in (Op.SF, Op.SB)} if not self.blocking else {}

    def _link(self, op: Op) -> str:
        _, peer = self.c.g.p2p[op]
        return self.c.topo.link_between(self.c.g.rank, peer)

    def post_ahead(self, group: list[Action] | None = None) -> None:
        with self.c.cond:
            todo = self.c.driver.recvs_to_post(group)
        for a in todo:
            comm, peer = self.c.g.p2p[a.op]
            t = torch.empty(self.shape, device=self.c.device)
            self.posted[a] = (comm.p2p([("recv", t, peer)]), t, self.c.rec.now())

    def _send(self, a: Action, tensor: torch.Tensor) -> Handle:
        comm, peer = self.c.g.p2p[a.op]
        t0 = self.c.rec.now()
        handle = comm.p2p([("send", tensor, peer)])
        self.c.stats.add(self.sched.step_of(a.index), transfers=1)
        nbytes = tensor.numel() * tensor.element_size()
        link = self._link(a.op)
        with self.c.cond:
            self.c.driver.p2p_sent(a, link, nbytes, t0)
        if not self.blocking:
            def finished(a=a, t0=t0, nbytes=nbytes, link=link):
                try:
                    t1 = self.c.rec.now()
                    self.c.rec.span("p2p send", str(a), t0, t1, bytes=nbytes)
                    self.c.links.observe(link, nbytes, t1 - t0, self.c.rec)
                finally:
                    with self.c.cond:
                        self.c.driver.p2p_send_done(link)
                        self.c.cond.notify_all()
            self.waiters[a.op].add(handle, finished, keep=tensor)
        return handle

    def exchange(self, group: list[Action], sends: list[tuple[Action, torch.Tensor]]) -> dict[Action, torch.Tensor]:
        """Run one group of adjacent P2P actions; return the received tensors."""
        recvs = [a for a in group if a.op in (Op.RF, Op.RB)]
        step = self.sched.step_of(group[0].index)
        if self.blocking:  # this group's receives, its sends, and wait for all of them here
            self.post_ahead(group)
            handles = [self._send(a, t) for a, t in sends]
            t0 = time.perf_counter()
            for h in handles:
                h.wait()
            out = {a: self._wait_recv(a) for a in recvs}
            self.c.stats.add(step, kind=Kind.P2P.value, exposed_s=time.perf_counter() - t0)
            return out
        for a, t in sends:
            self._send(a, t)
        return {a: self._wait_recv(a) for a in recvs}

    def _wait_recv(self, a: Action) -> torch.Tensor:
        handle, t, posted_at = self.posted.pop(a)
        t0 = time.perf_counter()
        handle.wait()
        t1 = time.perf_counter()
        # Waiting is not a busy link (the upstream may still be computing); the forecast
        # learns when the bytes crossed, if the wait says so.
        with self.c.cond:
            self.c.driver.p2p_arrived(a, self._link(a.op), t.numel() * t.element_size(), t1,
                                      waited=t1 - t0 > ARRIVED_S)
            self.c.driver.received(a)
            self.c.cond.notify_all()
        step = self.sched.step_of(a.index)
        if not self.blocking:
            self.c.stats.add(step, kind=Kind.P2P.value, exposed_s=time.perf_counter() - t0)
            self.post_ahead()
        self.c.stats.add(step, transfers=1)
        self.c.rec.span("p2p recv", str(a), max(posted_at, t0), self.c.rec.now(), waited_s=time.perf_counter() - t0)
        return t

    def close(self, failed: bool) -> None:
        if failed:
            return
        for w in self.waiters.values():
            w.close()
        for handle, _, _ in self.posted.values():  # nothing should be left; never leave a handle unwaited
            handle.wait()
