"""Ordering decisions of the communication policies, driven by a recording executor: the
pure scheduler gets events and its launches are recorded, with no processes involved."""

import pytest

from trirace.policy import CommScheduler, make_policy
from trirace.policy.policies import MiB
from trirace.plan.transfers import plan_reduction


class Recorder:
    """Plays the executor's role: turns events into scheduler calls and logs what launches.
    The log holds only what the scheduler launched, never the recorder's own events."""

    def __init__(self, policy):
        self.s = CommScheduler(policy)
        self.log: list[str] = []

    def pump(self):
        for c in self.s.launches():
            self.log.append(c.name)
        return self

    def chunks(self, step, numels, mb):
        cs = plan_reduction(step, numels, int(mb * MiB) // 4, self.s.policy.chunk_order)
        self.s.enqueue(cs)
        return cs

    def ready_all(self, cs):
        for c in cs:
            self.s.ready(c)
        return self.pump()

    def p2p(self):
        self.s.p2p_started()
        return self.pump()

    def p2p_done(self):
        self.s.p2p_finished()
        return self.pump()

    def finish(self, name):
        c = next(c for c in self.s.in_flight if c.name == name)
        self.s.finished(c)
        return self.pump()


NUMELS = [MiB] * 8  # 8 parameters of 4 MiB each


def test_ready_p2p_overtakes_queued_allreduce_chunks_under_trirace():
    r = Recorder(make_policy("trirace", partition_mb=2, credit_mb=4))
    cs = r.chunks(0, NUMELS, 2)
    r.s.p2p_started()  # a stage waits on a P2P transfer: queued chunks are held back
    r.ready_all(cs)
    assert r.log == []
    r.p2p()
    assert r.log == [] and len(r.s.order) == len(cs)  # a second P2P starts; every chunk is still queued
    r.p2p_done()
    assert r.log == []  # one P2P is still in flight
    r.p2p_done()
    assert r.log == ["AR0.0", "AR0.1"]  # links quiet: chunks up to the 4 MiB credit
    r.p2p()
    r.finish("AR0.0")
    assert r.log == ["AR0.0", "AR0.1"]  # credit freed, but nothing new starts behind the P2P
    r.p2p_done()
    assert r.log == ["AR0.0", "AR0.1", "AR0.2"]


def test_p2p_gets_no_special_treatment_under_priority():
    r = Recorder(make_policy("priority", partition_mb=2, credit_mb=4))
    cs = r.chunks(0, NUMELS, 2)
    r.s.p2p_started()
    r.ready_all(cs)
    assert r.log == ["AR0.0", "AR0.1"]  # launched despite the P2P in flight


def test_deadline_overrides_hold_back():
    r = Recorder(make_policy("trirace", partition_mb=2, credit_mb=4))
    cs = r.chunks(0, NUMELS, 2)
    r.s.p2p_started()
    r.ready_all(cs)
    assert r.log == []
    r.s.deadline(0)  # the engine now waits for step 0: the P2P no longer holds it back
    assert r.pump().log == ["AR0.0", "AR0.1"]


def test_chunks_leave_in_deadline_order():
    """Step 1's chunks are ready first, but step 0's deadline is earlier: step 0 goes first."""
    r = Recorder(make_policy("trirace", partition_mb=8, credit_mb=8))
    c0 = r.chunks(0, NUMELS, 8)
    c1 = r.chunks(1, NUMELS, 8)
    r.ready_all(c1)
    assert r.log == []  # the head of the agreed order (step 0) is not ready: nothing jumps it
    r.ready_all(c0)
    for _ in range(len(c0) + len(c1) - 1):
        r.finish(r.log[-1])
    assert r.log == [c.name for c in c0] + [c.name for c in c1]


@pytest.mark.parametrize("policy, order", [("fifo", "backward"), ("priority", "forward"), ("trirace", "backward")])
def test_chunk_order_per_policy(policy, order):
    cs = plan_reduction(0, NUMELS, MiB, make_policy(policy).chunk_order)
    starts = [c.start for c in cs]
    assert starts == sorted(starts, reverse=(order == "backward"))


@pytest.mark.parametrize("credit_mb", [2, 4, 6, 16])
def test_credit_bounds_bytes_in_flight(credit_mb):
    r = Recorder(make_policy("priority", partition_mb=2, credit_mb=credit_mb))
    cs = r.chunks(0, NUMELS, 2)
    r.ready_all(cs)
    peak = 0
    while r.s.in_flight or r.s.order:
        peak = max(peak, r.s.now().chunk_bytes)
        assert r.s.now().chunk_bytes <= credit_mb * MiB
        oldest = min(r.s.in_flight, key=lambda c: c.seq)
        r.finish(oldest.name)
    assert peak == min(credit_mb, 32) // 2 * 2 * MiB
    assert r.log == [c.name for c in cs]


def test_a_chunk_larger_than_the_credit_still_goes_alone():
    r = Recorder(make_policy("priority", partition_mb=8, credit_mb=1))
    cs = r.chunks(0, NUMELS, 8)
    r.ready_all(cs)
    assert r.log == ["AR0.0"]
    r.finish("AR0.0")
    assert r.log == ["AR0.0", "AR0.1"]


def test_launches_never_skip_an_unready_head():
    """Skipping would let replicas that see readiness in another order disagree."""
    r = Recorder(make_policy("fifo", partition_mb=4))
    cs = r.chunks(0, NUMELS, 4)
    r.ready_all(cs[1:])
    assert r.log == []
    r.ready_all(cs[:1])
    assert r.log == [c.name for c in cs]


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
