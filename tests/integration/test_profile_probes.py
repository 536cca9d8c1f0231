"""`trirace profile` and its probes, run as a user runs them: real processes, on loopback
and (as root) across the emulated testbed's shaped links."""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest

from trirace.calibrate.layers import compute_now, layer_times
from trirace.calibrate.links import link_queue, link_share, probe_pair
from trirace.calibrate.testbed_contention import cpu_contention
from trirace.config import make_config
from trirace.sim.calibration import VERSION, load_calibration


def cli(*args: str) -> SimpleNamespace:
    """The command in this process (its probes still run in processes of their own)."""
    from trirace.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The command as a user runs it."""
    return subprocess.run([sys.executable, "-m", "trirace", *args], capture_output=True, text=True, timeout=timeout)


def test_profile_of_a_small_job_prints_its_table_and_writes_a_file_simulate_accepts(tmp_path):
    out = tmp_path / "cal.json"
    p = run("profile", "--model", "gpt-test", "--data", "synthetic", "--out", str(out))
    assert p.returncode == 0, p.stderr
    # progress on stderr, one line per phase; the table on stdout, short, with what was measured
    phases = [line for line in p.stderr.splitlines() if "/4] " in line]
    assert len(phases) == 4 and "timing each layer" in phases[0] and "loopback" in phases[1], p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) < 25 and lines[-1] == f"wrote {out} (trirace simulate --calibration {out})"
    assert any(line.split()[:3] == ["layer", "forward", "(ms)"] for line in lines)
    for name in ("embedding", "block0", "block3", "final_norm", "lm_head", "whole model", "optimizer",
                 "link intra (loopback)", "data"):
        assert any(line.startswith(name) for line in lines), (name, p.stdout)
    assert "shared cores" not in p.stdout  # only with --contention
    cal = load_calibration(out)
    assert cal.version == VERSION and cal.model == "gpt-test" and cal.device in ("cpu", "cuda:0")
    assert len(cal.forward_s) == 7 and all(t > 0 for t in cal.forward_s + cal.backward_s)
    assert 0 < cal.optimizer_s_per_param < 1e-6 and cal.links["intra"]["bits_per_s"] > 1e8
    assert list(cal.rows_touched.values())[0] > 0 and 0 < cal.sparse_local_s < 0.5
    assert cal.cpu_throughput == [] and cal.transfer_cpu == {} and cal.probe_rounds == []
    assert len(cal.compute_draws_s) == 2  # timed at the start and at the end
    sim = run("simulate", "--model", "gpt-test", "--data", "synthetic", "--calibration", str(out),
              "--json", str(tmp_path / "sim.json"))
    assert sim.returncode == 0, sim.stderr
    assert "compute from calibration" in sim.stdout
    results = json.loads((tmp_path / "sim.json").read_text())["results"]
    assert len(results) == 4 and all(r["iteration_time_s"] > 0 for r in results)


def test_profile_with_contention_measures_what_ranks_sharing_cores_cost_each_other(tmp_path):
    out = tmp_path / "cal.json"
    # two ranks (the testbed preset shares the cores): the contention curve has two points;
    # two short rounds of the probes (users get three of 4 s windows)
    p = cli("profile", "--model", "gpt-test", "--data", "synthetic", "--pp", "1", "--dp", "2", "--out", str(out),
            "--contention", "--rounds", "2", "--probe-seconds", "0.5")
    assert p.returncode == 0, p.stderr
    assert "may take several minutes" in p.stderr.splitlines()[1]  # said up front
    assert "round 2 of 2" in p.stderr  # it says what runs
    assert "shared cores" in p.stdout and "transfer CPU intra" in p.stdout  # in the table
    assert "done:" not in p.stdout  # (not the summary of its short run of the job)
    cal = load_calibration(out)
    assert len(cal.forward_s) == 7 and all(t > 0 for t in cal.backward_s[1:5])
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
    # message: hundreds a second)
    assert not Path("/proc/self/task").is_dir() or 10 < cal.comm_wakeups_hz < 1e5
    # a byte's cost beside computation (what the simulator charges: a message's, and an
    # all-reduce chunk's in the replicas' groups) and alone (the record)
    assert set(cal.transfer_cpu["intra"]) == {"per_message_s", "per_byte_s", "per_byte_idle_s", "per_byte_collective_s"}
    assert 0 <= cal.transfer_cpu["intra"]["per_byte_s"] < 1e-6
    assert 0 <= cal.transfer_cpu["intra"]["per_byte_collective_s"] < 1e-6
    # compute timed at the start, after each round's contention and at the end; each layer the
    # median (a sum of medians need not lie between the timings' sums, but near them)
    assert len(cal.compute_draws_s) == 4 and min(cal.compute_draws_s) > 0
    assert len(cal.copy_draws_bytes_per_s) == 4 and min(cal.copy_draws_bytes_per_s) > 1e8  # memory, beside each
    assert 0.8 * min(cal.compute_draws_s) <= cal.iteration_s <= 1.25 * max(cal.compute_draws_s)


def test_the_contention_probe_measures_what_ranks_sharing_cores_cost_each_other():
    cfg = make_config({"model": "gpt-test", "pp": 1, "dp": 2, "data": "synthetic"})
    got = cpu_contention(cfg, 2, 1, seconds=0.4, wake_hz=400)
    curve = got.throughput
    assert len(got.wake_hz) == 2 and all(10 < hz <= 440 for hz in got.wake_hz)  # each process had its waker
    # Only what load on the machine cannot move: real processes measured something, and
    # k of them never get more than k times one's best (nor two cores more than ~2x).
    assert len(curve) == 2 and 0 < curve[0] <= 1.0  # one alone: its mean against its best
    assert 0 < curve[1] <= 2.2
    assert len(got.spread) == 2 and all(0 <= cv < 1 for cv in got.spread)
    # each process's iterations kept in order: one process alone, then two
    assert [len(k) for k in got.times] == [1, 2] and all(t > 0 for k in got.times for p in k for t in p)
    # the curve counts in its lone process's fastest iteration: k=1 reads that over its mean
    assert got.best_s == min(got.times[0][0])
    assert curve[0] == pytest.approx(got.best_s / statistics.fmean(got.times[0][0]))
    now = compute_now(cfg, threads=1)  # the host's speed now, as the calibration measures it
    fwd, bwd, _ = layer_times(cfg)
    assert 0 < now < 10 * (sum(fwd) + sum(bwd)) + 1.0
    got = probe_pair(False, transfer_cpu=True)  # a real gloo pair on loopback
    assert got["bits_per_s"] > 1e8 and 0 < got["latency_s"] < 0.1 and "send_buffer_bytes" not in got
    assert got["cpu_per_message_s"] >= 0 and got["cpu_per_byte_s"] >= 0
    assert got["cpu_per_message_s"] < 0.05 and got["cpu_per_byte_s"] < 1e-6


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="the testbed needs root and tc")


@needs_root
def test_profile_measures_what_a_blocking_send_leaves_in_flight():
    got = probe_pair(True, "50mbit")  # two testbed nodes: 8 MiB takes 1.3 s to cross
    assert "cpu_per_message_s" not in got  # the transfer's CPU only where asked
    assert 256 << 10 < got["send_buffer_bytes"] <= 8 << 20  # returned long before the bytes arrived
    assert 40e6 < got["bits_per_s"] < 55e6


@needs_root
def test_profile_measures_what_a_busy_uplink_keeps_queued_ahead_of_a_collective():
    # behind activations a small all-reduce waits for what the shaper has queued: at most
    # 50 ms of line rate (testbed/cluster.py), and TCP's window more
    queued = link_queue("100mbit", 512 << 10, 12.5e6, reps=15)
    assert 20e3 < queued < 2e6


@needs_root
def test_profile_measures_how_two_activations_share_a_shaped_uplink():
    share = link_share("100mbit", 512 << 10, reps=5)  # two real gloo sends leaving one testbed node
    assert 0.5 <= share <= 1.0
