"""The executor of transfers on torch.distributed: it launches what the policy decides,
on asynchronous work handles, and waits only where the engine needs data.

P2P goes on each pipeline link's own pair group, gradient chunks on the stage's
data-parallel group, so the two run at the same time. A single launcher thread issues
every collective (in the agreed order), woken by a condition variable: completions arrive
as future callbacks, so nothing polls. Every Work handle is waited on.
"""

from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from collections import defaultdict, deque
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..comm import CommScheduler, Policy
from ..comm.autotune import Tuner
from ..obs.timeline import Recorder
from ..plan import Action, Op, Schedule
from ..plan.topology import Topology, single_node
from ..plan.transfers import Chunk, Kind, plan_reduction
from .groups import Groups
from .hierarchical import Hierarchy
from .stage import StageModel


class _Reaper(threading.Thread):
    """Waits on one link's send handles in order and reports each completion. gloo's P2P
    Work has no future to attach a callback to; a thread blocked in wait() (outside the
    GIL) is the event-driven equivalent, with no polling."""

    def __init__(self, name: str, timeout: timedelta):
        super().__init__(name=name, daemon=True)
        self.timeout = timeout
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.start()

    def add(self, work: dist.Work, tensor: torch.Tensor, done: Callable[[], None]) -> None:
        self.q.put((work, tensor, done))  # the tensor stays alive until the send completes

    def run(self) -> None:
        while (item := self.q.get()) is not None:
            work, _tensor, done = item
            try:
                work.wait(self.timeout)
            except BaseException as e:  # noqa: BLE001 - surfaced by close()
                self.error = self.error or e
            try:
                done()  # always: it releases the link, or chunks would be held forever
            except BaseException as e:  # noqa: BLE001
                self.error = self.error or e

    def close(self) -> None:
        self.q.put(None)
        self.join()
        if self.error is not None:
            raise RuntimeError(f"{self.name}: a send failed") from self.error


class _Done:
    """The Work of a collective already completed on the launcher thread."""

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)
        return fut


class LinkEstimates:
    """Achieved throughput per link class, from completed transfers (an exponential moving
    average). Local to a rank: it may inform when this rank launches, never what its group
    must agree on."""

    def __init__(self, topo: Topology, weight: float = 0.2):
        self.weight = weight
        self.bytes_per_s = {cls: topo.link(cls).bytes_per_s for cls in ("intra", "inter")}
        self._lock = threading.Lock()

    def observe(self, link: str, nbytes: float, seconds: float, rec: Recorder) -> None:
        if seconds <= 0 or nbytes < 64 * 1024:  # small transfers measure latency, not bandwidth
            return
        with self._lock:
            old = self.bytes_per_s[link]
            self.bytes_per_s[link] = old + self.weight * (nbytes / seconds - old)
            value = self.bytes_per_s[link]
        rec.counter(f"{link}-node link MB/s (achieved)", value / 1e6)


class CommStats:
    """Counters per step: the step a transfer's data belongs to, not the wall-clock window,
    so the last steps of a 2BW run (whose updates run back to back) still own their transfers.
    Written from the engine, the launcher and the hooks, hence the lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self._steps: dict[int, dict] = defaultdict(self._fresh)

    @staticmethod
    def _fresh() -> dict:
        return {"exposed": defaultdict(float), "transfers": 0, "cpu_s": 0.0, "embedding_bytes": 0.0,
                "embedding_method": None}

    def add(self, step: int, *, kind: str | None = None, exposed_s: float = 0.0, transfers: int = 0,
            cpu_s: float = 0.0, embedding_bytes: float = 0.0, embedding_method: str | None = None) -> None:
        with self._lock:
            st = self._steps[step]
            if kind is not None:
                st["exposed"][kind] += exposed_s
            st["transfers"] += transfers
            st["cpu_s"] += cpu_s
            st["embedding_bytes"] += embedding_bytes
            st["embedding_method"] = embedding_method or st["embedding_method"]

    def take(self, step: int) -> dict:
        with self._lock:
            st = self._steps.pop(step, None) or self._fresh()
        return {**st, "exposed": dict(st["exposed"])}


class Comm:
    def __init__(self, policy: Policy, schedule: Schedule, groups: Groups, model: StageModel,
                 activation_shape: tuple[int, ...], device: torch.device, recorder: Recorder,
                 tuner: Tuner | None = None, topology: Topology | None = None,
                 hierarchy: Hierarchy | None = None, embedding_method: str = "dense", timeout_s: float = 60.0):
        self.policy, self.sched, self.g, self.model = policy, schedule, groups, model
        self.tuner = tuner
        # gloo applies its timeout to collectives but not to P2P waits: every wait here has one.
        self.timeout = timedelta(seconds=timeout_s)
        self.topo = topology or single_node(groups.layout.world_size)
        self.links = LinkEstimates(self.topo)
        self.hierarchy = hierarchy  # set when the policy and topology call for it
        self.embedding_method = embedding_method
        self.tie_works: dict[int, tuple[dist.Work, float]] = {}
        # The token table travels as a SPARSE item (only touched rows) unless the method is
        # dense or there is no replica to exchange with.
        self.sparse_param = model.table if embedding_method != "dense" and groups.dp is not None else None
        self.shape, self.device, self.rec = activation_shape, device, recorder
        self.stats = CommStats()
        self.scheduler = CommScheduler(policy, self.topo.group_link(groups.layout.dp_group(groups.stage)))
        self.cond = threading.Condition()
        self.reapers = ({op: _Reaper(f"trirace-send-{op.value}", self.timeout) for op in (Op.SF, Op.SB)}
                        if not policy.blocking else {})
        self.chunk_works: dict[Chunk, dist.Work] = {}
        self.done_chunks: set[Chunk] = set()
        self.step_chunks: dict[int, list[Chunk]] = {}
        self.pending_params: dict[int, dict[int, int]] = {}  # step -> chunk seq -> params not ready
        self.armed: dict[int, int] = {}  # version slot -> step whose last backward runs on it
        self.posted: dict[Action, tuple[dist.Work, torch.Tensor, float]] = {}
        acts = schedule.actions[groups.stage]
        self.recv_queue = deque(a for a in acts if a.op in (Op.RF, Op.RB))
        self.error: BaseException | None = None
        self.stopping = False
        self.launcher: threading.Thread | None = None
        if not policy.blocking:
            model.on_grad_ready(self._param_ready)
            self.launcher = threading.Thread(target=self._launch_loop, name="trirace-launcher", daemon=True)
            self.launcher.start()
            self._post_recvs()

    # ------------------------------------------------------------ P2P

    def _peer(self, op: Op) -> tuple[int, dist.ProcessGroup]:
        if op in (Op.RF, Op.SB):
            return self.g.prev_rank, self.g.prev
        return self.g.next_rank, self.g.next

    def _irecv(self, a: Action) -> None:
        t = torch.empty(self.shape, device=self.device)
        src, group = self._peer(a.op)
        self.posted[a] = (dist.irecv(t, src=src, group=group), t, self.rec.now())

    def _post_recvs(self, ahead: int = 2) -> None:
        """Keep the next receives posted before their data can arrive (receive before send)."""
        while self.recv_queue and sum(1 for a in self.posted if a.op in (Op.RF, Op.RB)) < ahead:
            self._irecv(self.recv_queue.popleft())

    def _isend(self, a: Action, tensor: torch.Tensor) -> dist.Work:
        dst, group = self._peer(a.op)
        t0 = self.rec.now()
        work = dist.isend(tensor, dst=dst, group=group)
        self.stats.add(self.sched.step_of(a.index), transfers=1)
        if not self.policy.blocking:
            link = self.topo.link_between(self.g.rank, dst)
            with self.cond:
                self.scheduler.p2p_started(link)

            def finished(a=a, t0=t0, nbytes=tensor.numel() * tensor.element_size(), link=link):
                try:
                    t1 = self.rec.now()
                    self.rec.span("p2p send", str(a), t0, t1, bytes=nbytes)
                    self.links.observe(link, nbytes, t1 - t0, self.rec)
                finally:
                    with self.cond:
                        self.scheduler.p2p_finished(link)
                        self.cond.notify_all()
            self.reapers[a.op].add(work, tensor, finished)
        return work

    def exchange(self, sends: list[tuple[Action, torch.Tensor]], recvs: list[Action]) -> dict[Action, torch.Tensor]:
        """Run one group of adjacent P2P actions; return the received tensors."""
        cpu0 = time.thread_time()
        try:
            return self._exchange(sends, recvs)
        finally:
            step = self.sched.step_of((sends[0][0] if sends else recvs[0]).index)
            self.stats.add(step, cpu_s=time.thread_time() - cpu0)

    def _exchange(self, sends: list[tuple[Action, torch.Tensor]], recvs: list[Action]) -> dict[Action, torch.Tensor]:
        if self.policy.blocking:
            for a in recvs:
                self._irecv(a)
                self.recv_queue.remove(a)
            works = [self._isend(a, t) for a, t in sends]
            t0 = time.perf_counter()
            for w in works:
                w.wait(self.timeout)
            out = {a: self._wait_recv(a) for a in recvs}
            step = self.sched.step_of((sends[0][0] if sends else recvs[0]).index)
            self.stats.add(step, kind=Kind.P2P.value, exposed_s=time.perf_counter() - t0)
            return out
        for a, t in sends:
            self._isend(a, t)
        return {a: self._wait_recv(a) for a in recvs}

    def _wait_recv(self, a: Action) -> torch.Tensor:
        work, t, posted_at = self.posted.pop(a)
        t0 = time.perf_counter()
        link = self.topo.link_between(self.g.rank, self._peer(a.op)[0])
        if not self.policy.blocking:
            with self.cond:
                self.scheduler.p2p_started(link)  # a stage is waiting on this link now
        work.wait(self.timeout)
        if not self.policy.blocking:
            with self.cond:
                self.scheduler.p2p_finished(link)
                self.cond.notify_all()
            self.stats.add(self.sched.step_of(a.index), kind=Kind.P2P.value, exposed_s=time.perf_counter() - t0)
            self._post_recvs()
        self.stats.add(self.sched.step_of(a.index), transfers=1)
        self.rec.span("p2p recv", str(a), max(posted_at, t0), self.rec.now(), waited_s=time.perf_counter() - t0)
        return t

    # ------------------------------------------------------------ gradient reduction

    def policy_for(self, step: int) -> Policy:
        """The policy with the chunk and credit sizes that step `step` uses (tuned or fixed)."""
        return self.tuner.policy_for(step) if self.tuner else self.policy

    def _plan(self, step: int) -> list[Chunk]:
        if step not in self.step_chunks:
            p = self.policy_for(step)
            chunk_elems = None if p.partition_bytes is None else p.partition_bytes // 4
            self.step_chunks[step] = plan_reduction(step, self.model.numels, chunk_elems, p.chunk_order,
                                                    sparse_param=self.sparse_param)
        return self.step_chunks[step]

    def backward_begins(self, step: int, last: bool) -> None:
        """Before each backward; `last` marks the step's final micro-batch, whose gradient
        accumulation readies the step's chunks."""
        if self.policy.blocking or not last or self.g.dp is None:
            return
        chunks = self._plan(step)
        with self.cond:
            self.pending_params[step] = {c.seq: c.params[1] - c.params[0] for c in chunks}
            self.armed[self.sched.version_of_step(step) % len(self.model.versions)] = step
            self.scheduler.policy = self.policy_for(step)
            self.scheduler.enqueue(chunks)

    def backward_ends(self, step: int, last: bool) -> None:
        if not self.policy.blocking and last and self.g.dp is not None:
            with self.cond:
                self.armed.pop(self.sched.version_of_step(step) % len(self.model.versions), None)
                for c in self._plan(step):  # parameters without a gradient are ready too
                    if self.pending_params[step].pop(c.seq, None) is not None:
                        self.scheduler.ready(c)
                self.cond.notify_all()

    def _param_ready(self, slot: int, index: int) -> None:
        t0 = time.thread_time()
        with self.cond:
            step = self.armed.get(slot)
            if step is None:
                return
            pending = self.pending_params[step]
            for c in self._plan(step):
                if c.params[0] <= index < c.params[1] and c.seq in pending:
                    pending[c.seq] -= 1
                    if pending[c.seq] == 0:
                        del pending[c.seq]
                        self.scheduler.ready(c)
                        self.cond.notify_all()
        self.stats.add(step, cpu_s=time.thread_time() - t0)

    def _launch_loop(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopping and not (batch := self.scheduler.launches()):
                        self.cond.wait()
                    if self.stopping:
                        return
                for c in batch:
                    self._launch_chunk(c)
        except BaseException as e:  # surfaced to the engine at its next wait
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def _launch_chunk(self, c: Chunk) -> None:
        flat = self.model.flat_grad(self.sched.version_of_step(c.step))
        t0, cpu0 = self.rec.now(), time.thread_time()
        if c.kind is Kind.SPARSE:  # several dependent collectives: run them here, in order
            self._exchange_rows(c)
            work = _Done()
        elif self.hierarchy is not None:  # three dependent phases: run them here, in order
            self.hierarchy.all_reduce(flat[c.start:c.stop])
            work = _Done()
        else:
            work = dist.all_reduce(flat[c.start:c.stop], group=self.g.dp, async_op=True)

        def finished(_fut, c=c, t0=t0):
            # torch drops exceptions raised in callbacks: whatever happens, mark the chunk
            # done and record the error, or the engine would wait for it forever.
            try:
                t1 = self.rec.now()
                self.rec.span("allreduce", c.name, t0, t1, bytes=c.nbytes)
                n = self.g.layout.dp
                self.links.observe(self.scheduler.chunk_link, c.nbytes * 2 * (n - 1) / n, t1 - t0, self.rec)
            except BaseException as e:  # noqa: BLE001
                self.error = self.error or e
            finally:
                with self.cond:
                    self.scheduler.finished(c)
                    self.done_chunks.add(c)
                    self.cond.notify_all()
        # Counted before the callback can run (it may run inline), so the step still exists.
        self.stats.add(c.step, transfers=1, cpu_s=time.thread_time() - cpu0)
        with self.cond:
            self.chunk_works[c] = work
        work.get_future().add_done_callback(finished)

    def reduce(self, step: int) -> None:
        """Block until step `step`'s gradients are averaged across replicas (the AR action)."""
        cpu0 = time.thread_time()
        try:
            self._reduce(step)
        finally:
            self.stats.add(step, cpu_s=time.thread_time() - cpu0)

    def _exchange_rows(self, c: Chunk) -> None:
        """The token table's gradient: only the rows some replica touched cross the link."""
        from .sparse_exchange import exchange

        version = self.sched.version_of_step(c.step)
        t0 = self.rec.now()
        view = self.model.grad_view(version, c.params[0])
        link = self.topo.link(self.scheduler.chunk_link)  # probed figures every replica agrees on
        _, st = exchange(view, group=self.g.dp, method=self.embedding_method, out=view,
                         alpha_s=link.latency_s, bytes_per_s=link.bytes_per_s)
        self.rec.span("sparse", c.name, t0, self.rec.now(), method=st["method"], bytes=st["bytes_sent"],
                      rows=st["rows"])
        self.stats.add(c.step, embedding_bytes=st["bytes_sent"], embedding_method=st["method"])

    def _reduce(self, step: int) -> None:
        version = self.sched.version_of_step(step)
        flat = self.model.flat_grad(version)
        if self.g.dp is not None:
            t0 = time.perf_counter()
            chunks = self._plan(step)
            if self.policy.blocking:  # in order, each to completion, right here
                for c in chunks:
                    if c.kind is Kind.SPARSE:
                        self._exchange_rows(c)
                    else:
                        dist.all_reduce(flat[c.start:c.stop], group=self.g.dp)
                        self.rec.span("allreduce", c.name, t0, self.rec.now(), bytes=c.nbytes)
                    self.stats.add(step, transfers=1)
            else:
                with self.cond:
                    self.scheduler.deadline(step)
                    self.cond.notify_all()
                    if not self.cond.wait_for(lambda: self.error is not None or all(c in self.done_chunks for c in chunks),
                                              timeout=self.timeout.total_seconds()):
                        raise TimeoutError(f"step {step}'s gradient reduction made no progress in "
                                           f"{self.timeout.total_seconds():.0f} s")
                    if self.error is not None:
                        raise RuntimeError("communication launcher failed") from self.error
                    works = [self.chunk_works.pop(c) for c in chunks]
                    self.done_chunks.difference_update(chunks)
                for w in works:
                    w.wait(self.timeout)
                self.pending_params.pop(step, None)
            del self.step_chunks[step]
            flat /= self.g.layout.dp
            if self.sparse_param is None and self.model.table is not None:  # dense method: the table rode along
                n = self.g.layout.dp
                self.stats.add(step, embedding_bytes=2 * (n - 1) / n * 4 * self.model.numels[self.model.table],
                               embedding_method="dense")
            self.stats.add(step, kind=Kind.ALLREDUCE.value, exposed_s=time.perf_counter() - t0)
            self.rec.flow(chunks[-1].name, f"OPT{step}")
        if self.model.tied is not None:  # table and head are one weight: their gradients add up
            # Asynchronous, waited for by OPT: the two ends reach this point at different
            # places of their pipelines, and a blocking wait here could close a cycle with
            # the P2P transfers between them.
            view = self.model.grad_view(version, self.model.tied)
            self.tie_works[step] = (dist.all_reduce(view, group=self.g.tie, async_op=True), time.perf_counter())
            self.stats.add(step, transfers=1)

    def before_update(self, step: int) -> None:
        """OPT's dependency on the tied-weight reduction."""
        if step in self.tie_works:
            work, _ = self.tie_works.pop(step)
            t0 = time.perf_counter()
            work.wait(self.timeout)
            self.stats.add(step, kind=Kind.ALLREDUCE.value, exposed_s=time.perf_counter() - t0)


    def close(self, failed: bool = False) -> None:
        """Stop the threads. On success every handle is waited on; after a failure nothing
        is waited on (a peer may be gone), the process is about to exit."""
        if self.launcher:
            with self.cond:
                self.stopping = True
                self.cond.notify_all()
            self.launcher.join()
        if failed:
            return
        for r in self.reapers.values():
            r.close()
        for work, _, _ in self.posted.values():  # nothing should be left; never leave a handle unwaited
            work.wait()
        if self.error is not None:
            raise RuntimeError("communication failed") from self.error
