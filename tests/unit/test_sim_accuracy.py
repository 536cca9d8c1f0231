"""The simulator's accuracy report (trirace/bench/sim_accuracy.py) on saved measurements:
re-predicting them, its format, the order cells are measured in, the measured median's
interval, what the record says about each miss, the host re-measured at a cell."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from trirace.config import make_config
from trirace.sim.calibration import Calibration, load_calibration
from trirace.sim.cluster import load_cluster
from trirace.sim.simulate import simulate


def test_resimulate_predicts_saved_measurements_again_with_their_calibration(tmp_path):
    from trirace.bench import sim_accuracy

    saved, out = tmp_path / "saved", tmp_path / "again"
    saved.mkdir()
    Calibration("gpt-test", 2, 64, 1, [0.01] * 7, [0.02] * 7, 1e-9, "testbed", cpu_throughput=[0.9, 1.8],
                compute_spread=[0.02, 0.1], copy_draws_bytes_per_s=[6e9, 5e9, 7e9],
                transfer_cpu={"inter": {"per_message_s": 2e-4, "per_byte_s": 1e-9}}).save(saved / "cal.json")
    job = {"model": "gpt-test", "pp": 2, "dp": 1, "schedule": "2bw", "micro_batches": 2, "micro_batch_size": 2,
           "seq_len": 64, "steps": 6, "partition": [4, 3], "rank_order": "dp-inner", "seed": 0, "optimizer": "adam"}
    steps = [[0.48, 0.5, 0.52, 0.5], [0.45, 0.5, 0.55, 0.5], [0.5, 0.5, 0.49, 0.51]]
    measured = [{"system": p, "step_time_s": 0.5, "round_steps_s": [0.5, 0.5, 0.5], "exposed_p2p_s": 0.1,
                 "exposed_allreduce_s": 0.0, "cpu_s": cpu, "steps_s": steps}
                for p, cpu in (("blocking", [0.5, 0.4]), ("trirace", [0.6, 0.45]))]
    after = {"throughput": [0.95, 1.6], "spread": [0.03, 0.2], "unit_s": 0.225}  # the cores as the cell left them
    payload = {"version": sim_accuracy.VERSION, "rounds": 3, "steps": 6,
               "cells": [{"name": "2x1 @ 100mbit", "cluster": [2, 1, "100mbit"], "config": job,
                          "calibration": "cal.json", "measured": measured, "compute_s": [0.2, 0.25],
                          "copy_bytes_per_s": [5e9, 4e9], "contention_after": after}]}
    (saved / "accuracy.json").write_text(json.dumps(payload))
    assert sim_accuracy.main(["--resimulate", str(saved / "accuracy.json"), "--out", str(out)]) == 0
    again = json.loads((out / "accuracy.json").read_text())
    assert again["version"] == sim_accuracy.VERSION
    again = again["cells"][0]
    assert again["calibration"] == "cal.json" and (out / "cal.json").exists()  # travels with the results
    expect = simulate(make_config(job), load_cluster("testbed", 2, 1, "100mbit"), "trirace",
                      load_calibration(saved / "cal.json")).iteration_time_s
    folded = simulate(make_config(job), load_cluster("testbed", 2, 1, "100mbit"), "trirace",
                      load_calibration(saved / "cal.json"), unfold=False).iteration_time_s
    got = {r["policy"]: r for r in again["results"]}
    assert got["trirace"]["predicted_s"] == pytest.approx(expect)
    assert got["trirace"]["error"] == pytest.approx(expect / 0.5 - 1)
    assert got["trirace"]["folded_error"] == pytest.approx(folded / 0.5 - 1) and folded != expect
    md = (out / "accuracy.md").read_text()
    assert "| cal.json | 0.210 | 0.90 1.80 | 2% 10% | 0.20 / 1.00 | - |" in md and (out / "accuracy.png").stat().st_size > 0
    assert "With the replicas folded into one per stage: " in md
    # CPU per step beside each prediction: what the run's processes used and what the
    # simulator charged the shared cores
    charged = {r: sum(got[r]["predicted_cpu_s"].values()) for r in got}
    # m=2 micro-batches through the whole model a step, at 1/0.9 CPU per work (the steady window is 2 steps: its edges cut pipelined work)
    assert got["trirace"]["predicted_cpu_s"]["compute"] == pytest.approx(2 * 0.21 / 0.9, rel=0.1)
    assert f"| 1.05 / {charged['trirace']:.2f} |" in md and f"| 0.90 / {charged['blocking']:.2f} |" in md
    # the host re-measured at the cell: compute 0.225 s a micro-batch against the
    # calibration's 0.21, and the cores' contention as measured after the cell (in 0.225 s units)
    host = simulate(make_config(job), load_cluster("testbed", 2, 1, "100mbit"), "trirace",
                    replace(load_calibration(saved / "cal.json"), forward_s=[0.01 * 0.225 / 0.21] * 7,
                            backward_s=[0.02 * 0.225 / 0.21] * 7, cpu_throughput=after["throughput"],
                            compute_spread=after["spread"])).iteration_time_s
    assert got["trirace"]["host_compute_error"] == pytest.approx(host / 0.5 - 1)
    assert got["blocking"]["host_compute"] == pytest.approx(0.225 / 0.21)
    assert "| 2x1 @ 100mbit | " in md and "_error, " not in md  # no other core models beside the shipped one
    # the measured median's interval
    lo, hi = got["trirace"]["interval_s"]
    assert lo <= 0.5 <= hi
    assert f"| 2x1 @ 100mbit | trirace | 0.500 [{lo:.3f}-{hi:.3f}] |" in md
    # the host's speed beside the calibration's, and its memory's (the calibration's timings' median)
    assert "| 2x1 @ 100mbit | 0.210 / 0.200 / 0.250 | 6.0 / 5.0 / 4.0 |" in md


@pytest.mark.parametrize("saved, says", [({"results": []}, "no format version"),
                                         ({"version": 0, "cells": []}, ": format version 0, this trirace reads version 1"),
                                         ([1, 2], "no format version")])
def test_resimulate_refuses_an_old_or_unknown_format_in_one_line(tmp_path, capsys, saved, says):
    from trirace.bench import sim_accuracy

    (tmp_path / "accuracy.json").write_text(json.dumps(saved))
    assert sim_accuracy.main(["--resimulate", str(tmp_path / "accuracy.json"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not (tmp_path / "out" / "accuracy.json").exists()


def test_one_cell_s_layout_is_checked_before_anything_is_measured(tmp_path, capsys):
    from trirace.bench import sim_accuracy
    with pytest.raises(SystemExit):
        sim_accuracy.main(["--layout", "2by2", "--out", str(tmp_path)])
    assert "want NODESxRANKS" in capsys.readouterr().err
    # 3 ranks for a 4-rank job: a one-line error (the testbed's own, where it cannot start here)
    with pytest.raises(SystemExit):
        sim_accuracy.main(["--layout", "3x1", "--out", str(tmp_path)])
    assert "error: " in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "accuracy.json").exists()


def test_the_matrix_measures_each_rate_s_cells_next_to_its_calibration():
    from trirace.bench import matrix
    from trirace.bench.sim_accuracy import by_rate

    order = by_rate(matrix.cells())
    assert sorted(map(matrix.cell_name, order)) == sorted(map(matrix.cell_name, matrix.cells()))
    rates = [c.link for c in order]
    assert rates == [r for r in matrix.RATES for _ in matrix.SHAPES]  # one rate at a time
    firsts = [(c.nodes, c.ranks_per_node) for c in order[::len(matrix.SHAPES)]]
    assert firsts[0] != firsts[1] and firsts[0] == firsts[2]  # neither layout always goes first


def test_a_measured_median_s_interval_narrows_with_more_steps_and_judges_a_miss():
    from trirace.bench.sim_accuracy import consistent, median_interval

    rng = random.Random(1)
    few = [[rng.gauss(1.0, 0.1) for _ in range(4)] for _ in range(3)]
    many = [[rng.gauss(1.0, 0.1) for _ in range(40)] for _ in range(3)]
    (a, b), (c, d) = median_interval(few), median_interval(many)
    assert a < b and c < d and d - c < (b - a) / 2  # ten times the steps: about a third of the width
    assert median_interval(few) == [a, b]  # seeded: a report is repeatable
    assert median_interval([[1.0] * 4] * 3) == [1.0, 1.0]
    # 1.10 predicted against a median whose interval reaches 1.05: 5% of it, not a miss the measurement can tell
    assert consistent({"predicted_s": 1.10, "interval_s": [0.98, 1.05]})
    assert not consistent({"predicted_s": 1.11, "interval_s": [0.98, 1.05]})
    assert not consistent({"predicted_s": 0.93, "interval_s": [0.98, 1.05]})


def test_each_miss_is_reported_with_what_the_record_says_about_it():
    from trirace.bench.sim_accuracy import why_missed

    cal = Calibration("gpt-test", 2, 64, 1, [0.01] * 7, [0.02] * 7, 1e-9, "testbed", cpu_throughput=[0.97, 1.85, 1.80],
                      probe_rounds=[{"cpu_throughput": [0.97, 1.9, 1.8], "unit_s": 0.21},
                                    {"cpu_throughput": [0.97, 1.9, 1.78], "unit_s": 0.21}])
    # the calibration's layers sum to 0.21 s: readings in that unit compare as they are
    base = {"measured_s": 1.0, "predicted_s": 0.9, "error": -0.1, "host_compute": 1.0, "host_compute_error": -0.1,
            "measured_exposed_p2p_s": 0.1, "predicted_exposed_p2p_s": 0.1, "measured_exposed_allreduce_s": 0.0,
            "predicted_exposed_allreduce_s": 0.0, "interval_s": [0.99, 1.01]}
    cell = {"contention_after": {"throughput": [0.97, 1.85, 1.81], "unit_s": 0.21}}
    # nothing recorded explains it: the gap is computation's
    assert why_missed(cell, base, cal) == ["none of these: the gap is in computation on the shared cores, "
                                           "not in exposed transfers"]
    # under-predicted where the host computed slower at the cell and its cores did less: both named
    slow = {**base, "host_compute": 1.12, "host_compute_error": -0.02}
    got = why_missed({"contention_after": {"throughput": [0.97, 1.7, 1.6], "unit_s": 0.21}}, slow, cal)
    assert got[:3] == ["the host moved: re-measured at the cell -2.0%",
                       "one rank's compute took 1.12x its calibration's time at the cell",
                       "3 ranks on the shared cores did 1.60 after the cell, 1.80 at calibration"]
    # the same drift cannot explain an over-prediction: not named
    over = {**slow, "predicted_s": 1.1, "error": 0.1, "host_compute_error": 0.08}
    assert why_missed({"contention_after": {"throughput": [0.97, 1.7, 1.6], "unit_s": 0.21}}, over,
                      cal)[0].startswith("none of these")
    # an exposed kind carrying at least half the gap, with its sign; the calibration's rounds apart; the interval
    exposed = {**base, "predicted_exposed_allreduce_s": 0.02, "measured_exposed_allreduce_s": 0.09, "interval_s": [0.93, 1.02]}
    wide = replace(cal, probe_rounds=[{"cpu_throughput": [0.97, 1.9, 1.8], "unit_s": 0.21},
                                      {"cpu_throughput": [0.97, 1.9, 1.4], "unit_s": 0.21}])
    assert why_missed(cell, exposed, wide) == ["the calibration's rounds read the 3-rank point 1.40-1.80",
                                               "within 5% of its measured median's 95% interval",
                                               "exposed AllReduce 0.020 s predicted, 0.090 s measured"]
    # the host's cores left to no rank beyond what the simulation left: named where it is under
    share = {"user": 0.9, "system": 0.03, "idle": 0.04, "irq": 0.03, "steal": 0.0}
    idle = {**base, "measured_host_cpu_share": share, "predicted_idle_share": 0.01}
    assert why_missed(cell, idle, cal) == ["the host's cores were idle 4% and in interrupts 3% of the steady "
                                           "steps, where the simulation left 1% to no rank"]
    assert why_missed(cell, {**idle, "predicted_idle_share": 0.06}, cal)[0].startswith("none of these")
    # readings count in their own lone process's best (unit_s): compared in the calibration's.
    # 1.6 in 0.224 s is 1.50 in 0.21 s; a round's 1.5 in 0.175 s is 1.80
    after = {"throughput": [0.97, 1.7, 1.6], "unit_s": 0.224}
    assert why_missed({"contention_after": after}, slow, cal)[2] == \
        "3 ranks on the shared cores did 1.50 after the cell, 1.80 at calibration"
    steady = replace(cal, probe_rounds=[{"cpu_throughput": [0.97, 1.9, 1.8], "unit_s": 0.21},
                                        {"cpu_throughput": [0.97, 1.9, 1.5], "unit_s": 0.175}])
    assert not any("rounds read" in w for w in why_missed(cell, exposed, steady))


def test_the_host_re_measured_at_a_cell_counts_its_contention_in_the_re_measured_iteration():
    from trirace.bench.sim_accuracy import at_host_speed

    cal = Calibration("gpt-test", 2, 64, 1, [0.01] * 7, [0.02] * 7, 1e-9, "testbed", cpu_throughput=[0.97, 1.8])
    after = {"throughput": [0.95, 1.6], "spread": [0.03, 0.2], "unit_s": 0.2}
    got, scale = at_host_speed(cal, 0.25, after)  # the layers now sum to 0.25 s: 1.6 in 0.2 s units is 2.0
    assert scale == pytest.approx(0.25 / 0.21) and got.iteration_s == pytest.approx(0.25)
    assert got.cpu_throughput == pytest.approx([0.95 * 1.25, 2.0]) and got.compute_spread == [0.03, 0.2]


def test_the_host_s_share_over_a_run_weighs_each_step_by_its_time():
    from trirace.bench.side_by_side import host_share

    rows = [{"step_time_s": 1.0, "host_cpu_share": {"user": 0.9, "idle": 0.1}},
            {"step_time_s": 3.0, "host_cpu_share": {"user": 0.5, "idle": 0.5}},
            {"step_time_s": 2.0, "host_cpu_share": None}]  # a step in which no tick passed
    assert host_share(rows) == pytest.approx({"user": 0.6, "idle": 0.4})
    assert host_share([{"step_time_s": 1.0}]) is None  # the torch peer's rows
