"""Schedule IR: builders, string form and the validator (pure, no torch)."""

from __future__ import annotations

import functools
import itertools

import pytest

from trirace.errors import UsageError
from trirace.plan import KINDS, Action, Op, Schedule, ScheduleError, validate
from trirace.plan import build_schedule as _build_schedule
from trirace.plan.schedule import _check_stage

# ---------------------------------------------------------------- helpers

GRID = [
    (kind, d, m, n)
    for kind in KINDS
    for d in range(1, 6)
    for m in range(1, 7)
    for n in range(1, 4)
    if not (kind == "2bw" and m < d)
]


@functools.lru_cache(maxsize=None)
def build_schedule(kind: str, d: int, m: int, n: int) -> Schedule:
    """Schedules are frozen values; build each once per test session (keeps the file fast)."""
    return _build_schedule(kind, d, m, n)


def acts(text: str) -> tuple[Action, ...]:
    return tuple(Action.parse(a) for a in text.split())


def row(sched: Schedule, s: int) -> str:
    return " ".join(map(str, sched.actions[s]))


def with_rows(sched: Schedule, **rows: str) -> Schedule:
    """Copy of `sched` with some stages' action lists replaced, e.g. s1="RF0 F0 ..."."""
    actions = list(sched.actions)
    for key, text in rows.items():
        actions[int(key[1:])] = acts(text)
    return Schedule(sched.kind, sched.n_stages, sched.micro_batches, sched.steps, tuple(actions))


def compute(sched: Schedule, s: int) -> list[Action]:
    return [a for a in sched.actions[s] if a.op.is_compute]


def pos(sched: Schedule, s: int) -> dict[Action, int]:
    return {a: i for i, a in enumerate(sched.actions[s])}


def peak_in_flight(sched: Schedule, s: int) -> int:
    """Most micro-batches whose forward has run and whose backward has not."""
    live = peak = 0
    for a in sched.actions[s]:
        if a.op is Op.F:
            live += 1
            peak = max(peak, live)
        elif a.op.ends_backward:  # B, or W: activations are held until the weight gradients
            live -= 1
    assert live == 0
    return peak


def rejects(sched: Schedule, *fragments: str) -> str:
    with pytest.raises(ScheduleError) as info:
        validate(sched)
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


# ---------------------------------------------------------------- building over a grid


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_builds_and_validates_over_grid(kind):
    count = 0
    for k, d, m, n in GRID:
        if k != kind:
            continue
        s = build_schedule(kind, d, m, n)
        assert (s.kind, s.n_stages, s.micro_batches, s.steps) == (kind, d, m, n)
        assert len(s.actions) == d
        validate(s)  # quietly
        for st in range(d):
            ops = [a.op for a in s.actions[st]]
            backward = (Op.I, Op.W) if s.splits_backward else (Op.B,)
            assert all(ops.count(op) == n * m for op in (Op.F, *backward))
            assert not {Op.B, Op.I, Op.W} - set(backward) & set(ops)
            assert ops.count(Op.AR) == ops.count(Op.OPT) == n
            assert ops.count(Op.RF) == ops.count(Op.SB) == (n * m if st > 0 else 0)
            assert ops.count(Op.SF) == ops.count(Op.RB) == (n * m if st < d - 1 else 0)
        count += 1
    # 5 depths x 6 micro-batch counts x 3 step counts; 2bw only where m >= d (20 of the 30 pairs)
    assert count == (60 if kind == "2bw" else 90)


@pytest.mark.parametrize("d,m", [(2, 1), (3, 2), (5, 4)])
def test_2bw_with_fewer_micro_batches_than_stages_does_not_build(d, m):
    with pytest.raises(ScheduleError, match="micro-batches per step >= pipeline depth"):
        build_schedule("2bw", d, m, 2)


@pytest.mark.parametrize("args", [(0, 2, 1), (2, 0, 1), (2, 2, 0), (-1, 1, 1)])
def test_build_rejects_non_positive_sizes(args):
    with pytest.raises(ScheduleError, match="at least 1"):
        build_schedule("1f1b", *args)


def test_build_rejects_unknown_kind():
    with pytest.raises(ScheduleError, match="unknown schedule 'zb'"):
        build_schedule("zb", 2, 2, 1)


def test_schedule_error_is_a_usage_error():
    assert issubclass(ScheduleError, UsageError)


# ---------------------------------------------------------------- exact small cases (worked by hand)


def test_1f1b_two_stages_two_micro_batches_exact():
    # stage 0: warm-up min(2-0-1, 2) = 1 forward, then F1 B0, then drain B1.
    # stage 1: no warm-up: F0 B0 F1 B1. Receives right before, sends right after.
    s = build_schedule("1f1b", 2, 2, 1)
    assert row(s, 0) == "F0 SF0 F1 SF1 RB0 B0 RB1 B1 AR0 OPT0"
    assert row(s, 1) == "RF0 F0 B0 SB0 RF1 F1 B1 SB1 AR0 OPT0"


def test_gpipe_two_stages_two_micro_batches_exact():
    s = build_schedule("gpipe", 2, 2, 1)
    assert row(s, 0) == "F0 SF0 F1 SF1 RB0 B0 RB1 B1 AR0 OPT0"
    assert row(s, 1) == "RF0 F0 RF1 F1 B0 SB0 B1 SB1 AR0 OPT0"


def test_1f1b_three_stages_exact():
    s = build_schedule("1f1b", 3, 3, 1)
    # warm-ups 2, 1, 0
    assert [" ".join(map(str, compute(s, st))) for st in range(3)] == [
        "F0 F1 F2 B0 B1 B2",
        "F0 F1 B0 F2 B1 B2",
        "F0 B0 F1 B1 F2 B2",
    ]
    assert row(s, 1) == "RF0 F0 SF0 RF1 F1 SF1 RB0 B0 SB0 RF2 F2 SF2 RB1 B1 SB1 RB2 B2 SB2 AR0 OPT0"


def test_2bw_two_stages_two_steps_exact():
    # One 1F1B stream over micro-batches 0..3; OPT0 follows B1 and F2 (step 1) precedes it on stage 0.
    s = build_schedule("2bw", 2, 2, 2)
    assert row(s, 0) == "F0 SF0 F1 SF1 RB0 B0 F2 SF2 RB1 B1 AR0 OPT0 F3 SF3 RB2 B2 RB3 B3 AR1 OPT1"
    assert row(s, 1) == "RF0 F0 B0 SB0 RF1 F1 B1 SB1 AR0 OPT0 RF2 F2 B2 SB2 RF3 F3 B3 SB3 AR1 OPT1"


def test_single_stage_has_no_transfers():
    for kind in KINDS:
        s = build_schedule(kind, 1, 2, 2)
        assert not any(a.op.is_p2p for a in s.actions[0])
    assert row(build_schedule("1f1b", 1, 2, 2), 0) == "F0 B0 F1 B1 AR0 OPT0 F2 B2 F3 B3 AR1 OPT1"


# ---------------------------------------------------------------- string form


def test_str_parse_round_trip_over_grid():
    for kind, d, m, n in GRID[::3]:
        s = build_schedule(kind, d, m, n)
        text = str(s)
        assert text.splitlines()[0] == f"{kind} stages={d} micro_batches={m} steps={n}"
        back = Schedule.parse(text)
        assert back == s
        assert str(back) == text


def test_parse_tolerates_blank_lines_and_padding():
    s = build_schedule("1f1b", 3, 3, 2)
    text = "\n\n" + "\n\n".join("  " + ln + "  " for ln in str(s).splitlines()) + "\n\n"
    assert Schedule.parse(text) == s


@pytest.mark.parametrize("a", [Action(op, k) for op in Op for k in (0, 7, 123)])
def test_action_round_trip(a):
    assert Action.parse(str(a)) == a


def test_action_parse_values():
    assert Action.parse("SF3") == Action(Op.SF, 3)
    assert Action.parse("OPT12") == Action(Op.OPT, 12)
    assert Action.parse("RB0") == Action(Op.RB, 0)
    assert Action.parse(" B4 ") == Action(Op.B, 4)


@pytest.mark.parametrize("junk", [
    "", " ", "F", "3", "X3", "f3", "F-1", "F+1", "F 3", "F3x", "3F", "FF3", "SFB3", "OPT", "F3.0",
    "F3,", "S3", "OP1", "AR", "F3 B4", "sf3",
])
def test_action_parse_rejects_junk(junk):
    with pytest.raises(ScheduleError, match="not an action"):
        Action.parse(junk)


@pytest.mark.parametrize("text", [
    "",
    "1f1b stages=2 micro_batches=2",  # missing steps
    "1f1b stages=two micro_batches=2 steps=1\nstage 0: F0",
    "1f1b stages micro_batches=2 steps=1",
    "1f1b stages=1 micro_batches=1 steps=1\nF0 B0 AR0 OPT0",  # no "stage N:" prefix
])
def test_schedule_parse_rejects_malformed_text(text):
    with pytest.raises(ScheduleError):
        Schedule.parse(text)


def test_schedule_parse_rejects_stage_count_mismatch():
    text = str(build_schedule("1f1b", 2, 2, 1)).replace("stages=2", "stages=3")
    with pytest.raises(ScheduleError, match="declares 3 stages but lists 2"):
        Schedule.parse(text)


def test_schedule_parse_rejects_bad_action():
    text = str(build_schedule("1f1b", 2, 2, 1)).replace("SF1", "XF1")
    with pytest.raises(ScheduleError, match="not an action: 'XF1'"):
        Schedule.parse(text)


# ---------------------------------------------------------------- structural properties


def test_transfers_sit_right_next_to_their_computation():
    for kind, d, m, n in GRID[::2]:
        s = build_schedule(kind, d, m, n)
        for st in range(d):
            a = s.actions[st]
            for i, x in enumerate(a):
                if x.op is Op.F:
                    if st > 0:
                        assert a[i - 1] == Action(Op.RF, x.index)
                    if st < d - 1:
                        assert a[i + 1] == Action(Op.SF, x.index)
                elif x.op is Op.B:
                    if st < d - 1:
                        assert a[i - 1] == Action(Op.RB, x.index)
                    if st > 0:
                        assert a[i + 1] == Action(Op.SB, x.index)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_flushing_kinds_start_no_work_of_step_t_plus_1_before_opt_t(kind):
    for k, d, m, n in GRID:
        if k != kind or n < 2:
            continue
        s = build_schedule(kind, d, m, n)
        for st in range(d):
            p = pos(s, st)
            for t in range(n - 1):
                opt = p[Action(Op.OPT, t)]
                for x in s.actions[st]:
                    if x.op not in (Op.AR, Op.OPT) and s.step_of(x.index) == t + 1:
                        assert p[x] > opt, (kind, d, m, n, st, x)
                # and step t is completely finished before OPT t
                for x in s.actions[st]:
                    if x.op not in (Op.AR, Op.OPT) and s.step_of(x.index) == t:
                        assert p[x] < opt


def test_2bw_does_not_flush():
    checked = 0
    for k, d, m, n in GRID:
        if k != "2bw" or d < 2 or n < 2:
            continue
        s = build_schedule("2bw", d, m, n)
        p = pos(s, 0)
        for t in range(n - 1):
            first_next = p[Action(Op.F, (t + 1) * m)]
            assert first_next < p[Action(Op.OPT, t)], (d, m, n, t)
            # the pipeline stays full across the boundary: d - 1 forwards ahead on stage 0
            ahead = sum(1 for x in s.actions[0][: p[Action(Op.OPT, t)]]
                        if x.op is Op.F and s.step_of(x.index) == t + 1)
            assert ahead == d - 1
        checked += 1
    assert checked > 10


def test_2bw_warms_up_only_once():
    for k, d, m, n in GRID:
        if k != "2bw":
            continue
        s = build_schedule("2bw", d, m, n)
        for st in range(d):
            ops = [a.op for a in compute(s, st)]
            first_b = ops.index(Op.B)
            assert first_b == min(d - st, n * m)  # warm-up + the first steady forward
            after = ops[first_b:]
            # after the first backward, never two forwards in a row: no second warm-up
            assert not any(a is Op.F and b is Op.F for a, b in zip(after, after[1:])), (d, m, n, st)


def test_1f1b_warms_up_every_step_unlike_2bw():
    d, m, n = 3, 3, 3
    f1b = build_schedule("1f1b", d, m, n)
    bw = build_schedule("2bw", d, m, n)

    def ff_pairs(s, st):
        ops = [a.op for a in compute(s, st)]
        return sum(1 for a, b in zip(ops, ops[1:]) if a is Op.F and b is Op.F)

    # stage 0 of 1f1b: a warm-up of d-1 = 2 forwards every step -> 2 F-F pairs per step
    assert ff_pairs(f1b, 0) == n * (d - 1)
    assert ff_pairs(bw, 0) == d - 1


def test_in_flight_micro_batches():
    for kind, d, m, n in GRID:
        s = build_schedule(kind, d, m, n)
        for st in range(d):
            peak = peak_in_flight(s, st)
            if kind == "gpipe":
                assert peak == m
            elif kind == "1f1b":
                assert peak <= d - st
                assert peak == min(d - st, m)
            elif kind == "zb-h1":  # W's deferred, never past 1F1B's peak (its first stage's)
                assert min(d - st, m) <= peak <= min(d, m)
            else:
                assert peak <= d - st
                assert peak == min(d - st, n * m)


def test_compute_runs_micro_batches_in_order():
    for kind, d, m, n in GRID[::2]:
        s = build_schedule(kind, d, m, n)
        for st in range(d):
            for op in (Op.F, Op.B, Op.I, Op.W):
                ks = [a.index for a in s.actions[st] if a.op is op]
                if op in ((Op.B,) if s.splits_backward else (Op.I, Op.W)):
                    assert ks == []
                    continue
                assert ks == list(range(n * m))


def test_version_bookkeeping():
    assert build_schedule("1f1b", 2, 2, 3).staleness == 0
    assert build_schedule("gpipe", 2, 2, 3).staleness == 0
    s = build_schedule("2bw", 2, 2, 3)
    assert s.staleness == 1
    assert [s.version_of_step(t) for t in range(3)] == [-1, 0, 1]
    assert [s.step_of(k) for k in range(6)] == [0, 0, 1, 1, 2, 2]


# ---------------------------------------------------------------- validator rejections


def test_validator_rejects_missing_receive():
    s = build_schedule("1f1b", 2, 2, 1)
    bad = with_rows(s, s1=row(s, 1).replace("RF1 ", ""))
    rejects(bad, "stage 1", "missing RF1")


def test_validator_rejects_missing_update():
    s = build_schedule("gpipe", 2, 2, 2)
    bad = with_rows(s, s0=row(s, 0).replace(" OPT1", ""))
    rejects(bad, "stage 0", "missing OPT1")


def test_validator_rejects_duplicate_action():
    s = build_schedule("1f1b", 2, 2, 1)
    bad = with_rows(s, s0=row(s, 0) + " F0")
    rejects(bad, "stage 0", "F0 appears twice")


def test_validator_rejects_unexpected_action():
    s = build_schedule("1f1b", 2, 2, 1)
    rejects(with_rows(s, s0=row(s, 0) + " F9"), "stage 0", "unexpected F9")
    # the first stage has nobody to receive activations from
    rejects(with_rows(s, s0="RF0 " + row(s, 0)), "stage 0", "unexpected RF0")
    # and the last stage nobody to send them to
    rejects(with_rows(s, s1=row(s, 1) + " SF0"), "stage 1", "unexpected SF0")


def test_validator_rejects_backward_before_forward():
    s = build_schedule("1f1b", 2, 2, 1)
    bad = with_rows(s, s1="RF0 B0 F0 SB0 RF1 F1 B1 SB1 AR0 OPT0")
    rejects(bad, "stage 1", "B0 runs before F0", "a backward needs its forward")


def test_validator_rejects_forward_before_its_receive():
    s = build_schedule("1f1b", 2, 2, 1)
    bad = with_rows(s, s1="F0 RF0 B0 SB0 RF1 F1 B1 SB1 AR0 OPT0")
    rejects(bad, "stage 1", "F0 runs before RF0", "input activation")


def test_validator_rejects_send_before_compute():
    s = build_schedule("1f1b", 2, 2, 1)
    rejects(with_rows(s, s0="SF0 F0 F1 SF1 RB0 B0 RB1 B1 AR0 OPT0"), "SF0 runs before F0")
    rejects(with_rows(s, s1="RF0 F0 SB0 B0 RF1 F1 B1 SB1 AR0 OPT0"), "SB0 runs before B0")


def test_validator_rejects_update_before_reduction_and_reduction_before_backward():
    s = build_schedule("1f1b", 2, 2, 1)
    rejects(with_rows(s, s1=row(s, 1).replace("AR0 OPT0", "OPT0 AR0")), "OPT0 runs before AR0",
            "optimizer needs the reduced gradients")
    rejects(with_rows(s, s0="F0 SF0 F1 SF1 RB0 B0 AR0 RB1 B1 OPT0"), "AR0 runs before B1")


def test_validator_rejects_2bw_with_fewer_micro_batches_than_stages():
    base = build_schedule("1f1b", 3, 2, 1)
    validate(base)
    bad = Schedule("2bw", 3, 2, 1, base.actions)
    rejects(bad, "2bw needs micro-batches per step >= pipeline depth", "2 < 3")


def test_validator_rejects_receives_in_a_different_order_than_sends():
    s = build_schedule("gpipe", 2, 2, 1)
    # locally fine (each RF before its F) but activations 0, 1 arrive as 1, 0
    bad = with_rows(s, s1="RF1 RF0 F0 F1 B0 SB0 B1 SB1 AR0 OPT0")
    for st in range(2):  # no local problem: it is the channel order that is wrong
        _check_stage(bad, st, bad.actions[st])
    rejects(bad, "stage 0 sends SF in order [0, 1]", "stage 1 receives [1, 0]")


def test_validator_rejects_gradients_in_a_different_order():
    s = build_schedule("gpipe", 2, 2, 1)
    bad = with_rows(s, s1="RF0 F0 RF1 F1 B0 B1 SB1 SB0 AR0 OPT0")
    rejects(bad, "stage 1 sends SB in order [1, 0]", "stage 0 receives [0, 1]")


def test_validator_detects_deadlock():
    s = build_schedule("1f1b", 2, 2, 1)
    # Stage 0 waits for gradient 0 before it sends activation 1; stage 1 waits for
    # activation 1 before it sends gradient 0. Every list is locally sound and both
    # channels are in FIFO order, but the two blocking runs wait on each other.
    bad = with_rows(
        s,
        s0="F0 SF0 F1 RB0 B0 SF1 RB1 B1 AR0 OPT0",
        s1="RF0 F0 RF1 B0 SB0 F1 B1 SB1 AR0 OPT0",
    )
    msg = rejects(bad, "deadlock")
    assert "stage 0 waits at RB0" in msg
    assert "stage 1 waits at RF1" in msg


def test_validator_detects_deadlock_between_middle_stages():
    s = build_schedule("1f1b", 3, 2, 1)
    validate(s)
    bad = with_rows(
        s,
        s1="RF0 F0 SF0 RF1 F1 RB0 B0 SB0 SF1 RB1 B1 SB1 AR0 OPT0",
        s2="RF0 F0 RF1 B0 SB0 F1 B1 SB1 AR0 OPT0",
    )
    msg = rejects(bad, "deadlock")
    assert "stage 1 waits at RB0" in msg and "stage 2 waits at RF1" in msg


def test_validator_accepts_crossing_transfers_posted_as_one_group():
    # 1F1B's crossing runs "SF1 RB0" (stage 0) and "SB0 RF1" (stage 1) are each posted as one
    # group; the validator must accept them (one-at-a-time blocking would deadlock here).
    s = build_schedule("1f1b", 2, 2, 1)
    assert "SF1 RB0" in row(s, 0) and "SB0 RF1" in row(s, 1)
    validate(s)
    # the same transfers in the other order inside each group are equally fine
    validate(with_rows(s, s0=row(s, 0).replace("SF1 RB0", "RB0 SF1"),
                       s1=row(s, 1).replace("SB0 RF1", "RF1 SB0")))


def test_validator_rejects_1f1b_forward_of_next_step_before_update():
    s = build_schedule("1f1b", 2, 2, 2)
    r0 = row(s, 0)
    assert "B1 AR0 OPT0 F2 SF2" in r0
    bad = with_rows(s, s0=r0.replace("B1 AR0 OPT0 F2 SF2", "B1 F2 AR0 OPT0 SF2"))
    rejects(bad, "stage 0", "F2 runs before OPT0", "W(1)", "OPT0 produces")


def test_validator_rejects_2bw_forward_two_steps_ahead_of_update():
    s = build_schedule("2bw", 2, 2, 3)
    r0 = row(s, 0)
    # F4 (step 2) computes on W(1), which OPT0 publishes; move it to the front
    assert " F4 " in r0
    bad = with_rows(s, s0="F4 " + r0.replace(" F4 ", " "))
    rejects(bad, "stage 0", "F4 runs before OPT0", "step 2 computes on W(1)")


def test_2bw_allows_next_step_forward_before_update_but_1f1b_does_not():
    bw = build_schedule("2bw", 2, 2, 2)
    assert row(bw, 0).index("F2") < row(bw, 0).index("OPT0")
    validate(bw)
    as_1f1b = Schedule("1f1b", 2, 2, 2, bw.actions)
    rejects(as_1f1b, "F2 runs before OPT0")


def test_validator_rejects_unknown_kind():
    s = build_schedule("1f1b", 2, 2, 1)
    rejects(Schedule("pipedream", 2, 2, 1, s.actions), "unknown schedule 'pipedream'")


def test_validator_rejects_updates_out_of_order():
    # 2bw on one stage: step 1 computes on W(0), so F1 may precede OPT0 - but OPT1 may not.
    s = build_schedule("2bw", 1, 1, 2)
    assert row(s, 0) == "F0 B0 AR0 OPT0 F1 B1 AR1 OPT1"
    validate(with_rows(s, s0="F0 B0 AR0 F1 B1 OPT0 AR1 OPT1"))
    rejects(with_rows(s, s0="F0 B0 AR0 F1 B1 AR1 OPT1 OPT0"), "OPT1 runs before OPT0", "updates apply in order")


def _depends(x: Action, y: Action, m: int) -> bool:
    """Does y (which runs right after x) directly depend on x in a 1f1b schedule?"""
    same = x.index == y.index
    pairs = {(Op.RF, Op.F), (Op.F, Op.SF), (Op.RB, Op.B), (Op.B, Op.SB), (Op.F, Op.B), (Op.AR, Op.OPT)}
    if same and (x.op, y.op) in pairs:
        return True
    if x.op is Op.B and y.op is Op.AR and x.index // m == y.index:
        return True
    if x.op is Op.OPT and y.op is Op.F and y.index // m == x.index + 1:
        return True
    return False


def test_adjacent_swaps_breaking_a_dependency_are_all_rejected():
    """Exhaustive over a 3-stage, 2-step 1f1b schedule: swapping an action with the one right
    after it that depends on it is always rejected; any swap is either accepted or rejected
    with a ScheduleError, never anything else."""
    d, m, n = 3, 3, 2
    s = build_schedule("1f1b", d, m, n)
    dependent = rejected_dependent = 0
    for st in range(d):
        a = list(s.actions[st])
        for i in range(len(a) - 1):
            b = a[:]
            b[i], b[i + 1] = b[i + 1], b[i]
            bad = Schedule("1f1b", d, m, n, s.actions[:st] + (tuple(b),) + s.actions[st + 1:])
            dep = _depends(a[i], a[i + 1], m)
            dependent += dep
            try:
                validate(bad)
            except ScheduleError:
                rejected_dependent += dep
            else:
                assert not dep, (st, a[i], a[i + 1])
    assert dependent > 30
    assert rejected_dependent == dependent


# ---------------------------------------------------------------- malformed Schedule objects


@pytest.mark.parametrize("n_stages", [1, 2])
def test_validator_rejects_missing_stage_rows(n_stages):
    rejects(Schedule("gpipe", n_stages, 1, 1, ()), f"declares {n_stages} stages")


def test_validator_rejects_row_count_mismatch():
    two = build_schedule("gpipe", 2, 1, 1)
    rejects(Schedule("gpipe", 2, 1, 1, two.actions[:1]), "declares 2 stages but lists actions for 1")
    three = build_schedule("gpipe", 3, 1, 1)
    rejects(Schedule("gpipe", 2, 1, 1, three.actions), "declares 2 stages but lists actions for 3")


def test_all_permutations_of_tiny_stage_are_judged_consistently():
    """Every permutation of a 1-stage, 1-step, 1-micro-batch schedule: exactly the canonical
    order F0 B0 AR0 OPT0 is valid."""
    base = acts("F0 B0 AR0 OPT0")
    valid = []
    for perm in itertools.permutations(base):
        try:
            validate(Schedule("1f1b", 1, 1, 1, (tuple(perm),)))
        except ScheduleError:
            continue
        valid.append(perm)
    assert valid == [base]


# ---------------------------------------------------------------- zero bubble (split backward)


def unit_makespan(sched: Schedule) -> int:
    """One step replayed with F, I and W one unit each (B two) and free transfers: when
    the last stage's last computation ends."""
    cost = {Op.F: 1, Op.B: 2, Op.I: 1, Op.W: 1}
    lists = [[a for a in acts_ if a.op.is_compute] for acts_ in sched.actions]
    d, done, pc, clock = sched.n_stages, {}, [0] * sched.n_stages, [0] * sched.n_stages
    while any(pc[s] < len(lists[s]) for s in range(d)):
        moved = False
        for s in range(d):
            while pc[s] < len(lists[s]):
                a = lists[s][pc[s]]
                dep = ((Op.F, s - 1, a.index) if a.op is Op.F and s > 0 else
                       (a.op, s + 1, a.index) if a.op.takes_output_grad and s < d - 1 else None)
                if dep is not None and dep not in done:
                    break
                clock[s] = max(clock[s], done.get(dep, 0)) + cost[a.op]
                done[a.op, s, a.index] = clock[s]
                pc[s] += 1
                moved = True
        assert moved, "the replay is stuck"
    return max(clock)


@pytest.mark.parametrize("d,m", [(2, 4), (3, 7), (4, 4), (4, 8), (8, 8), (8, 16), (8, 32)])
def test_zb_h1_shrinks_1f1b_bubble(d, m):
    """The bubble (makespan beyond the 3m units of work) is 1F1B's 3 (d - 1) there and at
    most d + 1 under ZB-H1 (d - 1 at m = d): the I's chain through the pipeline alone."""
    work = 3 * m
    zb, ofb = (unit_makespan(_build_schedule(k, d, m, 1)) - work for k in ("zb-h1", "1f1b"))
    assert ofb == 3 * (d - 1)
    assert zb <= (d - 1 if m == d else d + 1)


def test_zb_h1_exact_two_stages():
    s = build_schedule("zb-h1", 2, 2, 1)
    assert row(s, 0) == "F0 SF0 F1 SF1 RB0 I0 W0 RB1 I1 W1 AR0 OPT0"
    assert row(s, 1) == "RF0 F0 I0 SB0 RF1 F1 I1 SB1 W0 W1 AR0 OPT0"


def test_zb_h1_survives_every_policy_rewrite():
    """What a policy runs (updates at their deadline, receives a computation early) stays
    sound, and a receive posted early never lands in front of a W's own I."""
    from trirace.plan.schedule import schedule_for_policy
    for d, m in [(2, 4), (3, 5), (4, 8)]:
        s = schedule_for_policy(build_schedule("zb-h1", d, m, 3), True, False)
        validate(s, global_update=True, chained_update=True)


def test_validator_rejects_weight_gradients_before_input_gradients():
    s = build_schedule("zb-h1", 2, 2, 1)
    rejects(with_rows(s, s1="RF0 F0 W0 I0 SB0 RF1 F1 I1 SB1 W1 AR0 OPT0"),
            "stage 1", "W0 runs before I0", "weight gradients need the input gradient")


def test_validator_rejects_a_split_backward_in_a_schedule_that_does_not_split():
    s = build_schedule("1f1b", 2, 1, 1)
    rejects(with_rows(s, s1="RF0 F0 I0 SB0 W0 AR0 OPT0"), "stage 1", "missing B0")


def test_validator_rejects_a_step_whose_last_w_is_not_last():
    s = build_schedule("zb-h1", 2, 2, 1)
    rejects(with_rows(s, s1="RF0 F0 I0 SB0 RF1 F1 I1 SB1 W1 W0 AR0 OPT0"), "W1 runs before W0")
