"""The calibration file (trirace/sim/calibration.py): it round-trips, names its format,
refuses another format and bad figures in one line, and checks the job it is used for."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import pytest

from trirace.config import make_config
from trirace.errors import UsageError
from trirace.sim.calibration import VERSION, Calibration, load_calibration
from trirace.sim.cluster import load_cluster
from trirace.sim.simulate import simulate


def cli(*args: str) -> SimpleNamespace:
    """The command in this process."""
    from trirace.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_a_calibration_round_trips_and_is_refused_for_another_job_or_cluster(tmp_path):
    cal = Calibration("gpt-test", 2, 64, 1, [0.1] * 7, [0.2] * 7, 1e-9, "testbed",
                      {"inter": {"bits_per_s": 1e8, "latency_s": 1e-4}}, {"512": 100.0})
    cal.save(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["version"] == VERSION
    back = load_calibration(tmp_path / "c.json")
    assert back == cal
    cfg = make_config({"model": "gpt-test", "pp": 2, "dp": 2, "micro_batch_size": 2, "seq_len": 64, "steps": 6,
                       "data": "synthetic"})
    r = simulate(cfg, load_cluster("testbed"), "blocking", back)
    assert r.compute_source == "calibration"
    with pytest.raises(UsageError, match="calibration is for gpt-test"):
        simulate(cfg.with_(micro_batch_size=4), load_cluster("testbed"), "blocking", back)
    with pytest.raises(UsageError, match="taken on cluster 'testbed'"):
        simulate(cfg, load_cluster("a100-ib"), "blocking", back)


@pytest.mark.parametrize("version, says", [(1, ": format version 1, this trirace reads version 2"),
                                           (99, "format version 99"), ("2", "version '2'"),
                                           (None, "format version None")])
def test_an_old_or_unknown_calibration_format_is_refused_in_one_line(tmp_path, version, says):
    Calibration("gpt-test", 4, 64, 1, [0.1] * 7, [0.2] * 7, 1e-9).save(tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    data["version"] = version
    (tmp_path / "c.json").write_text(json.dumps(data))
    p = cli("simulate", "--model", "gpt-test", "--calibration", str(tmp_path / "c.json"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert says in p.stderr and "run trirace profile again" in p.stderr
    del data["version"]  # no format at all: not a calibration
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(UsageError, match="not one trirace wrote \\(no format version\\)"):
        load_calibration(tmp_path / "c.json")


def test_a_calibration_without_shared_core_figures_loads_and_bad_figures_are_refused(tmp_path):
    # what `trirace profile` writes without --contention: the cores ideal, transfers free of CPU
    Calibration("gpt-test", 2, 64, 1, [0.1] * 7, [0.2] * 7, 1e-9, "testbed").save(tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    plain = load_calibration(tmp_path / "c.json")
    assert plain.cpu_throughput == [] and plain.transfer_cpu == {} and plain.sparse_local_s == 0.0
    bad = tmp_path / "bad.json"
    for change, says in (({"cpu_throughput": [1.0, -2.0]}, "cpu_throughput must be positive"),
                         ({"compute_spread": [0.1, -0.1]}, "compute_spread, comm_wakeups_hz and sparse_local_s non-negative"),
                         ({"comm_wakeups_hz": -5.0}, "sparse_local_s non-negative"),
                         ({"sparse_local_s": float("nan")}, "sparse_local_s non-negative"),
                         ({"link_share": {"inter": 0.3}}, "link_share must be between 0.5 and 1"),
                         ({"link_queue": {"inter": -1.0}}, "link_queue, compute_spread"),
                         ({"transfer_cpu": {"inter": {"per_byte_s": -1e-9}}}, "transfer_cpu, send_buffer"),
                         ({"forward_s": [0.1] * 6}, "forward_s and backward_s must be equally long"),
                         ({"cpu_throughput": "fast"}, "cpu_throughput")):
        bad.write_text(json.dumps({**data, **change}))
        with pytest.raises(UsageError, match=says):
            load_calibration(bad)


def test_a_calibration_of_the_wrong_types_is_refused_in_one_line(tmp_path):
    f = tmp_path / "cal.json"
    f.write_text(json.dumps({"version": VERSION, "model": "gpt-test", "micro_batch_size": 2, "seq_len": 16,
                             "threads": 1, "forward_s": ["fast"], "backward_s": [0.1], "optimizer_s_per_param": 0.0}))
    p = cli("simulate", "--model", "gpt-test", "--calibration", str(f))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert "forward_s.0: Input should be a valid number" in p.stderr
