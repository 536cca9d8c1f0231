"""Where each policy launches a step's gradient chunks: a pure function of the action list,
the chunks, the agreed link rate and the agreed compute estimate, so every replica of a
stage places alike and NCCL sees one launch order on every member."""

import pytest

from trirace.plan import Action, Op
from trirace.plan.schedule import build_schedule, p2p_groups, schedule_for_policy
from trirace.plan.transfers import Kind, plan_reduction
from trirace.policy import make_policy
from trirace.policy.driver import ESTIMATE_LAG, StageDriver
from trirace.policy.launch_plan import gaps, place, slots
from trirace.policy.policies import MiB

M = 4  # micro-batches per step


def _units(stage: int, pp: int = 2, steps: int = 3, kind: str = "2bw"):
    sched = schedule_for_policy(build_schedule(kind, pp, M, steps), True, False)
    return sched.actions[stage], p2p_groups(sched.actions[stage])


def _bounds(units, step: int) -> tuple[int, int]:
    last_b = next(u for u, g in enumerate(units) if g[0] == Action(Op.B, (step + 1) * M - 1))
    ar = next(u for u, g in enumerate(units) if g[0] == Action(Op.AR, step))
    return last_b, ar


def _chunks(policy, mb: float = 1.0, numels=(MiB,) * 8, sparse=None):
    return plan_reduction(1, list(numels), int(mb * MiB) // 4, policy.chunk_order, sparse_param=sparse)


def test_slots_follow_the_last_backward_and_let_a_computations_sends_go_first():
    _, units = _units(1)
    first, ar = _bounds(units, 2)
    at = slots(units, first, ar)
    assert at[0] == first + 1 and units[first + 1][0].op is Op.SB  # B's send to stage 0, then chunks
    first, ar = _bounds(units, 1)  # B7's send waits past step 0's update (the cut): chunks right after B7
    at = slots(units, first, ar)
    assert units[first + 1][0].op is Op.AR and at[0] == first
    assert all(first <= u < ar for u in at)
    for u in at:  # never between a computation and the transfers it feeds
        assert units[u][0].op.is_p2p or u + 1 == len(units) or not units[u + 1][0].op.is_p2p


def test_fifo_launches_everything_in_the_first_slot():
    policy = make_policy("fifo", partition_mb=1)
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    cs = _chunks(policy)
    assert place(policy, units, first, ar, cs, lambda c: 1.0, None, lambda a: True) == \
        {slots(units, first, ar)[0]: cs}


@pytest.mark.parametrize("credit_mb", [1, 2, 3])
def test_priority_launches_a_credit_per_slot_in_forward_order(credit_mb):
    policy = make_policy("priority", partition_mb=1, credit_mb=credit_mb)
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    cs = _chunks(policy)
    assert [c.params[0] for c in cs] == sorted(c.params[0] for c in cs)  # front order
    placed = place(policy, units, first, ar, cs, lambda c: 1.0, None, lambda a: True)
    at = slots(units, first, ar)
    assert [c for u in sorted(placed) for c in placed[u]] == cs
    assert all(sum(c.nbytes for c in placed[u]) <= credit_mb * MiB for u in at[:-1] if u in placed)
    assert len(placed[at[0]]) == credit_mb


def test_a_chunk_larger_than_the_credit_still_goes_alone():
    policy = make_policy("priority", partition_mb=4, credit_mb=1)
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    placed = place(policy, units, first, ar, _chunks(policy, mb=4), lambda c: 1.0, None, lambda a: True)
    assert all(len(cs) == 1 for cs in placed.values())


def test_trirace_fills_the_gaps_between_transfers_on_its_link():
    """A slot's gap is the compute predicted until the next transfer run on the chunks'
    link; chunks go while they fit, in order, and whatever no gap takes goes in the last
    slot before AR."""
    policy = make_policy("trirace", partition_mb=1, credit_mb=2)
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    seconds = {Op.F: 1.0, Op.B: 2.0, Op.OPT: 0.5}
    at = slots(units, first, ar)
    room = gaps(units, at, ar, seconds, lambda a: True)
    assert room[0] == pytest.approx(1.0)  # after B7's slot comes F8, then SF8's run
    cs = _chunks(policy)
    each = sum(room) / len(cs) / 2  # they fit the gaps in all, not the first one alone
    assert each * len(cs) > room[0]
    placed = place(policy, units, first, ar, cs, lambda c: each, seconds, lambda a: True)
    assert [c for u in sorted(placed) for c in placed[u]] == cs
    assert len(placed) > 1
    for i, u in enumerate(at[:-1]):
        assert each * len(placed.get(u, [])) <= room[i] + 1e-9


def test_transfers_on_another_link_leave_the_gap_open():
    policy = make_policy("trirace", partition_mb=1, credit_mb=2)
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    seconds = {Op.F: 1.0, Op.B: 2.0}
    at = slots(units, first, ar)
    assert gaps(units, at, ar, seconds, lambda a: False)[0] == pytest.approx(
        sum(seconds.get(u[0].op, 0.0) for u in units[at[0] + 1:ar]))
    # no transfer on the chunks' link at all: nothing to yield to, everything goes at once
    cs = _chunks(policy)
    assert place(policy, units, first, ar, cs, lambda c: 0.4, seconds, lambda a: False) == {at[0]: cs}


def test_trirace_without_a_compute_estimate_holds_nothing_back():
    policy = make_policy("trirace", partition_mb=1, credit_mb=2)
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    cs = _chunks(policy)
    assert place(policy, units, first, ar, cs, lambda c: 0.4, None, lambda a: True) == \
        {slots(units, first, ar)[0]: cs}


def test_no_slack_left_launches_the_rest_at_once():
    policy = make_policy("trirace", partition_mb=1, credit_mb=2)
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    cs = _chunks(policy)
    placed = place(policy, units, first, ar, cs, lambda c: 10.0, {Op.F: 1.0, Op.B: 2.0}, lambda a: True)
    assert placed == {slots(units, first, ar)[0]: cs}  # 80 s of chunks, a few seconds of gaps


def test_the_sparse_table_is_never_held_for_a_gap():
    policy = make_policy("trirace", partition_mb=1, credit_mb=2)
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    cs = _chunks(policy, numels=(4 * MiB, MiB, MiB), sparse=0)
    sparse = next(c for c in cs if c.kind is Kind.SPARSE)
    assert cs[-1] is sparse  # ready order: the first layer's table finishes last
    placed = place(policy, units, first, ar, cs, lambda c: 0.9, {Op.F: 1.0, Op.B: 2.0}, lambda a: True)
    assert sparse in [c for cs_ in placed.values() for c in cs_]


def test_blocking_places_nothing():
    policy = make_policy("blocking")
    _, units = _units(0)
    first, ar = _bounds(units, 1)
    assert place(policy, units, first, ar, _chunks(make_policy("fifo", 1)), lambda c: 1.0, None,
                 lambda a: True) == {}


def test_the_driver_places_with_the_estimate_every_rank_has_by_then():
    """A step's chunks use the compute figures of a step ESTIMATE_LAG older (the metrics
    all-reduce delivers them to every rank before that step's last backward): a newer
    figure, which a slower replica might not have yet, never changes the placement."""
    policy = make_policy("trirace", partition_mb=1, credit_mb=2)
    actions, units = _units(0, steps=8)
    step = 6
    first, _ = _bounds(units, step)
    placements = []
    for newest in (step - ESTIMATE_LAG, step - 1):
        d = StageDriver(policy, [MiB] * 8, "intra", actions, reduces=True, p2p_links={Op.SF: "intra", Op.RB: "intra"},
                        link_bytes_per_s={"intra": 5 * MiB})
        d.observe_compute(step - ESTIMATE_LAG, {Op.F: 1.0, Op.B: 2.0, Op.OPT: 0.1})
        if newest > step - ESTIMATE_LAG:
            d.observe_compute(newest, {Op.F: 100.0, Op.B: 200.0, Op.OPT: 10.0})
        d.backward_begins(step, first)
        placements.append([d.launches_after(u) for u in range(first, len(units))])
    assert placements[0] == placements[1]
    assert sum(len(x) > 0 for x in placements[0]) > 1  # the gaps spread the chunks


def test_chunks_cover_the_flat_gradient_exactly():
    numels = [7, 1, 300, 12, 5]
    for elems in (None, 1, 4, 64, 1000):
        for order in ("ready", "front"):
            cs = plan_reduction(3, numels, elems, order)
            spans = sorted((c.start, c.stop) for c in cs)
            assert spans[0][0] == 0 and spans[-1][1] == sum(numels)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            assert [c.seq for c in cs] == list(range(len(cs)))
            offsets = [0, 7, 8, 308, 320, 325]
            for c in cs:  # the parameters a chunk waits for are exactly those it overlaps
                touched = [i for i in range(5) if offsets[i] < c.stop and offsets[i + 1] > c.start]
                assert (c.params[0], c.params[1]) == (touched[0], touched[-1] + 1)
