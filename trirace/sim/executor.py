"""The simulated executor: the same action lists, policies and launch plan as the
runtime, run against a clock instead of processes.

Each stage has one representative rank (sim/fabric.py folds its replicas into it), or,
unfolded, one rank per replica whose collectives meet in a shared group. A rank walks the
units of its action list (`p2p_groups`) as runtime/engine.py does and calls the same
`StageDriver` (policy/driver.py) at the same units: `backward_begins` at a step's last
backward places its chunks, `launches_after` after every unit launches them, `deadline`
at AR launches the rest, and `observe_compute` after OPT feeds the compute figures of two
steps before, as the runtime's lagged metrics do. So the two cannot decide differently.
What the runtime's engine and gloo do is mirrored too: a run of transfers posts its
receives with its sends, a transfer moves once both ends are posted, asynchronous
all-reduces queue on the group's `collective_streams` workers and sparse exchanges on
another group's, while hierarchical all-reduces hold the engine until they end. (The
runtime launches an exchange's collectives one per unit, each after the previous lands;
here they run back to back, which is the same wherever a unit outlasts a collective.)
Every OPT waits for the step's global gradient norm (runtime/gradnorm.py): a world-wide
all-reduce to which each rank contributes once its gradient of the step is summed over its
replicas, so no stage updates before every stage has reduced.

Time advances through a heap of events; every transfer and every computation is a flow
on the max-min network, so computation that shares a CPU pool slows down like
communication sharing a link.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..policy import Policy
from ..policy.driver import TIMED_OPS, StageDriver
from ..obs.timeline import Recorder
from ..plan import Action, Op, Schedule
from ..plan.schedule import p2p_groups, peer_stage, transfer_ends
from ..plan.transfers import Chunk, Kind
from ..models.devices import WEIGHT_GRAD_SHARE
from .compute import ComputeNoise
from .fabric import Fabric, FlowClass


@dataclass(frozen=True)
class Phase:
    """One step of a transfer: every copy of `cls` moves `nbytes` after `latency_s`, in
    `messages` messages (each costs the shared cores a fixed CPU time, sim/host.py), and
    `local_s` seconds of each copy's own work on its memory beside them (a sparse
    exchange's passes over the table: on the shared cores only, where there are some)."""

    cls: FlowClass
    nbytes: float
    latency_s: float
    messages: int = 1
    local_s: float = 0.0


@dataclass
class StageWork:
    """What one stage computes and reduces, in the executor's terms."""

    forward_s: float  # one micro-batch
    backward_s: float  # one micro-batch
    optimizer_s: float
    numels: list[int]
    policy: Policy
    collective: Callable[[Chunk], list[Phase]]  # how a chunk crosses the network
    inline: Callable[[Chunk], bool]  # does the engine run this chunk to completion where it launches it?
    sparse_param: int | None = None
    grad_elem_size: int = 4  # bytes per gradient value on the wire (2 with --grad-comm-dtype bf16)


@dataclass
class StepStats:
    end: float = 0.0
    # the shared cores' CPU used since the run began, by kind, when this step's OPT ended
    # (Network.cpu_at; run.py reads the last stage's first replica, as it reads `end`)
    cpu_total_s: dict[str, float] = field(default_factory=dict)
    exposed: dict[str, float] = field(default_factory=lambda: {"p2p": 0.0, "allreduce": 0.0, "sparse": 0.0})


class _Group:
    """A data-parallel group's collectives. Each simulated member issues its own; the k-th
    of every member is one collective (NCCL's rule: all members issue in one order), which
    moves once the last member has issued it. gloo runs `streams` collectives at once."""

    def __init__(self, sim: "Simulation", streams: int, members: int):
        self.sim, self.streams, self.members = sim, streams, members
        self.issued = [0] * members
        self.joining: dict[int, tuple[str, list[Phase], list[Callable[[], None]]]] = {}
        self.queue: deque = deque()
        self.running = 0

    def submit(self, member: int, name: str, phases: list[Phase], done: Callable[[], None]) -> None:
        k = self.issued[member]
        self.issued[member] += 1
        first, _, dones = self.joining.setdefault(k, (name, phases, []))
        if first != name:
            raise RuntimeError(f"collective {k} issued as {first} and as {name}: members disagree on the order")
        dones.append(done)
        if len(dones) == self.members:
            del self.joining[k]
            self.queue.append((phases, dones))
            self._next()

    def _next(self) -> None:
        while self.queue and self.running < self.streams:
            phases, dones = self.queue.popleft()
            self.running += 1

            def finished(dones=dones):
                self.running -= 1
                for done in dones:
                    done()
                self._next()
            self.sim.transfer(phases, finished)


class _Rank:
    def __init__(self, sim: "Simulation", stage: int, replica: int):
        self.sim, self.stage, self.replica = sim, stage, replica
        self.rank = sim.fabric.layout.rank(stage, replica)
        self.work = sim.stages[stage]
        self.compute_cls = sim.fabric.compute_cls(stage, replica)
        self.duration = sim.duration(self.rank)
        self.groups = p2p_groups(sim.schedule.actions[stage])
        self.pc = 0
        self.policy = self.work.policy
        topo, layout = sim.fabric.topo, sim.fabric.layout
        link = topo.group_link(layout.dp_group(stage))
        self.has_dp = layout.dp > 1
        p2p_links = {op: sim.link_of(stage, peer_stage(stage, op), replica) for op in (Op.SF, Op.RB, Op.RF, Op.SB)
                     if 0 <= peer_stage(stage, op) < sim.schedule.n_stages}
        self.driver = StageDriver(self.policy, self.work.numels, link, sim.schedule.actions[stage],
                                  reduces=self.has_dp, sparse_param=self.work.sparse_param,
                                  p2p_links=p2p_links, link_bytes_per_s=topo.rates(),
                                  group_size=layout.dp, elem_size=self.work.grad_elem_size)
        self.group, self.row_group = sim.groups[stage], sim.row_groups[stage]
        self.to_launch: deque[Chunk] = deque()  # chunks the plan puts after the unit just done
        self.inline: Chunk | None = None  # a chunk the engine runs to completion itself
        self.to_sum: deque[int] = deque()  # steps whose reduction the plan waits for after that unit
        self.summed: set[int] = set()  # steps waited for, their norm contribution issued
        self.waiting: Callable[[], bool] | None = None  # the condition the engine is blocked on
        self.wait_since = 0.0
        self.in_flight_mb = 0
        self.peak_in_flight = 0
        self.op_s: dict[int, dict[Op, list[float]]] = {}  # step -> op -> [seconds, count]
        self.rec = Recorder(self.rank, enabled=sim.record)
        self.norm_next = 0  # the next step whose norm contribution this rank issues (in order)
        self.norm_final: set[int] = set()  # steps whose gradient is final here, not yet issued

    # ------------------------------------------------------------ engine

    def advance(self) -> None:
        """Run units until one has to wait (for a computation, a transfer or a reduction),
        launching after each the chunks the plan puts there, as runtime/engine.py does."""
        while self.waiting is None and self.inline is None and (self.to_launch or self.to_sum
                                                                  or self.pc < len(self.groups)):
            if self.to_launch:
                self._launch(self.to_launch.popleft())
                continue
            if self.to_sum:
                self._sum(self.to_sum.popleft())
                continue
            group = self.groups[self.pc]
            a = group[0]
            if a.op.is_p2p:
                self._exchange(group)
            elif a.op is Op.AR:
                self._reduce(a.index)
            elif a.op is Op.F:
                self.in_flight_mb += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight_mb)
                self._received(a, lambda a=a: self._compute(a, self.work.forward_s))
            elif a.op in (Op.B, Op.W):
                self._received(a, lambda a=a: self._backward(a))
            elif a.op is Op.I:
                self._received(a, lambda a=a: self._compute(a, self._input_grad_s()))
            else:  # OPT, after the tied weight's reduction where there is one
                self._update(a)
            if self.waiting is None:
                self._unit_done()

    def _unit_done(self) -> None:
        self.to_launch.extend(self.driver.launches_after(self.pc))
        self.to_sum.extend(self.driver.summed_at(self.pc))
        self.pc += 1

    def _update(self, a: Action) -> None:
        """OPT: after the tied weight's reduction where there is one (launched here, as the
        runtime does), then the step's global norm; both waits are exposed all-reduce time,
        as the runtime counts them."""
        sim, step = self.sim, a.index
        sim.tie_arrive(self, step)

        def arrived() -> bool:
            return step in sim.norm_done and (not sim.ties(self.stage) or (self.replica, step) in sim.tie_done)
        if arrived():
            self._compute(a, self.work.optimizer_s, lambda: self._observe(step))
            return
        t0 = sim.now

        def ready() -> bool:
            if not arrived():
                return False
            self.stats(step).exposed["allreduce"] += sim.now - t0
            self.waiting = None
            self._compute(a, self.work.optimizer_s, lambda: self._observe(step))
            return self.waiting is None  # done at once (a zero-second update)
        self._block(ready)

    def _observe(self, step: int) -> None:
        """After OPT `step`, the compute figures of step `step - 2` reach the driver, slowest
        replica of the stage first, as the runtime's lagged metrics all-reduce delivers them."""
        old = step - 2
        peers = [self.sim.rank_at[(self.stage, r)] for r in range(self.sim.fabric.replicas)]
        figures = [p.op_s.get(old) for p in peers]
        if old < 0 or any(f is None for f in figures):
            return
        self.driver.observe_compute(old, {op: max(f[op][0] / f[op][1] for f in figures if op in f)
                                          for op in TIMED_OPS if any(op in f for f in figures)})
        self.op_s.pop(old - 4, None)  # every replica is past it

    def _gradient_final(self, step: int) -> None:
        """This rank's gradient of `step` is summed over its replicas: its norm contribution
        goes once every earlier step's has (gradnorm.py issues strictly in step order)."""
        self.norm_final.add(step)
        while self.norm_next in self.norm_final:
            self.norm_final.discard(self.norm_next)
            self.sim.norm_arrive(self.norm_next)
            self.norm_next += 1

    def stats(self, step: int) -> StepStats:
        return self.sim.stats.setdefault((self.stage, self.replica, step), StepStats())

    def _block(self, until: Callable[[], bool]) -> None:
        self.waiting, self.wait_since = until, self.sim.now

    def resume(self) -> None:
        """Called after any event touching this rank: continue if what it waits for is there."""
        if self.waiting is not None and self.waiting():
            self.waiting = None
            self._unit_done()
            self.advance()

    def _compute(self, a: Action, seconds: float, then: Callable[[], None] | None = None) -> None:
        t0 = self.sim.now
        box = {"done": False}

        def done():
            box["done"] = True
            self.rec.span("compute", str(a), t0, self.sim.now)
            spent = self.op_s.setdefault(self.sim.schedule.step_of_action(a), {}).setdefault(a.op, [0.0, 0])
            spent[0] += self.sim.now - t0
            spent[1] += 1
            if a.op is Op.OPT:
                st = self.stats(a.index)
                st.end = self.sim.now
                st.cpu_total_s = self.sim.fabric.net.cpu_at(self.sim.now)
            if then:
                then()
            self.resume()
        self.sim.run_compute(self.compute_cls, seconds, done, self.duration)
        self._block(lambda: box["done"])

    def _input_grad_s(self) -> float:
        """A split backward's I: the input gradient, none on the first stage (the runtime's
        first stage computes everything at W)."""
        return 0.0 if self.stage == 0 else (1 - WEIGHT_GRAD_SHARE) * self.work.backward_s

    def _backward(self, a: Action) -> None:
        """B, or a split backward's W: the step's chunks are ready after its last one."""
        step = self.sim.schedule.step_of(a.index)
        last = (a.index + 1) % self.sim.schedule.micro_batches == 0
        self.in_flight_mb -= 1
        if last and self.driver.reduces:
            self.driver.backward_begins(step, self.pc)
        final = (lambda: self._gradient_final(step)) if last and not self.has_dp else None
        seconds = self.work.backward_s if a.op is Op.B else self.work.backward_s - self._input_grad_s()
        self._compute(a, seconds, final)

    # ------------------------------------------------------------ P2P

    def _exchange(self, group: list[Action]) -> None:
        """One batch: the run's receives are posted with its sends; blocking waits for its
        sends here, every policy for a receive where its data is used (`_received`)."""
        sim = self.sim
        for a in group:
            if a.op in (Op.RF, Op.RB):
                sim.p2p_posted(self, a)
        msgs = [sim.p2p_send(self, a) for a in group if a.op in (Op.SF, Op.SB)]
        if not self.policy.blocking:
            return
        t0 = sim.now
        step = sim.schedule.step_of_action(group[0])

        def complete() -> bool:
            if not all(m.released for m in msgs):
                return False
            self.stats(step).exposed["p2p"] += sim.now - t0
            return True
        if not complete():
            self._block(complete)

    def _received(self, a: Action, then: Callable[[], None]) -> None:
        """Run `then` once what compute `a` consumes from a neighbour has arrived."""
        sim, s = self.sim, self.stage
        need = (Action(Op.RF, a.index) if a.op is Op.F and s > 0 else
                Action(Op.RB, a.index) if a.op.takes_output_grad and s < sim.schedule.n_stages - 1 else None)
        if need is None:
            then()
            return
        m, t0 = sim.message_for_recv(self, need), sim.now
        step = sim.schedule.step_of_action(a)

        def arrived() -> bool:
            if not m.delivered:
                return False
            self.rec.span("p2p recv", str(need), max(m.posted_at, t0), sim.now, waited_s=sim.now - t0)
            self.stats(step).exposed["p2p"] += sim.now - t0
            self.waiting = None
            then()
            return self.waiting is None
        if m.delivered:
            arrived()
        else:
            self._block(arrived)

    # ------------------------------------------------------------ gradient reduction

    def _run_chunk(self, c: Chunk, then: Callable[[], None]) -> None:
        """Submit `c` to the group; when it is done, record it and call `then`."""
        t0 = self.sim.now

        def done():
            self.rec.span("sparse" if c.kind is Kind.SPARSE else "allreduce", c.name, t0, self.sim.now, bytes=c.nbytes)
            self.driver.chunk_done(c)
            then()
        group = self.row_group if c.kind is Kind.SPARSE else self.group
        group.submit(self.replica, c.name, self.work.collective(c), done)

    def _launch(self, c: Chunk) -> None:
        """The engine launches `c`; a hierarchical all-reduce holds it until it ends."""
        if not self.work.inline(c):
            self._run_chunk(c, self.resume)
            return
        self.inline = c

        def done():
            self.inline = None
            self.resume()
            self.advance()
        self._run_chunk(c, done)

    def _sum(self, step: int) -> None:
        """Wait for every chunk of `step`, then issue its norm contribution (runtime:
        Reduction._sum)."""
        t0 = self.sim.now

        def complete() -> bool:
            if not self._close(step, t0):
                return False
            self.summed.add(step)
            return True
        if not complete():
            self._block_then(complete)

    def _close(self, step: int, t0: float) -> bool:
        """If every chunk of `step` is done: issue its norm contribution, forget the step and
        count the wait since `t0` as exposed; False while a chunk is still running."""
        if not self.driver.reduced(step):
            return False
        self._gradient_final(step)
        _, kind = self.driver.close_step(step)
        self.stats(step).exposed[kind.value] += self.sim.now - t0
        return True

    def _block_then(self, until: Callable[[], bool]) -> None:
        """Block the engine outside a unit (between units): on release, go on with advance."""
        def ready() -> bool:
            if not until():
                return False
            self.waiting = None
            self.advance()
            return False  # the unit was already done: resume must not count it again
        self._block(ready)

    def _reduce(self, step: int) -> None:
        if not self.has_dp:
            return
        sim = self.sim
        t0 = sim.now
        todo = deque(self.driver.plan(step) if self.policy.blocking else self.driver.deadline(step))

        def next_chunk():  # blocking: each to completion, in order; otherwise inline ones hold the engine
            while todo:
                c = todo.popleft()
                if self.policy.blocking or self.work.inline(c):
                    self._run_chunk(c, lambda: (next_chunk(), self.resume()))
                    return
                self._run_chunk(c, self.resume)

        def complete() -> bool:
            if step in self.summed:
                self.summed.discard(step)
                return True
            return not todo and self._close(step, t0)
        next_chunk()
        if not complete():
            self._block(complete)


@dataclass
class Message:
    src: int
    posted_at: float = -1.0  # when the receiver posted its receive (-1: not yet)
    sent_at: float = -1.0
    delivered: bool = False
    released: bool = False  # the sender's send returned: what is left fits the transport's buffers
    on_released: list[Callable[[], None]] = field(default_factory=list)


class Simulation:
    def __init__(self, schedule: Schedule, fabric: Fabric, stages: list[StageWork], activation_bytes: float,
                 collective_streams: int = 1, record: bool = False, tie_bytes: float = 0.0,
                 send_buffer: dict[str, float] | None = None, noise: ComputeNoise | None = None,
                 draw: int = 0):
        self.schedule, self.fabric, self.stages = schedule, fabric, stages
        self.noise, self.draw = noise, draw  # noise None: every computation takes its mean time
        self.computing = 0  # computations running now, on all ranks
        self.activation_bytes = activation_bytes
        self.tie_bytes = tie_bytes  # the tied table/head gradient (fabric.tied)
        # By link class: bytes a send may still have to move when it returns (the kernel's
        # socket buffer and the queue before the link take them; measured by trirace profile).
        self.send_buffer = send_buffer or {}
        self.tie_arrived: dict[tuple[int, int], int] = {}  # (replica, step) -> ends that issued it
        self.tie_done: set[tuple[int, int]] = set()
        self.norm_arrived: dict[int, int] = {}  # step -> ranks that issued its norm contribution
        self.norm_done: set[int] = set()
        self.collective_streams = collective_streams
        self.record = record
        self.now = 0.0
        self.events: list = []
        self.seq = itertools.count()
        self.flow_done: dict[object, Callable[[], None]] = {}
        self.flow_ids = itertools.count()
        self.net_version = 0
        self.messages: dict[tuple, Message] = {}
        self.stats: dict[tuple[int, int, int], StepStats] = {}  # (stage, replica, step)
        self.events_run = 0
        replicas = fabric.replicas
        self.groups = [_Group(self, collective_streams, replicas) for _ in range(schedule.n_stages)]
        # the token table's exchange: a communicator of its own, as the runtime's (groups.py: rows)
        self.row_groups = [_Group(self, collective_streams, replicas) for _ in range(schedule.n_stages)]
        self.ranks = [_Rank(self, s, r) for s in range(schedule.n_stages) for r in range(replicas)]
        self.rank_at = {(r.stage, r.replica): r for r in self.ranks}

    # ------------------------------------------------------------ clock

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.events, (t, next(self.seq), fn))

    def run(self, max_events: int = 50_000_000) -> None:
        for r in self.ranks:
            r.advance()
        while self.events:
            t, _, fn = heapq.heappop(self.events)
            self.now = t
            fn()
            self.events_run += 1
            if self.events_run > max_events:
                raise RuntimeError("simulation did not finish (event budget exhausted)")
        stuck = [r for r in self.ranks if r.pc < len(r.groups)]
        if stuck:
            desc = "; ".join(f"stage {r.stage} at {' '.join(map(str, r.groups[r.pc]))}" for r in stuck)
            raise RuntimeError(f"simulated run deadlocked: {desc}")

    def duration(self, rank: int) -> Callable[[float, int], float]:
        """How long a computation of a mean `seconds` takes on `rank`, started with `load`
        ranks computing."""
        return (lambda seconds, load: seconds) if self.noise is None else self.noise.sampler(rank, self.draw)

    # ------------------------------------------------------------ flows

    def _flow(self, amount: float, uses, done: Callable[[], None], senior: bool = False,
              tag: str | None = None) -> None:
        key = next(self.flow_ids)
        self.flow_done[key] = done
        self.fabric.net.start(key, amount, uses, self.now, senior, tag)
        self._reschedule()

    def _reschedule(self) -> None:
        self.net_version += 1
        t = self.fabric.net.next_completion()
        if t is not None:
            version = self.net_version
            self.at(max(t, self.now), lambda: self._net_event(version))

    def _net_event(self, version: int) -> None:
        if version != self.net_version:
            return  # rates changed since this completion was predicted
        done = self.fabric.net.finished(self.now)
        callbacks = [self.flow_done.pop(k) for k in done]
        self._reschedule()
        for cb in callbacks:
            cb()

    def run_compute(self, cls: FlowClass, seconds: float, done: Callable[[], None],
                    duration: Callable[[float, int], float] | None = None) -> None:
        """Compute for a mean `seconds` (`duration` draws the time it takes, given the
        ranks computing), then call `done`."""
        if duration is not None:
            seconds = duration(seconds, self.computing + 1)
        if seconds <= 0:
            self.at(self.now, done)
            return
        self.computing += 1

        def finished():
            self.computing -= 1
            done()
        self._flow(seconds, self.fabric.uses[cls], finished, tag="compute")

    def transfer(self, phases: list[Phase], done: Callable[[], None]) -> None:
        """Run `phases` one after the other, then call `done`."""
        if not phases:
            self.at(self.now, done)
            return
        first, rest = phases[0], phases[1:]
        p2p = first.cls[0] == "p2p"

        def moved():
            self.transfer(rest, done)

        def start():
            cpu_s = self.fabric.cpu_seconds(first.cls, first.nbytes, first.messages, first.local_s)
            # an activation's bytes may be favoured on a link that serves the oldest first
            parts = [(first.nbytes, self.fabric.uses[first.cls], p2p, None)] if first.nbytes > 0 else []
            if cpu_s > 0:  # the transfer's CPU work, beside its bytes, on the cores computation shares
                parts.append((cpu_s, self.fabric.uses[("cpu", first.cls)], False, "transfer"))
            if not parts:
                moved()
            left = [len(parts)]

            def part_done():
                left[0] -= 1
                if left[0] == 0:
                    moved()
            for amount, uses, senior, tag in parts:
                self._flow(amount, uses, part_done, senior, tag)
        # a collective's messages each wait behind what other transfers queued on a shaped link
        # (P2P behind P2P: the measured link share, sim/network.py)
        wait = first.latency_s + (0.0 if p2p else first.messages * self.fabric.queue_wait(first.cls))
        if wait > 0:
            self.at(self.now + wait, start)
        else:
            start()

    # ------------------------------------------------------------ tied weights

    def ties(self, stage: int) -> bool:
        return self.fabric.tied and stage in (0, self.schedule.n_stages - 1)

    def tie_arrive(self, end: _Rank, step: int) -> None:
        """A pipeline end finished step `step`'s reduction: it issues the tied weight's
        all-reduce with the other end of its replica (runtime/reduction.py), which moves
        once both ends have."""
        if not self.ties(end.stage):
            return
        key = (end.replica, step)
        if self.tie_arrived.pop(key, 0) < 1:
            self.tie_arrived[key] = 1
            return
        cls = self.fabric.tie_cls(end.replica)
        half = Phase(cls, self.tie_bytes / 2, self.fabric.latency[cls])

        def done():
            self.tie_done.add(key)
            for s in (0, self.schedule.n_stages - 1):
                self.rank_at[(s, end.replica)].resume()
        self.transfer([half, half], done)

    # ------------------------------------------------------------ the global gradient norm

    def norm_arrive(self, step: int) -> None:
        """A rank issued its contribution to step `step`'s norm. The world all-reduce of a
        few numbers completes a ring's worth of latencies after the last rank issues it."""
        self.norm_arrived[step] = self.norm_arrived.get(step, 0) + 1
        if self.norm_arrived[step] < len(self.ranks):
            return
        del self.norm_arrived[step]
        topo, world = self.fabric.topo, self.fabric.layout.world_size
        latency = max(topo.inter.latency_s if topo.nodes > 1 else 0.0, topo.intra.latency_s)

        def done():
            self.norm_done.add(step)
            for r in self.ranks:
                r.resume()
        self.at(self.now + 2 * (world - 1) * latency, done)

    # ------------------------------------------------------------ P2P matching

    @staticmethod
    def _key(end: _Rank, a: Action) -> tuple:
        """(direction, sending stage, replica, micro-batch): a send and its receive meet here."""
        src, dst = transfer_ends(end.stage, a.op)
        return ("fwd" if src < dst else "bwd", src, end.replica, a.index)

    def link_of(self, stage: int, other: int, replica: int = 0) -> str:
        L = self.fabric.layout
        return self.fabric.topo.link_between(L.rank(stage, replica), L.rank(other, replica))

    def _message(self, key: tuple) -> Message:
        return self.messages.setdefault(key, Message(src=key[1]))

    def message_for_recv(self, end: _Rank, a: Action) -> Message:
        return self._message(self._key(end, a))

    def p2p_posted(self, end: _Rank, a: Action) -> None:
        key = self._key(end, a)
        msg = self._message(key)
        msg.posted_at = self.now
        self._maybe_move(key, msg)

    def p2p_send(self, sender: _Rank, a: Action) -> Message:
        key = self._key(sender, a)
        msg = self._message(key)
        msg.sent_at = self.now
        self._maybe_move(key, msg)
        return msg

    def _maybe_move(self, key: tuple, msg: Message) -> None:
        if msg.sent_at < 0 or msg.posted_at < 0:
            return
        direction, src, replica, k = key
        dst = src + 1 if direction == "fwd" else src - 1
        cls = self.fabric.p2p_cls(min(src, dst), direction, replica)
        t0 = self.now
        lat = self.fabric.latency[cls]
        sender, receiver = self.rank_at[(src, replica)], self.rank_at[(dst, replica)]
        buffered = min(self.send_buffer.get(self.link_of(src, dst, replica), 0.0), self.activation_bytes)

        def released():
            msg.released = True
            for cb in msg.on_released:
                cb()
            if buffered > 0:
                sender.resume()
                self.transfer([Phase(cls, buffered, 0.0, messages=0)], delivered)
            else:
                delivered()

        def delivered():
            msg.delivered = True
            sender.rec.span("p2p send", f"{'SF' if direction == 'fwd' else 'SB'}{k}", t0, self.now,
                            bytes=self.activation_bytes)
            for r in (sender, receiver):
                r.resume()
        # the sender's send returns once what is left fits its buffers; the bytes arrive later
        self.transfer([Phase(cls, self.activation_bytes - buffered, lat)], released)
