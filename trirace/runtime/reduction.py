"""A stage's gradient reduction across its replicas, and the tied-weight reduction.

Asynchronous policies: gradient hooks (and the end of the step's last backward) tell the
stage driver which chunks are final; one launcher thread issues what the driver admits,
in the agreed order, and is the only thread that issues on the reduction communicators
(the data-parallel one and the hierarchy's). Plain chunks complete on a `Waiter`; sparse
exchanges and hierarchical all-reduces are several dependent collectives, which the
launcher runs to completion itself. Blocking: the engine runs every chunk at AR, in order.
"""

from __future__ import annotations

import threading
import time

import torch

from ..plan.transfers import Chunk, Kind
from .communicator import Handle, Waiter
from .groups import warm_up_reduction
from .sparse_exchange import exchange


class Reduction:
    def __init__(self, comm, embedding_method: str):
        """`comm`: the stage's StageComm (runtime/stage_comm.py), which owns this part."""
        self.c = comm
        self.model, self.g, self.sched = comm.model, comm.g, comm.sched
        self.embedding_method = embedding_method
        self.asynchronous = comm.driver.reduces
        self.armed: dict[int, int] = {}  # weight-buffer slot -> step whose last backward runs on it
        self.after: dict[int, list[int]] = {}  # step -> the engine's last logged event before it
        self.chunk_seqs: dict[Chunk, list[int]] = {}  # chunk -> seqs of its logged ops
        self.tie: dict[int, tuple[Handle, float]] = {}
        self.error: BaseException | None = None
        self.stopping = False
        self.launcher: threading.Thread | None = None
        self._unhook = lambda: None
        if not self.asynchronous:
            warm_up_reduction(self.g, comm.device)
            return
        self.waiter = Waiter("trirace-allreduce")
        self._unhook = self.model.on_grad_ready(self._param_ready)
        ready = threading.Event()
        self.launcher = threading.Thread(target=self._launch_loop, args=(ready,), name="trirace-launcher", daemon=True)
        self.launcher.start()
        ready.wait()  # its warm-up precedes the pipeline's, on every rank
        if self.error is not None:
            raise RuntimeError("communication launcher failed to start") from self.error

    # ------------------------------------------------------------ readiness (engine thread, hooks)

    def backward_begins(self, step: int, last: bool) -> None:
        """Before each backward; `last` marks the step's final micro-batch, whose gradient
        accumulation readies the step's chunks."""
        if not (self.asynchronous and last):
            return
        after = self.c.log.last_seq()
        with self.c.cond:
            self.after[step] = after
            self.armed[self.model.slot_of(self.sched.version_of_step(step))] = step
            self.c.driver.backward_begins(step)

    def backward_ends(self, step: int, last: bool) -> None:
        if last and self.g.dp is None:  # no replicas: the gradient is final now
            self.c.norms.ready(step)
        if self.asynchronous and last:
            with self.c.cond:
                self.armed.pop(self.model.slot_of(self.sched.version_of_step(step)), None)
                self.c.driver.backward_ends(step)
                self.c.cond.notify_all()

    def _param_ready(self, slot: int, index: int) -> None:
        t0 = time.thread_time()
        with self.c.cond:
            step = self.armed.get(slot)
            if step is None:
                return
            if self.c.driver.params_ready(step, index, index + 1):
                self.c.stats.add(step, early_chunks=1)
                self.c.cond.notify_all()
        self.c.stats.add(step, cpu_s=time.thread_time() - t0)

    # ------------------------------------------------------------ the launcher thread

    def _launch_loop(self, ready: threading.Event) -> None:
        try:
            if self.c.device.type == "cuda":  # a new thread's current device is 0
                torch.cuda.set_device(self.c.device)
            warm_up_reduction(self.g, self.c.device)
        except BaseException as e:  # noqa: BLE001 - raised on the engine by __init__
            self.error = e
        ready.set()
        try:
            while self.error is None:
                with self.c.cond:
                    while not self.stopping and (norm := self._norm_due()) is None \
                            and not (batch := self.c.driver.launches(time.perf_counter())):
                        wake = self.c.driver.wake_at()  # a held chunk is reconsidered then, or on any event
                        self.c.cond.wait(None if wake is None else max(wake - time.perf_counter(), 1e-4))
                    if self.stopping:
                        return
                if norm is not None:  # the step is summed over replicas: its norm goes before more chunks
                    self.c.norms.ready(norm)
                    with self.c.cond:
                        self.c.cond.notify_all()  # the engine may be waiting for it at AR
                    continue
                for c in batch:
                    self._launch(c)
        except BaseException as e:  # surfaced to the engine at its next wait
            with self.c.cond:
                self.error = e
                self.c.cond.notify_all()

    def _norm_due(self) -> int | None:
        """The next step whose every chunk is done but whose norm is not issued (under cond)."""
        step = self.c.norms.next
        return step if self.c.driver.summed(step) else None

    def _launch(self, c: Chunk) -> None:
        self.c.log.follows(self.after.get(c.step, []))
        t0, cpu0 = self.c.rec.now(), time.thread_time()
        flat = self.model.flat_grad(self.sched.version_of_step(c.step))
        # Counted before it can complete, so the step's counters still exist.
        self.c.stats.add(c.step, transfers=1)
        if c.kind is Kind.SPARSE or self.g.hierarchy is not None:  # dependent collectives: run them here
            self._run_inline(c, flat)
            self.c.stats.add(c.step, cpu_s=time.thread_time() - cpu0)
            self._finished(c, t0, [])
            return
        part = flat[c.start:c.stop]
        wire = self._on_wire(part)
        handle = self.g.dp.all_reduce(wire)
        self.c.stats.add(c.step, cpu_s=time.thread_time() - cpu0)
        self.waiter.add(handle, lambda: self._finished(c, t0, handle.seqs, land=(part, wire)), keep=wire)

    def _on_wire(self, part: torch.Tensor) -> torch.Tensor:
        """The values a chunk's reduction sends: the slice itself, or a bf16 copy of it
        (--grad-comm-dtype bf16; the conversion is elementwise, so every policy's chunks
        carry the same values)."""
        return part if self.c.grad_dtype == part.dtype else part.to(self.c.grad_dtype)

    def _run_inline(self, c: Chunk, flat: torch.Tensor) -> None:
        if c.kind is Kind.SPARSE:
            self._exchange_rows(c)
            return
        part = flat[c.start:c.stop]
        wire = self._on_wire(part)
        if self.g.hierarchy is not None:
            self.g.hierarchy.all_reduce(wire)
        else:
            self.g.dp.all_reduce(wire).wait()
        if wire is not part:
            part.copy_(wire)

    def _finished(self, c: Chunk, t0: float, seqs: list[int],
                  land: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        # Whatever happens, mark the chunk done and record the error, or the engine would
        # wait for it forever.
        try:
            if land is not None and land[1] is not land[0]:  # the reduced bf16 values back into the buffer
                land[0].copy_(land[1])
            t1 = self.c.rec.now()
            self.c.rec.span("sparse" if c.kind is Kind.SPARSE else "allreduce", c.name, t0, t1, bytes=c.nbytes)
            n = self.g.layout.dp
            self.c.links.observe(self.c.driver.scheduler.chunk_link, c.nbytes * 2 * (n - 1) / n, t1 - t0, self.c.rec)
        except BaseException as e:  # noqa: BLE001
            self.error = self.error or e
        finally:
            with self.c.cond:
                self.chunk_seqs[c] = seqs
                self.c.driver.chunk_done(c, time.perf_counter())
                self.c.cond.notify_all()

    def _exchange_rows(self, c: Chunk) -> None:
        """The token table's gradient: only the rows some replica touched cross the link."""
        t0 = self.c.rec.now()
        view = self.model.grad_view(self.sched.version_of_step(c.step), c.params[0])
        link = self.c.topo.link(self.c.driver.scheduler.chunk_link)  # probed figures every replica agrees on
        _, st = exchange(view, group=self.g.dp, method=self.embedding_method, out=view,
                         alpha_s=link.latency_s, bytes_per_s=link.bytes_per_s)
        self.c.rec.span("sparse", c.name, t0, self.c.rec.now(), method=st["method"], bytes=st["bytes_sent"],
                        rows=st["rows"])
        self.c.stats.add(c.step, embedding_bytes=st["bytes_sent"], embedding_method=st["method"])

    # ------------------------------------------------------------ AR and OPT (engine thread)

    def reduce(self, step: int) -> None:
        """Block until step `step`'s gradients are averaged across replicas (the AR action)."""
        version = self.sched.version_of_step(step)
        if self.g.dp is not None:
            t0 = time.perf_counter()
            driver = self.c.driver
            if self.asynchronous:
                with self.c.cond:
                    driver.deadline(step, time.perf_counter())
                    self.c.cond.notify_all()
                    # The norm reads the summed gradient before this thread divides it.
                    if not self.c.cond.wait_for(lambda: self.error is not None or (driver.reduced(step)
                                                                                   and self.c.norms.issued(step)),
                                                timeout=self.c.timeout_s):
                        raise TimeoutError(f"step {step}'s gradient reduction made no progress in "
                                           f"{self.c.timeout_s:.0f} s")
                    if self.error is not None:
                        raise RuntimeError("communication launcher failed") from self.error
                    chunks, kind = driver.close_step(step)
                    seqs = [s for ch in chunks for s in self.chunk_seqs.pop(ch, [])]
                    self.after.pop(step, None)
                self.c.log.wait(seqs)  # this thread blocked until they were done
            else:  # in order, each to completion, right here
                flat = self.model.flat_grad(version)
                for ch in driver.plan(step):
                    self._run_inline(ch, flat)
                    if ch.kind is Kind.ALLREDUCE:
                        self.c.rec.span("allreduce", ch.name, t0, self.c.rec.now(), bytes=ch.nbytes)
                    driver.chunk_done(ch)
                    self.c.stats.add(step, transfers=1)
                chunks, kind = driver.close_step(step)
                self.c.norms.ready(step)
            self.model.flat_grad(version).div_(self.g.layout.dp)
            if self.model.table is not None and driver.sparse_param is None:  # dense method: the table rode along
                n = self.g.layout.dp
                self.c.stats.add(step, embedding_bytes=2 * (n - 1) / n * 4 * self.model.numels[self.model.table],
                                 embedding_method="dense")
            self.c.stats.add(step, kind=kind.value, exposed_s=time.perf_counter() - t0)
            self.c.rec.flow(chunks[-1].name, f"OPT{step}")
        if self.g.tie is not None:  # table and head are one weight: their gradients add up
            # Asynchronous, waited for by OPT: the two ends reach this point at different
            # places of their pipelines, and a blocking wait here could close a cycle with
            # the P2P transfers between them.
            view = self.model.grad_view(version, self.model.tied)
            self.tie[step] = (self.g.tie.all_reduce(view), time.perf_counter())
            self.c.stats.add(step, transfers=1)

    def before_update(self, step: int) -> None:
        """OPT's dependency on the tied-weight reduction."""
        if step in self.tie:
            handle, _ = self.tie.pop(step)
            t0 = time.perf_counter()
            handle.wait()
            self.c.stats.add(step, kind=Kind.ALLREDUCE.value, exposed_s=time.perf_counter() - t0)

    def close(self, failed: bool) -> None:
        self._unhook()  # else the hooks keep this job's model alive (StageModel.on_grad_ready)
        if self.launcher:
            with self.c.cond:
                self.stopping = True
                self.c.cond.notify_all()
            self.launcher.join()
        if failed:
            return
        if self.asynchronous:
            self.waiter.close()
        for handle, _ in self.tie.values():
            handle.wait()
        if self.error is not None:
            raise RuntimeError("communication failed") from self.error
