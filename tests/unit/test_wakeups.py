"""Wake-ups of a process's other threads, counted from /proc, and the waker that stands in for them."""

import threading
import time

import pytest

from trirace.runtime.wakeups import Waker, others_wakeups

pytestmark = pytest.mark.skipif(others_wakeups(0) is None, reason="needs Linux's /proc")


def test_a_waker_wakes_about_as_often_as_asked_and_the_count_sees_it():
    me = threading.get_native_id()
    with Waker(400) as w:
        before = others_wakeups(me)
        time.sleep(0.5)
        seen = others_wakeups(me) - before
    assert 50 <= w.wakeups <= 220  # 200 due in the half second; late ones are skipped, never doubled
    assert w.wakeups - 5 <= seen <= w.wakeups + 100  # it blocked and was woken each time (more: other threads)


def test_a_waker_at_zero_starts_no_thread():
    me = threading.get_native_id()
    before = threading.active_count(), others_wakeups(me)
    with Waker(0) as w:
        assert threading.active_count() == before[0]
        time.sleep(0.1)
    assert w.wakeups == 0 and others_wakeups(me) - before[1] < 5


def test_a_slow_waker_stops_at_once():
    with Waker(0.01) as w:  # a period of 100 s
        time.sleep(0.05)
        t0 = time.perf_counter()
    assert time.perf_counter() - t0 < 1.0 and w.wakeups == 0


def test_core_time_split_by_kind_counts_a_busy_thread_as_user():
    from trirace.runtime.hostcpu import KINDS, host_cpu_s, shares

    before = host_cpu_s()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.4:  # one core busy in Python for 0.4 s
        pass
    got = shares(before, host_cpu_s())
    assert set(got) == set(KINDS) and sum(got.values()) == pytest.approx(1.0)
    assert got["user"] >= 0.25  # 0.4 core-seconds of the cores' 0.4 * cpu_count
    assert shares(None, before) is None and shares(before, before) is None  # no tick passed
