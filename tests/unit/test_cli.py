"""The command line: bad input ends in one line and exit status 2, with nothing written;
good input runs, locally and under torchrun."""

import json

import pytest

from trirace.cli import main


QUICK = ["--model", "gpt-test", "--data", "synthetic", "--micro-batch-size", "2", "--seq-len", "16",
         "--balance", "params", "--no-progress"]


def _bad(capsys, tmp_path, *argv):
    out = tmp_path / "m.jsonl"
    code = main(["train", *argv, "--metrics-out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("trirace: error: ")
    assert "Traceback" not in err
    assert not out.exists(), "bad input must not leave a partial output file"
    return lines[0]


@pytest.mark.parametrize("argv, needle", [
    (["--model", "gpt-9000"], "unknown model preset"),
    (["--pp", "8", "--model", "gpt-test"], "more stages than"),
    (["--schedule", "2bw", "--pp", "4", "--dp", "1", "--micro-batches", "2"], "micro_batches >= pp"),
    (["--schedule", "bogus"], "invalid choice"),
    (["--pp", "0"], "pp"),
    (["--pp", "two"], "invalid int value"),
    (["--steps", "-1"], "steps"),
    (["--data", "/no/such/dir"], "data path not found"),
    (["--partition", "3,3", "--model", "gpt-test"], "partition covers 6 layers"),
    (["--partition", "7", "--model", "gpt-test"], "partition lists 1 stages"),
    (["--seq-len", "4096", "--model", "gpt-test"], "exceeds"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--straggler", "fast"], "expected RANK:VALUE"),
    (["--kill", "9:1"], "kill rank 9 is outside"),
    (["--kill=1:-3"], "kill step -3 is outside the job's steps 0..39"),  # it never fired: exit 0
    (["--kill", "1:40"], "kill step 40 is outside the job's steps 0..39"),
    (["--straggler=1:-0.5"], "straggler seconds -0.5 must be between 0 and 86400"),  # ended in a rank
    (["--straggler", "0:1e30"], "straggler seconds 1e+30 must be between 0 and 86400"),
    (["--straggler", "0:inf"], "straggler.1: Input should be a finite number"),
    (["--resume"], "resume needs checkpoint_dir"),
    (["--topology", "/no/such/topology.yaml"], "topology file not found"),
    (["--autotune", "--comm-policy", "blocking"], "blocking policy has none"),
    (["--partition-mb", "0"], "partition_mb"),
    (["--embedding-comm", "carrier-pigeon"], "invalid choice"),
    (["--rank-order", "random"], "unknown rank order"),
    (["--rank-order", "dp-blocks-3"], "3 does not divide dp=2"),
    (["--micro-batch-size", "0"], "micro_batch_size"),
    (["--lr", "-1"], "lr"),
    (["--fail-timeout-s", "0"], "fail_timeout_s"),
])
def test_bad_flags(capsys, tmp_path, argv, needle):
    assert needle in _bad(capsys, tmp_path, *argv)


def test_fault_flags_at_their_edges_are_accepted(capsys):
    """A kill at the first and the last step, a straggler of no time and of a day."""
    for argv in (["--kill", "1:0"], ["--kill", "3:39"], ["--straggler", "0:0"], ["--straggler", "3:86400"]):
        assert main(["train", *QUICK, *argv, "--dry-run"]) == 0, capsys.readouterr().err
    capsys.readouterr()


def test_empty_data_dir(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "no text files" in _bad(capsys, tmp_path, "--data", str(tmp_path / "empty"))


@pytest.mark.parametrize("text, needle", [
    ("pp: [1, 2\n", "malformed YAML"),
    ("- just\n- a list\n", "expected a mapping"),
    ("pp: 2\nwarp_drive: on\n", "warp_drive: unknown option"),
    ("micro_batches: many\n", "micro_batches"),
])
def test_bad_yaml(capsys, tmp_path, text, needle):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    assert needle in _bad(capsys, tmp_path, "--config", str(f))


def test_topology_that_does_not_match_the_job(capsys, tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("nodes: 3\nranks_per_node: 2\n")
    assert "topology has 3 x 2 = 6 ranks but the job has 4" in _bad(capsys, tmp_path, "--topology", str(f))


@pytest.mark.parametrize("flag", ["--trace-out", "--checkpoint-dir", "--comm-log"])
def test_unwritable_output_dir_is_refused_before_anything_starts(capsys, tmp_path, flag):
    line = _bad(capsys, tmp_path, "--steps", "1", *QUICK, flag, "/proc/trirace-nope")
    assert line == f"trirace: error: {flag} /proc/trirace-nope: cannot write under /proc (No such file or directory)"


def test_output_under_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    assert "is a file, so nothing can be created under it" in _bad(capsys, tmp_path, "--trace-out",
                                                                     str(tmp_path / "f" / "trace"))


def _one_line_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("what", ["calibration", "config", "topology", "cluster"])
def test_binary_input_file_is_one_line(capsys, tmp_path, what):
    f = tmp_path / "blob"
    f.write_bytes(bytes(range(256)) * 4)
    argv = {"calibration": ["simulate", "--model", "gpt-test", "--calibration", str(f)],
            "config": ["simulate", "--config", str(f)],
            "topology": ["plan", "--topology", str(f)],
            "cluster": ["simulate", "--model", "gpt-test", "--cluster", str(f)]}[what]
    assert str(f) in _one_line_error(capsys, argv)


def test_impossible_sweep_is_one_line(capsys):
    """Found by the fuzzer: the error came after the sweep's progress bar, three lines in all."""
    assert "1 x 1 = 1 devices but pp x dp = 4" in _one_line_error(capsys, ["simulate", "--sweep", "--nodes", "1"])


def test_resume_require_refuses_a_missing_checkpoint(capsys, tmp_path):
    line = _one_line_error(capsys, ["train", *QUICK, "--checkpoint-dir", str(tmp_path / "typo"),
                                    "--resume=require"])
    assert line == f"trirace: error: --resume=require: no complete checkpoint in {tmp_path / 'typo'}"
    assert not (tmp_path / "typo").exists()


def test_bare_resume_says_it_starts_from_step_0(capsys, tmp_path):
    assert main(["train", *QUICK, "--checkpoint-dir", str(tmp_path / "typo"), "--resume", "--dry-run"]) == 0
    assert f"no checkpoint in {tmp_path / 'typo'}; training starts from step 0" in capsys.readouterr().out


def test_missing_config_file(capsys, tmp_path):
    assert "config file not found" in _bad(capsys, tmp_path, "--config", str(tmp_path / "nope.yaml"))
