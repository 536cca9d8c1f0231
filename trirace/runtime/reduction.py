"""A stage's gradient reduction across its replicas, and the tied-weight reduction.

The engine thread launches everything, at the units of its action list the stage driver
names (policy/launch_plan.py): after the step's last backward and later units, the
chunks placed there; at AR, whatever is left. A plain chunk's all-reduce is asynchronous
and completes on a `Waiter`. A sparse exchange is several dependent collectives
(sparse_exchange.py): the engine launches its first where the plan puts the chunk, and
after each later unit waits for the one in flight and launches the next, so the exchange
overlaps the step's computation a collective at a time. It has a communicator of its own
(groups.py: `rows`), so its collectives never queue behind the dense chunks' bytes. A
hierarchical all-reduce runs to completion where it is launched. At the plan's sum point
(or at AR) the engine finishes the step's exchanges, waits for every chunk of the step and
issues the step's norm contribution (gradnorm.py); AR then divides; where table and head
are one weight, OPT reduces it across the ends of the pipeline. Blocking: AR runs every
chunk in order, each to completion.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from ..obs.timeline import Recorder
from ..plan import Schedule
from ..plan.transfers import Chunk, Kind
from ..policy.driver import StageDriver
from .communicator import Handle, Waiter
from .gradnorm import GradNorms
from .groups import Groups
from .sparse_exchange import Phases, phases, run
from .stage import StageModel
from .stats import CommStats, LinkEstimates


@dataclass
class _Exchange:
    """A sparse exchange under way: the collective in flight and what resumes it."""

    chunk: Chunk
    steps: Phases
    t0: float
    handle: Handle | None = None  # None until its first collective is launched
    cpu_s: float = 0.0


class Reduction:
    def __init__(self, driver: StageDriver, model: StageModel, groups: Groups, schedule: Schedule, norms: GradNorms,
                 stats: CommStats, links: LinkEstimates, rec: Recorder, grad_dtype: torch.dtype,
                 embedding_method: str, timeout_s: float):
        self.driver, self.model, self.g, self.sched, self.norms = driver, model, groups, schedule, norms
        self.stats, self.links, self.rec, self.log = stats, links, rec, groups.control.log
        self.grad_dtype = grad_dtype  # what gradients cross the data-parallel links in
        self.embedding_method, self.timeout_s = embedding_method, timeout_s
        self.link = groups.plan.topology.link(driver.chunk_link)  # probed figures every replica agrees on
        self.cond = threading.Condition()  # chunk completions arrive on the waiter
        self.chunk_seqs: dict[Chunk, list[int]] = {}  # chunk -> seqs of its logged ops
        self.summed: dict[int, tuple[list[Chunk], Kind]] = {}  # steps waited for and their norm issued
        self.error: BaseException | None = None
        self.exchanges: list[_Exchange] = []  # sparse exchanges in flight, in launch order
        self.waiter = Waiter("trirace-allreduce") if driver.reduces else None

    # ------------------------------------------------------------ launches (engine thread)

    def backward_begins(self, step: int, last: bool, unit: int) -> None:
        """Before each backward (unit `unit`); `last` marks the step's final micro-batch,
        after which the step's chunks are final and get their slots."""
        if last and self.driver.reduces:
            self.driver.backward_begins(step, unit)

    def backward_ends(self, step: int, last: bool) -> None:
        if last and self.g.dp is None:  # no replicas: the gradient is final now
            self.norms.ready(step)

    def after_unit(self, unit: int) -> None:
        for x in list(self.exchanges):  # each exchange in flight: its next collective
            self._resume(x)
        for c in self.driver.launches_after(unit):
            self._launch(c)
        for step in self.driver.summed_at(unit):  # the plan's point to issue its norm, before AR
            self._sum(step)

    def _launch(self, c: Chunk) -> None:
        t0, cpu0 = self.rec.now(), time.thread_time()
        flat = self.model.flat_grad(self.sched.version_of_step(c.step))
        self.stats.add(c.step, transfers=1)
        if c.kind is Kind.SPARSE:  # its first collective now, the others after later units
            x = _Exchange(c, self._exchange_rows(c), t0)
            self.exchanges.append(x)
            self._resume(x)
            return
        if self.g.hierarchy is not None:  # dependent collectives: run them here
            self._run_inline(c, flat)
            self.stats.add(c.step, cpu_s=time.thread_time() - cpu0)
            self._finished(c, t0, [])
            return
        part = flat[c.start:c.stop]
        wire = self._on_wire(part)
        handle = self.g.dp.all_reduce(wire)
        self.stats.add(c.step, cpu_s=time.thread_time() - cpu0)
        self.waiter.add(handle, lambda: self._finished(c, t0, handle.seqs, land=(part, wire)), keep=wire)

    def _on_wire(self, part: torch.Tensor) -> torch.Tensor:
        """The values a chunk's reduction sends: the slice itself, or a bf16 copy of it
        (--grad-comm-dtype bf16; the conversion is elementwise, so every policy's chunks
        carry the same values)."""
        return part if self.grad_dtype == part.dtype else part.to(self.grad_dtype)

    def _resume(self, x: _Exchange) -> None:
        """Wait for `x`'s collective in flight (none when it starts) and launch its next;
        at its end, the chunk is done."""
        cpu0 = time.thread_time()
        if x.handle is not None:
            x.handle.wait()
        try:
            x.handle = next(x.steps)
        except StopIteration:
            self.exchanges.remove(x)
            self.stats.add(x.chunk.step, cpu_s=x.cpu_s + time.thread_time() - cpu0)
            self._finished(x.chunk, x.t0, [])
            return
        x.cpu_s += time.thread_time() - cpu0

    def _finish_exchanges(self) -> None:
        """Run the exchanges in flight to their end (at a sum point, which waits for them)."""
        while self.exchanges:
            self._resume(self.exchanges[0])

    def _run_inline(self, c: Chunk, flat: torch.Tensor) -> None:
        if c.kind is Kind.SPARSE:
            run(self._exchange_rows(c))
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
            t1 = self.rec.now()
            self.rec.span("sparse" if c.kind is Kind.SPARSE else "allreduce", c.name, t0, t1, bytes=c.nbytes)
            if c.kind is Kind.ALLREDUCE:  # (an exchange's span holds the units it was spread over)
                n = self.g.layout.dp
                self.links.observe(self.driver.chunk_link, c.nbytes * 2 * (n - 1) / n, t1 - t0, self.rec)
        except BaseException as e:  # noqa: BLE001
            self.error = self.error or e
        finally:
            with self.cond:
                self.chunk_seqs[c] = seqs
                self.driver.chunk_done(c)
                self.cond.notify_all()

    def _exchange_rows(self, c: Chunk) -> Phases:
        """The token table's gradient: only the rows some replica touched cross the link."""
        t0 = self.rec.now()
        view = self.model.grad_view(self.sched.version_of_step(c.step), c.params[0])
        out, st = yield from phases(view, group=self.g.rows or self.g.dp, method=self.embedding_method, out=view,
                                    alpha_s=self.link.latency_s, bytes_per_s=self.link.bytes_per_s)
        self.rec.span("sparse", c.name, t0, self.rec.now(), method=st["method"], bytes=st["bytes_sent"],
                      rows=st["rows"])
        self.stats.add(c.step, embedding_bytes=st["bytes_sent"], embedding_method=st["method"])
        return out, st

    # ------------------------------------------------------------ AR and OPT (engine thread)

    def _sum(self, step: int) -> None:
        """Wait until every chunk of `step` is done, then issue the step's norm contribution,
        which reads the summed gradient (before AR divides it)."""
        t0 = time.perf_counter()
        self._finish_exchanges()
        with self.cond:
            if not self.cond.wait_for(lambda: self.error is not None or self.driver.reduced(step),
                                      timeout=self.timeout_s):
                raise TimeoutError(f"step {step}'s gradient reduction made no progress in {self.timeout_s:.0f} s")
            if self.error is not None:
                raise RuntimeError("gradient reduction failed") from self.error
            chunks, kind = self.driver.close_step(step)
            seqs = [s for ch in chunks for s in self.chunk_seqs.pop(ch, [])]
        self.log.wait(seqs)  # this thread blocked until they were done
        self.norms.ready(step)
        self.summed[step] = (chunks, kind)
        self.stats.add(step, kind=kind.value, exposed_s=time.perf_counter() - t0)

    def reduce(self, step: int) -> None:
        """AR: block until step `step`'s gradients are averaged across replicas."""
        version = self.sched.version_of_step(step)
        if self.g.dp is not None:
            t0 = time.perf_counter()
            driver = self.driver
            if driver.reduces:
                for c in driver.deadline(step):
                    self._launch(c)
                if step not in self.summed:
                    self._sum(step)
                chunks, kind = self.summed.pop(step)
            else:  # in order, each to completion, right here
                flat = self.model.flat_grad(version)
                for ch in driver.plan(step):
                    self._run_inline(ch, flat)
                    if ch.kind is Kind.ALLREDUCE:
                        self.rec.span("allreduce", ch.name, t0, self.rec.now(), bytes=ch.nbytes)
                    driver.chunk_done(ch)
                    self.stats.add(step, transfers=1)
                chunks, kind = driver.close_step(step)
                # The norm reads the summed gradient before this thread divides it.
                self.norms.ready(step)
                self.stats.add(step, kind=kind.value, exposed_s=time.perf_counter() - t0)
            self.model.flat_grad(version).div_(self.g.layout.dp)
            if self.model.table is not None and driver.sparse_param is None:  # dense method: the table rode along
                n = self.g.layout.dp
                self.stats.add(step, embedding_bytes=2 * (n - 1) / n * 4 * self.model.numels[self.model.table],
                               embedding_method="dense")
            self.rec.flow(chunks[-1].name, f"OPT{step}")

    def before_update(self, step: int) -> None:
        """OPT's dependency on the tied weight: table and head are one weight, so their
        gradients add up across the two ends of the pipeline. Launched here, at the update
        block, where every stage's launches form one consistent cut (plan/schedule.py's
        `crossing`): at AR, which blocking keeps before its deferred OPT, a transfer still
        pending between the ends could wait behind it on the device."""
        if self.g.tie is None:
            return
        version = self.sched.version_of_step(step)
        t0 = time.perf_counter()
        self.g.tie.all_reduce(self.model.grad_view(version, self.model.tied)).wait()
        self.stats.add(step, transfers=1, kind=Kind.ALLREDUCE.value, exposed_s=time.perf_counter() - t0)

    def close(self, failed: bool) -> None:
        if failed:
            return
        if self.waiter is not None:
            self.waiter.close()
        if self.error is not None:
            raise RuntimeError("gradient reduction failed") from self.error
