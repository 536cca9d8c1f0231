"""trirace profile and the calibration file it writes (kept here, in tests/, while calibration is rebuilt)."""

from __future__ import annotations

import io
import statistics
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest

from trirace.config import make_config
from trirace.sim.calibration import Calibration, load_calibration
from trirace.sim.cluster import load_cluster
from trirace.sim.run import simulate


def cli(*args: str) -> SimpleNamespace:
    """The command in this process (a fresh interpreter per call costs seconds; test_cli.py
    runs the installed command in its own process)."""
    from trirace.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_calibration_round_trips_and_checks_its_shapes(tmp_path):
    cal = Calibration("gpt-test", 2, 64, 1, [0.1] * 7, [0.2] * 7, 1e-9, "testbed",
                      {"inter": {"bits_per_s": 1e8, "latency_s": 1e-4}}, {"512": 100.0})
    cal.save(tmp_path / "c.json")
    back = load_calibration(tmp_path / "c.json")
    assert back == cal
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic"})
    r = simulate(cfg, load_cluster("testbed"), "blocking", back)
    assert r.compute_source == "calibration"
    with pytest.raises(Exception, match="calibration is for gpt-test"):
        simulate(cfg.model_copy(update={"micro_batch_size": 4}), load_cluster("testbed"), "blocking", back)
    with pytest.raises(Exception, match="taken on cluster 'testbed'"):
        simulate(cfg, load_cluster("a100-ib"), "blocking", back)


def test_profile_measures_layers_and_loopback(tmp_path, capfd):
    out = tmp_path / "cal.json"
    # two ranks (the testbed preset shares the cores): the contention curve has two points;
    # two short rounds of the probes (users get three of 4 s windows)
    p = cli("profile", "--model", "gpt-test", "--data", "synthetic", "--pp", "1", "--dp", "2", "--out", str(out),
            "--rounds", "2", "--probe-seconds", "0.5")
    assert p.returncode == 0, p.stderr
    assert "round 2 of 2" in p.stderr  # it says what runs
    assert "GB/s beside those timings" in p.stdout  # the host's memory speed, in the summary
    assert "done:" not in capfd.readouterr().out  # (not the summary of its short run of the job: its workers write to fd 1)
    cal = load_calibration(out)
    assert len(cal.forward_s) == 7 and all(t > 0 for t in cal.backward_s[1:5])
    assert cal.links["intra"]["bits_per_s"] > 1e8
    assert list(cal.rows_touched.values())[0] > 0
    assert 0 < cal.sparse_local_s < 0.5  # the replicas' exchange of the token table: its passes over it
    assert len(cal.cpu_throughput) == 2 and set(cal.transfer_cpu) == {"intra"} and cal.send_buffer == {}
    # each figure is the median of the rounds' readings, which the file keeps
    assert len(cal.probe_rounds) == 2
    assert [len(k) for k in cal.probe_rounds[0]["iteration_times"]] == [1, 2]  # each process's, for the record
    # (each round's first counted in the layers' iteration, not in its own lone process's best)
    assert all(r["unit_s"] == min(r["iteration_times"][0][0]) for r in cal.probe_rounds)
    assert cal.cpu_throughput == pytest.approx([statistics.median(r["cpu_throughput"][k] * cal.iteration_s / r["unit_s"]
                                                                  for r in cal.probe_rounds) for k in range(2)])
    for name in ("per_byte_s", "per_byte_collective_s"):
        # each round reads two busy windows, each between quiet ones (five kept, after an unread
        # settling window); its figure is their median, and the calibration's the median of
        # every round's busy windows
        windows = []
        for r in cal.probe_rounds:
            seen = r["transfer_windows"]["intra"][name]
            assert len(seen["work_per_s"]) == 5 and 1 <= len(seen["per_window"]) <= 2
            assert r["transfer_cpu"]["intra"][name] == pytest.approx(statistics.median(seen["per_window"]))
            windows += seen["per_window"]
        assert cal.transfer_cpu["intra"][name] == pytest.approx(statistics.median(windows))
    # measured beside the job's wake-ups, counted in a short real run of it (gloo wakes per
    # message: hundreds a second, not a CPU figure's 0.5)
    assert not Path("/proc/self/task").is_dir() or 10 < cal.comm_wakeups_hz < 1e5
    # and what its ranks' computation cost in CPU per work alone (near 1: their thread CPU
    # against the layers timed alone around it), and the curve from the probe's thread CPU
    assert set(cal.job_cpu_per_work) == {"1x2"} and 0.5 < cal.job_cpu_per_work["1x2"] < 2.0  # on loopback: one node
    assert len(cal.cpu_throughput_thread) == 2 and all(len(r["cpu_throughput_thread"]) == 2 for r in cal.probe_rounds)
    # a byte's cost beside computation (what the simulator charges: a message's, and an
    # all-reduce chunk's in the replicas' groups) and alone (the record)
    assert set(cal.transfer_cpu["intra"]) == {"per_message_s", "per_byte_s", "per_byte_idle_s", "per_byte_collective_s"}
    assert 0 <= cal.transfer_cpu["intra"]["per_byte_s"] < 1e-6
    assert 0 <= cal.transfer_cpu["intra"]["per_byte_collective_s"] < 1e-6
    # compute timed at the start, after each round and at the end; each layer the median
    # (a sum of medians need not lie between the draws' sums, but near them)
    assert len(cal.compute_draws_s) == 4 and min(cal.compute_draws_s) > 0
    assert len(cal.copy_draws_bytes_per_s) == 4 and min(cal.copy_draws_bytes_per_s) > 1e8  # memory, beside each draw
    assert 0.8 * min(cal.compute_draws_s) <= cal.iteration_s <= 1.25 * max(cal.compute_draws_s)


@pytest.mark.parametrize("flag, value", [("--rounds", "0"), ("--probe-seconds", "0"), ("--probe-seconds", "nan"),
                                         ("--probe-seconds", "inf")])
def test_profile_refuses_bad_probe_settings_in_one_line(tmp_path, flag, value):
    p = cli("profile", "--model", "gpt-test", flag, value, "--out", str(tmp_path / "cal.json"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"{flag} must be" in p.stderr and not (tmp_path / "cal.json").exists()
