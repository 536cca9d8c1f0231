"""The trirace policy's pure decisions, replayed from recorded event sequences: gap filling,
a link busy only while bytes cross it, deadlines and slack override hold-back, and an order
replicas agree on whatever their timing. No processes: the stage driver gets events and
times, and what it launches is recorded."""

import dataclasses
import random

import pytest

from trirace.policy import make_policy
from trirace.policy.driver import StageDriver
from trirace.plan import Op, build_schedule

RATE = 1e6  # bytes/s on the inter-node link: a 100 kB activation crosses in 0.1 s
ACT = 100_000
CHUNK = 200_000  # 0.2 s of link per chunk (two replicas: a ring moves each chunk byte once)
NUMELS = [CHUNK // 4] * 8  # one chunk per parameter
SCHED = build_schedule("2bw", 2, 2, 4)  # stage 1: RF F B SB per micro-batch, two per step


def driver(policy="trirace", credit=2 * CHUNK):
    p = dataclasses.replace(make_policy(policy), partition_bytes=CHUNK, credit_bytes=credit)
    return StageDriver(p, NUMELS, "inter", SCHED.actions[1], reduces=True, micro_batches=2,
                       p2p_links={Op.RF: "inter", Op.SB: "inter"}, link_bytes_per_s={"inter": RATE, "intra": 1e9},
                       group_size=2)


def act(d, op, k):
    return next(a for a in SCHED.actions[1] if a.op is op and a.index == k)


def step0_timing(d, shift=10.0, history=(0.0, 12.7)):
    """Step 0's transfers as the runtime reports them, then step 1's first arrival `shift`
    later: receives at 1.0 and 2.0 (the engine waited), sends issued at 1.5 and 2.5.
    `history`: when the engine reached AR(-2) and AR(-1), so that AR0 is forecast (by
    default at 25.4, with slack to spare); without one nothing is held for gaps."""
    if history is not None:
        d.deadline(-2, history[0])
        d.deadline(-1, history[1])
    d.p2p_arrived(act(d, Op.RF, 0), "inter", ACT, 1.0, waited=True)
    d.p2p_sent(act(d, Op.SB, 0), "inter", ACT, 1.5)
    d.p2p_send_done("inter")  # gloo: complete once the bytes sit in a socket buffer
    d.p2p_arrived(act(d, Op.RF, 1), "inter", ACT, 2.0, waited=True)
    d.p2p_sent(act(d, Op.SB, 1), "inter", ACT, 2.5)
    d.p2p_send_done("inter")
    d.p2p_arrived(act(d, Op.RF, 2), "inter", ACT, 1.0 + shift, waited=True)


def ready_step(d, step):
    d.backward_begins(step)
    d.backward_ends(step)


def names(cs):
    return [c.name for c in cs]


def test_chunks_fill_the_gap_before_the_next_forecast_p2p():
    d = driver()
    step0_timing(d)  # SB2 is forecast at [11.5, 11.6], RF3 at [11.9, 12.0], SB3 at [12.5, 12.6]
    ready_step(d, 0)
    first = d.launches(11.05)
    assert names(first) == ["AR0.0", "AR0.1"]  # 0.4 MB crosses by 11.45, before SB2 at 11.5
    assert d.launches(11.05) == [] and d.wake_at() == pytest.approx(11.6)  # the third would collide
    for c in first:
        d.chunk_done(c)
    assert d.launches(11.45) == [] and d.wake_at() == pytest.approx(11.6)  # 50 ms left: no chunk fits
    d.p2p_sent(act(d, Op.SB, 2), "inter", ACT, 11.5)
    d.p2p_send_done("inter")
    assert names(d.launches(11.6)) == ["AR0.2"]  # 0.3 s to RF3: one chunk, not two
    assert d.wake_at() == pytest.approx(12.0)


def test_without_a_deadline_to_forecast_nothing_is_held_for_a_gap():
    # The first steps: held until the engine's own AR, a step's chunks could close a cycle
    # (another stage waiting at OPT for the global norm these chunks feed).
    d = driver()
    step0_timing(d, history=None)
    ready_step(d, 0)
    assert names(d.launches(11.45)) == ["AR0.0", "AR0.1"]  # 50 ms before SB2, up to the credit


def test_priority_ignores_the_forecast():
    d = driver("priority")
    step0_timing(d)
    ready_step(d, 0)
    assert names(d.launches(11.45)) == ["AR0.0", "AR0.1"]  # 50 ms before SB2: up to the credit anyway


def test_a_receive_waiting_for_upstream_compute_is_not_a_busy_link():
    d = driver()
    step0_timing(d)
    ready_step(d, 0)
    d.launches(11.05)
    for c in list(d.scheduler.in_flight):
        d.chunk_done(c)
    d.p2p_sent(act(d, Op.SB, 2), "inter", ACT, 11.5)
    d.p2p_send_done("inter")
    # RF3 was forecast at [11.9, 12.0]; at 12.2 the engine still waits for it: the upstream
    # is computing, nothing crosses, and 0.3 s remain before SB3 at 12.5: one chunk goes.
    assert names(d.launches(12.2)) == ["AR0.2"]


def test_a_send_in_flight_holds_chunks_and_a_late_send_is_imminent():
    d = driver()
    step0_timing(d)
    ready_step(d, 0)
    d.p2p_sent(act(d, Op.SB, 2), "inter", ACT, 11.05)  # issued, not yet complete
    assert d.launches(11.06) == []
    d.p2p_send_done("inter")
    assert d.launches(11.10) == [] and d.wake_at() == pytest.approx(11.15)  # its bytes still cross
    d.p2p_arrived(act(d, Op.RF, 3), "inter", ACT, 11.2, waited=False)  # was already there: no time learnt
    # SB3 was forecast at [12.5, 12.6]; at 12.7 it has not been issued: this stage is still
    # computing what it will send, so it counts as starting now.
    assert d.launches(12.7) == [] and d.wake_at() == pytest.approx(12.8)


def test_deadline_overrides_the_forecast():
    d = driver()
    step0_timing(d)
    ready_step(d, 0)
    d.launches(11.05)
    assert d.launches(11.47) == []
    d.deadline(0, 11.47)  # the engine waits at AR0: nothing of step 0 is held back
    assert len(d.launches(11.47)) == 0  # the credit (two chunks in flight) still bounds it
    for c in list(d.scheduler.in_flight):
        d.chunk_done(c)
    assert names(d.launches(11.48)) == ["AR0.2", "AR0.3"]


def test_no_slack_left_overrides_the_forecast():
    d = driver()
    step0_timing(d)
    d.deadline(-2, 0.0)
    d.deadline(-1, 2.0)  # AR(-2), AR(-1) two seconds apart: AR0 is due at 4.0
    ready_step(d, 0)
    # At 11.45 (50 ms before SB2) step 0 is past its forecast deadline: urgent, whatever
    # the forecast says.
    assert len(d.launches(11.45)) == 2
    d2 = driver()
    step0_timing(d2)
    d2.deadline(-2, 0.0)
    d2.deadline(-1, 12.7)  # AR0 due at 25.4: 1.6 s of chunks fit with room: the forecast holds
    ready_step(d2, 0)
    assert d2.launches(11.45) == []
    d3 = driver()
    step0_timing(d3)
    d3.deadline(-2, 10.0)
    d3.deadline(-1, 11.0)  # AR0 due at 12.0: 0.55 s left, 1.6 s of chunks: no slack, go now
    ready_step(d3, 0)
    assert len(d3.launches(11.45)) == 2


@pytest.mark.parametrize("seed", range(5))
def test_replicas_launch_in_one_order_whatever_their_timing(seed):
    """Two replicas see the same events at different times (and their forecasts differ):
    each launches a different number of chunks at each call, but the sequence is one."""
    rng = random.Random(seed)
    seqs = []
    for _ in range(2):
        d = driver(credit=rng.choice([CHUNK, 2 * CHUNK, 4 * CHUNK]))
        step0_timing(d, shift=rng.uniform(8, 12))
        out, t = [], 11.0
        for step in (0, 1):
            d.backward_begins(step)
            for lo in rng.sample(range(8), 8):  # parameters finish in an order of their own
                d.params_ready(step, lo, lo + 1)
                t += rng.uniform(0, 0.3)
                for c in d.launches(t):
                    out.append(c.name)
                    if rng.random() < 0.7:
                        d.chunk_done(c)
            d.backward_ends(step)
        d.deadline(1, t)
        while len(out) < 16:
            t += 0.1
            launched = d.launches(t)
            out += names(launched)
            for c in list(d.scheduler.in_flight):
                d.chunk_done(c)
        seqs.append(out)
    assert seqs[0] == seqs[1]
    assert seqs[0][:8] == [f"AR0.{i}" for i in range(8)]  # step 0's deadline comes first


def test_chunks_that_crossed_slower_than_the_link_end_the_wait_for_gaps_sooner():
    d = driver()
    step0_timing(d)
    d.deadline(-2, 0.0)
    d.deadline(-1, 6.6)  # AR0 due at 13.2
    ready_step(d, 0)
    first = d.launches(11.05)  # two 0.2 s chunks side by side...
    assert len(first) == 2
    assert d.launches(11.45) == []  # 6 chunks (1.2 s at the link rate) and 0.3 s of P2P fit before 13.2
    for c in first:
        d.chunk_done(c, 11.45)  # ...took 0.4 s: the link's rate
    assert d.scheduler.chunk_rate == pytest.approx(RATE) and d.launches(11.45) == []
    e = driver()
    step0_timing(e)
    e.deadline(-2, 0.0)
    e.deadline(-1, 6.6)
    ready_step(e, 0)
    for c in e.launches(11.05):
        e.chunk_done(c, 11.45 + 0.4)  # ...took 0.8 s: chunks got half the link
    assert e.scheduler.chunk_rate == pytest.approx(RATE / 2)
    assert len(e.launches(11.85)) == 2  # 6 chunks now need 2.4 s: no slack left, no waiting for gaps


def test_a_transfer_seen_out_of_order_is_not_forecast_again():
    d = driver()
    step0_timing(d)
    f = d.forecast
    d.p2p_sent(act(d, Op.SB, 2), "inter", ACT, 11.5)
    d.p2p_sent(act(d, Op.SB, 3), "inter", ACT, 12.5)  # seen before RF3: out of schedule order
    assert act(d, Op.RF, 3) == f.upcoming[0] and act(d, Op.SB, 3) in f.happened
    # SB3 counts once, as observed, not again as forecast from SB1 (also [12.5, 12.6])
    starts = [round(b.start, 6) for b in f.busy("inter", 12.45)]
    assert starts.count(12.5) == 1 and starts[0] == 12.5
    d.p2p_arrived(act(d, Op.RF, 3), "inter", ACT, 12.7, waited=True)
    assert not f.happened and f.upcoming[0] == act(d, Op.RF, 4)
