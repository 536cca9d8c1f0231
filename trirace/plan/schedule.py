"""Pipeline schedules as data.

A schedule is, for each pipeline stage, the ordered list of actions that every replica of
that stage runs: compute (F, B), point-to-point transfers of activations and their
gradients (SF/RF, SB/RB), the data-parallel gradient reduction of a step (AR) and the
optimizer step that publishes the next weight version (OPT). Micro-batches are numbered
globally across steps (micro-batch k belongs to step k // m), so a schedule with no flush
(2BW) is just a list that runs across step boundaries.

Builders are pure functions: compute order first, then `lower_p2p` adds the transfers each
computation needs. Nothing here touches torch; the runtime and the simulator execute the
same lists, and `validate` proves a schedule sound without running it.

Weight versions: step t computes on W(t - staleness) and OPT t turns W(t) into W(t + 1).
staleness 0 is synchronous training (GPipe, PipeDream-Flush 1F1B); staleness 1 is
PipeDream-2BW: W(t+1) = W(t) - lr * grad f(W(t-1)), two versions alive at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from ..errors import UsageError


class ScheduleError(UsageError):
    """A schedule that would compute the wrong thing, leave a transfer unmatched or deadlock."""


class Op(str, Enum):
    F = "F"  # forward of micro-batch k
    B = "B"  # backward of micro-batch k (both parts below, at once)
    I = "I"  # the part of B that gives the stage's input gradient (what the previous stage waits for)
    W = "W"  # the part of B that gives the weight gradients (what the step's reduction waits for)
    SF = "SF"  # send activation of k to the next stage
    RF = "RF"  # receive activation of k from the previous stage
    SB = "SB"  # send input-gradient of k to the previous stage
    RB = "RB"  # receive output-gradient of k from the next stage
    AR = "AR"  # gradients of step t averaged across the stage's replicas
    OPT = "OPT"  # optimizer step t: W(t) -> W(t+1), the weight-version swap

    @property
    def is_p2p(self) -> bool:
        return self in (Op.SF, Op.RF, Op.SB, Op.RB)

    @property
    def is_compute(self) -> bool:
        return self in (Op.F, Op.B, Op.I, Op.W)

    @property
    def takes_output_grad(self) -> bool:
        """The backward computation that consumes the received output gradient (RB)."""
        return self in (Op.B, Op.I)

    @property
    def ends_backward(self) -> bool:
        """The computation after which a micro-batch's weight gradients are complete."""
        return self in (Op.B, Op.W)


@dataclass(frozen=True, order=True)
class Action:
    op: Op
    index: int  # micro-batch for F/B/SF/RF/SB/RB, step for AR/OPT

    def __str__(self) -> str:
        return f"{self.op.value}{self.index}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        m = _ACTION_RE.fullmatch(text.strip())
        if not m:
            raise ScheduleError(f"not an action: {text!r} (expected e.g. F3, SB2, AR0, OPT0)")
        return cls(Op(m.group(1)), int(m.group(2)))


_ACTION_RE = re.compile(r"(OPT|AR|SF|RF|SB|RB|F|B|I|W)([0-9]+)")

KINDS = ("gpipe", "1f1b", "zb-h1", "2bw")
SPLIT_BACKWARD = ("zb-h1",)  # schedules whose backwards run as I and W apart


@dataclass(frozen=True)
class Schedule:
    kind: str
    n_stages: int
    micro_batches: int  # per step
    steps: int
    actions: tuple[tuple[Action, ...], ...]  # per stage

    @property
    def staleness(self) -> int:
        return 1 if self.kind == "2bw" else 0

    @property
    def splits_backward(self) -> bool:
        return self.kind in SPLIT_BACKWARD

    def step_of(self, micro_batch: int) -> int:
        return micro_batch // self.micro_batches

    def step_of_action(self, a: Action) -> int:
        """The step an action belongs to: AR and OPT name it, the others name a micro-batch."""
        return a.index if a.op in (Op.AR, Op.OPT) else self.step_of(a.index)

    def version_of_step(self, step: int) -> int:
        """The weight version W(v) that step `step` computes on. W(-1) is a second copy of
        W(0), so that steps 0 and 1 of 2BW accumulate into different buffers."""
        return step - self.staleness

    def __str__(self) -> str:
        head = f"{self.kind} stages={self.n_stages} micro_batches={self.micro_batches} steps={self.steps}"
        rows = [f"stage {s}: " + " ".join(map(str, acts)) for s, acts in enumerate(self.actions)]
        return "\n".join([head, *rows])

    @classmethod
    def parse(cls, text: str) -> "Schedule":
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        try:
            kind, *fields = lines[0].split()
            meta = dict(f.split("=") for f in fields)
            actions = tuple(
                tuple(Action.parse(a) for a in ln.split(":", 1)[1].split()) for ln in lines[1:]
            )
            sched = cls(kind, int(meta["stages"]), int(meta["micro_batches"]), int(meta["steps"]), actions)
        except (ValueError, KeyError, IndexError) as e:
            raise ScheduleError(f"malformed schedule text: {e}") from None
        if len(sched.actions) != sched.n_stages:
            raise ScheduleError(f"schedule declares {sched.n_stages} stages but lists {len(sched.actions)}")
        return sched


# ---------------------------------------------------------------- builders


def _gpipe_step(stage: int, d: int, m: int, step: int) -> list[Action]:
    ks = range(step * m, (step + 1) * m)
    return [Action(Op.F, k) for k in ks] + [Action(Op.B, k) for k in ks] + _update(step)


def _one_f_one_b(stage: int, d: int, ks: list[int]) -> list[Action]:
    """1F1B over the micro-batch stream `ks`: (d - stage - 1) warm-up forwards, then
    alternate one forward and one backward, then drain the remaining backwards."""
    warm = min(d - stage - 1, len(ks))
    out = [Action(Op.F, k) for k in ks[:warm]]
    for i in range(len(ks) - warm):
        out += [Action(Op.F, ks[warm + i]), Action(Op.B, ks[i])]
    out += [Action(Op.B, k) for k in ks[len(ks) - warm :]]
    return out


def _update(step: int) -> list[Action]:
    return [Action(Op.AR, step), Action(Op.OPT, step)]


def _with_updates_after_last_backward(acts: list[Action], m: int) -> list[Action]:
    out = []
    for a in acts:
        out.append(a)
        if a.op is Op.B and (a.index + 1) % m == 0:
            out += _update(a.index // m)
    return out


def _zero_bubble_h1(d: int, ks: list[int]) -> list[list[Action]]:
    """ZB-H1 (Qi et al., ICLR 2024) over the micro-batches `ks` of one step, per stage.

    Each backward runs as I (the input gradient, which the previous stage waits for) and W
    (the weight gradients, which only the step's reduction waits for). The order comes from
    replaying the step with every computation taking one unit, the times the method
    assumes (T_F = T_I = T_W), where a free stage runs the first of:
    - its next I, once the output gradient has arrived: it is on the critical path;
    - its next F, while fewer than d micro-batches hold activations there (from their F
      to their W: 1F1B's peak, reached on its first stage, so the peak memory stays
      1F1B's);
    - its oldest W still to run.
    The W's a stage defers fill what are 1F1B's bubbles: with equal times the bubble is
    d - 1 units at m = d and d + 1 at larger m, against 1F1B's 3 (d - 1). (Preferring a
    W to an F at some depth, which other orders do, measured no shorter in this replay.)
    Pure: the same order on every rank."""
    n = len(ks)
    inf = float("inf")
    fin = {(op, s, i): inf for op in (Op.F, Op.I) for s in range(d) for i in range(n)}
    order: list[list[Action]] = [[] for _ in range(d)]
    next_f, next_i, held = [0] * d, [0] * d, [0] * d
    pending_w: list[list[int]] = [[] for _ in range(d)]
    left, t = 3 * d * n, 0
    while left:
        for s in range(d):
            i, f = next_i[s], next_f[s]
            if i < n and fin[Op.F, s, i] <= t and (s == d - 1 or fin[Op.I, s + 1, i] <= t):
                op, next_i[s] = Op.I, i + 1
                fin[Op.I, s, i] = t + 1
                pending_w[s].append(i)
            elif f < n and held[s] < d and (s == 0 or fin[Op.F, s - 1, f] <= t):
                op, i, next_f[s] = Op.F, f, f + 1
                fin[Op.F, s, f] = t + 1
                held[s] += 1
            elif pending_w[s]:
                op, i = Op.W, pending_w[s].pop(0)
                held[s] -= 1
            else:
                continue
            order[s].append(Action(op, ks[i]))
            left -= 1
        t += 1
    return order


def compute_order(kind: str, n_stages: int, micro_batches: int, steps: int) -> list[list[Action]]:
    """F/B/AR/OPT per stage, before transfers are added."""
    d, m = n_stages, micro_batches
    if kind == "gpipe":
        return [[a for t in range(steps) for a in _gpipe_step(s, d, m, t)] for s in range(d)]
    if kind == "1f1b":  # PipeDream-Flush: a full 1F1B pipeline per step, flushed by the update
        return [
            [a for t in range(steps) for a in _with_updates_after_last_backward(
                _one_f_one_b(s, d, list(range(t * m, (t + 1) * m))), m)]
            for s in range(d)
        ]
    if kind == "zb-h1":  # flushed like 1f1b, each backward split into I and W
        per_step = [_zero_bubble_h1(d, list(range(t * m, (t + 1) * m))) for t in range(steps)]
        return [[a for t in range(steps) for a in (*per_step[t][s], *_update(t))] for s in range(d)]
    if kind == "2bw":  # one 1F1B stream over every step: warm-up once, never flushed
        stream = list(range(steps * m))
        return [_with_updates_after_last_backward(_one_f_one_b(s, d, stream), m) for s in range(d)]
    raise ScheduleError(f"unknown schedule {kind!r}; choose from {', '.join(KINDS)}")


def lower_p2p(order: list[list[Action]]) -> list[list[Action]]:
    """Insert each computation's transfers: receive right before it, send right after
    (a split backward's transfers go with its I; its W has none). Adjacent transfers form
    one group that the runtime posts together (receives first), which is what keeps 1F1B's
    crossing sends from deadlocking."""
    d = len(order)
    lowered = []
    for s, acts in enumerate(order):
        out: list[Action] = []
        for a in acts:
            if a.op is Op.F:
                out += [Action(Op.RF, a.index)] if s > 0 else []
                out.append(a)
                out += [Action(Op.SF, a.index)] if s < d - 1 else []
            elif a.op.takes_output_grad:
                out += [Action(Op.RB, a.index)] if s < d - 1 else []
                out.append(a)
                out += [Action(Op.SB, a.index)] if s > 0 else []
            else:
                out.append(a)
        lowered.append(out)
    return lowered


def build_schedule(kind: str, n_stages: int, micro_batches: int, steps: int) -> Schedule:
    if n_stages < 1 or micro_batches < 1 or steps < 1:
        raise ScheduleError("stages, micro-batches and steps must all be at least 1")
    acts = lower_p2p(compute_order(kind, n_stages, micro_batches, steps))
    sched = Schedule(kind, n_stages, micro_batches, steps, tuple(tuple(a) for a in acts))
    validate(sched)
    return sched


def defer_updates(sched: Schedule, ops: tuple[Op, ...] = (Op.AR, Op.OPT)) -> Schedule:
    """Move each step's AR and OPT (or only `ops` of them) as late as the math allows: just
    before the first forward that computes on W(t+1), i.e. the first F of step t + 1 +
    staleness. For 2BW that is a whole step of slack for the gradient reduction; for flushed
    schedules nothing moves."""
    out = []
    for acts in sched.actions:
        body = [a for a in acts if a.op not in ops]
        first: dict[int, int] = {}  # step -> position of its first forward (one pass: linear in the run)
        for i, a in enumerate(body):
            if a.op is Op.F:
                first.setdefault(sched.step_of(a.index), i)
        before: dict[int, list[Action]] = {}  # position -> what goes in front of it
        for t in range(sched.steps):
            at = first.get(t + 1 + sched.staleness, len(body))
            if 0 < at < len(body) and body[at - 1].op is Op.RF:  # keep a forward next to its receive
                at -= 1
            before.setdefault(at, []).extend(Action(op, t) for op in ops)
        moved = [x for i, a in enumerate(body) for x in (*before.get(i, ()), a)]
        out.append(tuple(moved + before.get(len(body), [])))
    deferred = Schedule(sched.kind, sched.n_stages, sched.micro_batches, sched.steps, tuple(out))
    validate(deferred)
    return deferred


def schedule_for_policy(sched: Schedule, defers_updates: bool, tied_across_stages: bool,
                        global_update: bool = True, early: bool = True) -> Schedule:
    """The action lists a policy runs: asynchronous policies move AR and OPT to their
    deadlines. Blocking keeps AR after the last backward; its OPT also waits at its
    deadline when OPT needs something from another stage (the tied reduction, or the global
    gradient norm of `global_update`), since blocking P2P leaves no earlier point where
    the stages of a 2BW pipeline are free to wait for each other. Flushed schedules have
    such a point after every step, so for them nothing moves. Every update block then
    becomes a cut no transfer crosses (`cut_at_updates`), and asynchronous policies post
    receives a computation early where that is proven safe (`receives_early`)."""
    if defers_updates:
        out = defer_updates(sched)
    elif tied_across_stages or global_update:
        out = defer_updates(sched, (Op.OPT,))
    else:
        out = sched
    out = cut_at_updates(out)
    if defers_updates and early:  # (validated there: the whole schedule, once)
        moved = receives_early(out, global_update)
        if moved is not out:
            return moved
    # with global_update, also the evaluation pass after OPT, whether or not this job runs one
    validate(out, global_update=global_update, chained_update=global_update)
    return out


def receives_early(sched: Schedule, global_update: bool = True) -> Schedule:
    """Post receives one computation earlier, each as a batch of its own: its bytes can then
    cross while the stage computes (gloo and NCCL move data only once the receive is
    posted), and the engine waits for them only where they are used. A receive moves in
    front of the computation that precedes its run, unless that computation follows a
    transfer run (it would join that batch) or an update block (the cut). Under 1F1B both
    directions at once deadlock on a device (each stage's early receive waits for a send
    queued behind the other's), so the backward receives move first, then the forward
    ones, then both are tried, and the first that the validator (which replays the runs as
    a device does, one kernel at a time) proves free of deadlock is kept; none: the
    receives stay where they were."""
    # Which directions may move is a property of the schedule's pattern, which repeats
    # every step: found on three steps of it, then checked on the whole.
    probe = schedule_for_policy(build_schedule(sched.kind, sched.n_stages, sched.micro_batches, min(sched.steps, 3)),
                                True, False, global_update, early=False)
    for ops in ((Op.RF, Op.RB), (Op.RF,), (Op.RB,)):
        if not _sound(_receives_before_compute(probe, ops), global_update):
            continue
        early = _receives_before_compute(sched, ops)
        return early if _sound(early, global_update) else sched
    return sched


def _sound(sched: Schedule, global_update: bool) -> bool:
    try:
        if crossing(sched) is not None:
            return False
        validate(sched, global_update=global_update, chained_update=global_update)
    except ScheduleError:
        return False
    return True


def _receives_before_compute(sched: Schedule, ops: tuple[Op, ...]) -> Schedule:
    out = []
    for acts in sched.actions:
        moved: dict[int, list[Action]] = {}  # position of the computation -> receives put before it
        drop: set[Action] = set()
        for i, a in enumerate(acts):
            if a.op not in ops:
                continue
            j = i - 1
            while j >= 0 and acts[j].op.is_p2p:  # the start of a's run
                j -= 1
            if j < 1 or not acts[j].op.is_compute or acts[j - 1].op.is_p2p or acts[j - 1].op in (Op.AR, Op.OPT):
                continue
            moved.setdefault(j, []).append(a)
            drop.add(a)
        out.append(tuple(x for i, a in enumerate(acts) if a not in drop for x in (*moved.get(i, ()), a)))
    return Schedule(sched.kind, sched.n_stages, sched.micro_batches, sched.steps, tuple(out))


def _cuts(acts: tuple[Action, ...] | list[Action], steps: int) -> list[int]:
    """Where each step's update block starts: its AR when AR sits right before OPT, else
    its OPT."""
    pos = {a: i for i, a in enumerate(acts)}
    out = []
    for t in range(steps):
        i = pos[Action(Op.OPT, t)]
        out.append(i - 1 if i and acts[i - 1] == Action(Op.AR, t) else i)
    return out


def _messages(sched: Schedule):
    """Every transfer as (sending stage, its action, receiving stage, its action)."""
    for s in range(sched.n_stages - 1):
        for k in range(sched.steps * sched.micro_batches):
            yield s, Action(Op.SF, k), s + 1, Action(Op.RF, k)
            yield s + 1, Action(Op.SB, k), s, Action(Op.RB, k)


def _epochs(sched: Schedule) -> list[dict[Action, int]]:
    """Per stage, each transfer's epoch: how many update blocks precede it."""
    out = []
    for acts in sched.actions:
        cuts, epoch, e = _cuts(acts, sched.steps), {}, 0
        for i, a in enumerate(acts):
            while e < len(cuts) and cuts[e] <= i:
                e += 1
            if a.op.is_p2p:
                epoch[a] = e
        out.append(epoch)
    return out


def crossing(sched: Schedule) -> tuple[int, Action, int, Action] | None:
    """(sending stage, send, receiving stage, receive) of a transfer whose ends lie on
    different sides of an update block, or None.

    At its update block a stage waits, on the host, for the step's global gradient norm
    from every stage, and reads device values (the norm, the compute timings), which on a
    device waits for every kernel it launched before. A send launched before the block on
    one side and received after the block on the other closes a cycle there: the stages'
    blocks of a step must form one consistent cut of the pipeline, which no transfer
    crosses."""
    epochs = _epochs(sched)
    for s, send, r, recv in _messages(sched):
        if epochs[s][send] != epochs[r][recv]:
            return s, send, r, recv
    return None


def cut_at_updates(sched: Schedule) -> Schedule:
    """Move each send that precedes the sender's update block of a step, but whose receive
    follows the receiver's block, to just after the sender's block, so that no transfer
    crosses the cut the blocks form (`crossing`). Only sends move, and only later: the
    receiver needed the data after its own block anyway, so the stage that waits is the
    one that already did, and no stage gains a wait at its block. A receive before a block
    whose send follows the sender's cannot be fixed that way: validation reports it."""
    epochs = _epochs(sched)
    late: list[dict[int, list[Action]]] = [{} for _ in sched.actions]  # stage -> block -> sends
    for s, send, r, recv in _messages(sched):
        if epochs[s][send] < epochs[r][recv]:
            late[s].setdefault(epochs[r][recv] - 1, []).append(send)
    out = []
    for s, acts in enumerate(sched.actions):
        if not late[s]:
            out.append(acts)
            continue
        moving = {a for sends in late[s].values() for a in sends}
        body = [a for a in acts if a not in moving]
        where = {a: i for i, a in enumerate(acts)}
        after = {body.index(Action(Op.OPT, t)): sorted(sends, key=where.__getitem__) for t, sends in late[s].items()}
        out.append(tuple(x for i, a in enumerate(body) for x in (a, *after.get(i, ()))))
    fixed = Schedule(sched.kind, sched.n_stages, sched.micro_batches, sched.steps, tuple(out))
    if (bad := crossing(fixed)) is not None:
        s, send, r, recv = bad
        raise ScheduleError(f"stage {s}'s {send} and stage {r}'s {recv} lie on different sides of an update: "
                            f"the updates do not form a consistent cut")
    return fixed


# ---------------------------------------------------------------- validation


def validate(sched: Schedule, global_update: bool = False, chained_update: bool = False) -> None:
    """Raise ScheduleError naming the first problem; return quietly if the schedule is sound.

    `global_update`: each OPT also waits for a figure from every stage that each stage has
    once the step's last backward ran (the global gradient norm of clipping and of the
    divergence guard). `chained_update`: each stage's OPT also waits for the previous
    stage's OPT of the step (an evaluation pass run right after the update, whose
    activations come from upstream). Both are checked by the transfers' progress rule."""
    d, m = sched.n_stages, sched.micro_batches
    if sched.kind not in KINDS:
        raise ScheduleError(f"unknown schedule {sched.kind!r}; choose from {', '.join(KINDS)}")
    if sched.kind == "2bw" and m < d:
        raise ScheduleError(
            f"2bw needs micro-batches per step >= pipeline depth (got {m} < {d}): "
            "otherwise a third weight version would be alive")
    if len(sched.actions) != d:
        raise ScheduleError(f"schedule declares {d} stages but lists actions for {len(sched.actions)}")
    for s, acts in enumerate(sched.actions):
        _check_stage(sched, s, acts)
    _check_transfers(sched, global_update, chained_update)


def _check_stage(sched: Schedule, s: int, acts: tuple[Action, ...]) -> None:
    d, m, n = sched.n_stages, sched.micro_batches, sched.steps
    where = f"stage {s}"
    seen: dict[Action, int] = {}
    for pos, a in enumerate(acts):
        if a in seen:
            raise ScheduleError(f"{where}: {a} appears twice")
        seen[a] = pos
    backward = (Op.I, Op.W) if sched.splits_backward else (Op.B,)
    expected = {Action(op, k) for k in range(n * m) for op in (Op.F, *backward)}
    expected |= {Action(op, t) for t in range(n) for op in (Op.AR, Op.OPT)}
    if s > 0:
        expected |= {Action(op, k) for k in range(n * m) for op in (Op.RF, Op.SB)}
    if s < d - 1:
        expected |= {Action(op, k) for k in range(n * m) for op in (Op.SF, Op.RB)}
    if missing := sorted(expected - seen.keys()):
        raise ScheduleError(f"{where}: missing {' '.join(map(str, missing[:5]))}")
    if extra := sorted(seen.keys() - expected):
        raise ScheduleError(f"{where}: unexpected {' '.join(map(str, extra[:5]))}")

    def before(a: Action, b: Action, why: str) -> None:
        if seen[a] > seen[b]:
            raise ScheduleError(f"{where}: {b} runs before {a}, but {why}")

    for k in range(n * m):
        t = k // m
        f = Action(Op.F, k)
        b = Action(backward[0], k)  # B, or the I of a split backward: what takes the output gradient
        end = Action(backward[-1], k)  # B, or the W: what completes the weight gradients
        before(f, b, "a backward needs its forward")
        if sched.splits_backward:
            before(b, end, "the weight gradients need the input gradient's pass")
        if s > 0:
            before(Action(Op.RF, k), f, "the forward needs its input activation")
            before(b, Action(Op.SB, k), "the input gradient comes from the backward")
        if s < d - 1:
            before(f, Action(Op.SF, k), "the activation comes from the forward")
            before(Action(Op.RB, k), b, "the backward needs its output gradient")
        before(end, Action(Op.AR, t), f"step {t}'s reduction needs all its gradients")
        if k % m != m - 1:
            last = Action(backward[-1], (t + 1) * m - 1)
            before(end, last, f"step {t}'s gradients are complete at its last micro-batch's {last.op.value}, "
                              "where its reduction starts")
        v = sched.version_of_step(t)
        if v >= 1:
            before(Action(Op.OPT, v - 1), f, f"step {t} computes on W({v}), which OPT{v - 1} produces")
    for t in range(n):
        before(Action(Op.AR, t), Action(Op.OPT, t), "the optimizer needs the reduced gradients")
        if t:
            before(Action(Op.OPT, t - 1), Action(Op.OPT, t), "updates apply in order")


def _check_transfers(sched: Schedule, global_update: bool = False, chained_update: bool = False) -> None:
    """Every send has its receive in the same order, and executing the lists with the
    runtime's semantics (a run of adjacent transfers is posted together and completes
    when each has a posted partner) makes progress to the end on every stage."""
    d, m = sched.n_stages, sched.micro_batches
    # Partner of a transfer: (direction key, position in that direction's FIFO).
    chans: dict[tuple[int, int, Op], list[int]] = {}
    for s, acts in enumerate(sched.actions):
        for a in acts:
            if a.op in (Op.SF, Op.RF, Op.SB, Op.RB):
                src, dst = transfer_ends(s, a.op)
                chans.setdefault((src, dst, a.op), []).append(a.index)
    for (src, dst, op), ks in chans.items():
        if op in (Op.SF, Op.SB):
            recv = Op.RF if op is Op.SF else Op.RB
            if chans.get((src, dst, recv), []) != ks:
                raise ScheduleError(
                    f"stage {src} sends {op.value} in order {ks[:6]} but stage {dst} receives "
                    f"{chans.get((src, dst, recv), [])[:6]}")

    runs = [_runs(acts) for acts in sched.actions]
    pc = [0] * d  # index into runs[s]
    posted: dict[tuple[int, int, Op], int] = {}  # channel -> how many of its ops are posted
    def key(s: int, a: Action) -> tuple[int, int, Op]:
        return (*transfer_ends(s, a.op), a.op)
    partner = {Op.SF: Op.RF, Op.RF: Op.SF, Op.SB: Op.RB, Op.RB: Op.SB}
    ordinal: list[dict[Action, int]] = []
    for s, acts in enumerate(sched.actions):
        count: dict[tuple, int] = {}
        ordi = {}
        for a in acts:
            if a.op.is_p2p:
                c = key(s, a)
                ordi[a] = count.get(c, 0)
                count[c] = ordi[a] + 1
        ordinal.append(ordi)
    is_posted = [False] * d
    backwards_done: dict[int, int] = {}  # step -> stages past its last backward
    updated: set[tuple[int, int]] = set()  # (stage, step) past its OPT
    progress = True
    while progress:
        progress = False
        for s in range(d):
            if pc[s] == len(runs[s]):
                continue
            run = runs[s][pc[s]]
            if run[0].op is Op.OPT:
                t = run[0].index
                if (global_update and backwards_done.get(t, 0) < d) or (chained_update and s > 0
                                                                        and (s - 1, t) not in updated):
                    continue
                updated.add((s, t))
            if not run[0].op.is_p2p:
                if run[0].op.ends_backward and (run[0].index + 1) % m == 0:
                    backwards_done[run[0].index // m] = backwards_done.get(run[0].index // m, 0) + 1
                pc[s] += 1
                progress = True
                continue
            if not is_posted[s]:
                for a in run:
                    c = key(s, a)
                    posted[c] = posted.get(c, 0) + 1
                is_posted[s] = progress = True
            done = all(posted.get((*transfer_ends(s, a.op), partner[a.op]), 0) > ordinal[s][a] for a in run)
            if done:
                pc[s] += 1
                is_posted[s] = False
                progress = True
    stuck = [s for s in range(d) if pc[s] < len(runs[s])]
    if stuck:
        desc = "; ".join(f"stage {s} waits at {' '.join(map(str, runs[s][pc[s]]))}" for s in stuck)
        raise ScheduleError(f"deadlock: {desc}")


def transfer_ends(stage: int, op: Op) -> tuple[int, int]:
    """(source stage, destination stage) of a transfer seen from `stage`."""
    return {
        Op.SF: (stage, stage + 1), Op.RF: (stage - 1, stage),
        Op.SB: (stage, stage - 1), Op.RB: (stage + 1, stage),
    }[op]


def peer_stage(stage: int, op: Op) -> int:
    """The stage on the other end of `stage`'s transfer `op`."""
    src, dst = transfer_ends(stage, op)
    return dst if src == stage else src



def _runs(acts: tuple[Action, ...]) -> list[list[Action]]:
    """Split into maximal groups of adjacent transfers; every other action is its own group."""
    out: list[list[Action]] = []
    for a in acts:
        if a.op.is_p2p and out and out[-1][0].op.is_p2p:
            out[-1].append(a)
        else:
            out.append([a])
    return out


def p2p_groups(acts: tuple[Action, ...] | list[Action]) -> list[list[Action]]:
    """The runtime's unit of execution: what `_runs` gives the validator."""
    return _runs(tuple(acts))
