"""The testbed's shared-core model as `trirace profile --contention` reads it
(trirace/calibrate/testbed_contention.py): which readings stand, the unit its curves
count in, and a byte's cost read against the windows around it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trirace.calibrate.testbed_contention import (Contention, in_unit, median_contention, per_byte_beside, plausible,
                                                  refusal, stalled)


def test_a_contention_reading_past_what_the_cores_can_do_is_refused():
    assert plausible([0.99, 1.83, 1.82, 1.68], cores=2)  # a reading two cores can give
    assert not plausible([0.95, 5.63, 5.47, 5.24], cores=2)  # the host busy while one ran alone: the unit too small
    assert plausible([1.0, 2.0, 2.9, 3.8], cores=4) and not plausible([1.0, 2.0, 3.6], cores=2)


def test_a_contention_reading_with_a_stalled_iteration_is_refused():
    # two readings of one calibration (k=1 shortened): three ranks on two cores alternate
    # between one core and half of one, which stands; four read 1.10 beside first
    # iterations four times their median, which does not
    one = [[0.23, 0.23, 0.22, 0.23, 0.25, 0.24]]
    three = [[0.38, 0.38, 0.39, 0.3, 0.39], [0.3, 0.39, 0.37, 0.25, 0.48], [0.46, 0.36, 0.51, 0.34, 0.26]]
    calm = Contention([0.97, 1.87, 1.78, 1.75], [0.02, 0.04, 0.15, 0.05], [], [one, [one[0]] * 2, three,
                      [[0.51, 0.47, 0.47, 0.51], [0.53, 0.52, 0.49, 0.52], [0.53, 0.47, 0.55, 0.5], [0.56, 0.53, 0.58]]])
    hiccup = replace(calm, throughput=[0.98, 1.82, 1.84, 1.10],
                     times=calm.times[:3] + [[[2.16, 0.52, 0.57, 0.51], [0.55, 0.57, 0.48, 0.54],
                                              [1.41, 0.55, 0.52, 0.53, 0.58], [2.27]]])
    assert stalled(calm) == [] and refusal(calm, cores=2) == ""
    assert stalled(hiccup) == [4] and "stalled at k=4" in refusal(hiccup, cores=2)
    busy = replace(calm, throughput=[0.95, 5.63, 5.47, 5.24])  # plausible's case comes first
    assert "more than k cores" in refusal(busy, cores=2)


def test_the_rounds_curves_count_in_the_calibrations_iteration_before_their_median():
    # two rounds, one whose lone process ran at 0.20 s, one at 0.25 s; the layers read 0.22 s.
    # Three processes did 3 / 0.30 and 3 / 0.33 iterations a second: in 0.22 s units, 2.2 and 2.0
    fast = Contention([1.0, 1.8, 2.0], [0.1, 0.2, 0.3], [300, 290, 280], best_s=0.20)
    slow = Contention([1.0, 1.9, 3 * 0.25 / 0.33], [0.3, 0.2, 0.1], [310, 300, 270], best_s=0.25)
    assert fast.in_unit(0.22).throughput == pytest.approx([1.1, 1.98, 2.2])
    got = median_contention([fast, slow], 0.22)
    assert got.best_s == 0.22
    assert got.throughput == pytest.approx([(1.1 + 0.88) / 2, (1.98 + 1.672) / 2, (2.2 + 2.0) / 2])
    assert got.spread == pytest.approx([0.2, 0.2, 0.2]) and got.wake_hz == [300, 290, 270]
    assert in_unit([2.0], 0.25, 0.22) == pytest.approx([1.76])


def _windows(work: list[list[float | None]], sent: float, messages: float) -> list[list[dict]]:
    """Per rank: windows alternating quiet and busy, each the work done per second given."""
    return [[{"work_per_s": w, "bytes_per_s": sent if i % 2 else 0.0, "messages_per_s": messages if i % 2 else 0.0}
             for i, w in enumerate(r)] for r in work]


def test_a_bytes_cost_is_read_against_the_quiet_windows_on_both_sides():
    # two ranks, 100 MB/s each; the host speeds up steadily over the five windows (quiet
    # 0.80 -> 0.84 -> 0.88 per rank) and each busy window loses 0.1 of work per rank
    work = [[0.80, 0.72, 0.84, 0.76, 0.88]] * 2
    got = per_byte_beside(_windows(work, 100e6, 0.0), per_message_s=0.0)
    assert got == pytest.approx([1e-9, 1e-9])  # 0.2 work-s/s over 200 MB/s (against the window before alone: 0.8 ns)
    # the messages' fixed cost comes off first: 1000 a second per rank at 50 us = 0.1 work-s/s
    assert per_byte_beside(_windows(work, 100e6, 1000.0), per_message_s=50e-6) == pytest.approx([0.5e-9] * 2)
    # a busy window beside a quiet one without a whole iteration is skipped; less lost than
    # the messages' cost reads 0
    holed = [[0.80, 0.72, None, 0.76, 0.88], [0.80, 0.72, 0.84, 0.76, 0.88]]
    assert per_byte_beside(_windows(holed, 100e6, 0.0), 0.0) == []
    assert per_byte_beside(_windows([[0.8, 0.8, 0.8]] * 2, 100e6, 1000.0), 50e-6) == [0.0]
