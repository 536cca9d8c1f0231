"""A fast slice of the CLI fuzzer (python tests/tools/fuzz_cli.py runs 1000+ cases): every
case ends in exit 0, or in exit 2 with one line, no traceback and nothing left behind; and a
fault flag it accepts names a rank and a step of the job."""

import pytest
from hypothesis import given, settings
from tools.fuzz_cli import RANKS, SECONDS, STEPS, _pair, fuzz, run_case

TRAIN = ["train", "--model", "gpt-test", "--data", "synthetic", "--steps", "8", "--dry-run"]


def test_fuzz_slice_finds_nothing():
    n, findings, outcomes = fuzz(16, seed_value=17, log=lambda s: None)
    assert not findings, f"{findings[0].why}: trirace {' '.join(findings[0].argv)}\n{findings[0].stderr}"
    assert n == 16
    assert sum(k for (_, code), k in outcomes.items() if code == 0) >= 3  # valid cases really ran
    assert sum(k for (_, code), k in outcomes.items() if code == 2) >= 3


def test_the_rules_bite():
    """A command that ends otherwise than 0 or 2 is reported: commcheck of a directory with
    no logs exits 1 (a finding of commcheck's own, which the CLI rules do not allow here)."""
    code, found = run_case(["commcheck", "dir"], {})
    assert code == 1 and found is not None and found.why == "exit status 1"
    code, found = run_case(["commcheck", "text.txt"], {})
    assert code == 2 and found is None


def test_the_fault_pairs_reach_negative_zero_and_outside_parts():
    assert {"-1", "0", "4", "9"} <= set(RANKS)  # the jobs drawn have up to 8 x 8 ranks; 4 x 1 by default
    assert {"-3", "0", "8", "99"} <= set(STEPS)
    assert {"-0.5", "0", "86401", "1e30", "inf", "nan"} <= set(SECONDS)


@settings(max_examples=12, deadline=None, database=None)
@given(kill=_pair(STEPS), straggler=_pair(SECONDS))
def test_fault_flags_end_in_a_run_or_one_line(kill, straggler):
    """Each part of each pair from its own grammar: no case breaks the rules, the one for
    what an accepted fault flag must mean included."""
    for flag, value in (("--kill", kill), ("--straggler", straggler)):
        code, found = run_case([*TRAIN, f"{flag}={value}"], {})
        assert found is None, f"{found.why}: {flag}={value}\n{found.stderr}"


@pytest.mark.parametrize("flag, value", [("--kill", "1:-3"), ("--kill", "1:8"), ("--straggler", "1:-0.5"),
                                         ("--straggler", "0:1e30")])
def test_the_fault_oracle_reports_a_pair_the_job_cannot_act_on(flag, value):
    """Before config.py refused them, these passed the dry run (exit 0): the oracle is what
    turns that into a finding."""
    from tools.fuzz_cli import _fault_accepted_wrongly

    job = "job: 2bw pp=2 dp=2 micro-batches=4 steps=8; policy trirace\n"
    assert "accepted for a job of 4 ranks and 8 steps" in _fault_accepted_wrongly([*TRAIN, f"{flag}={value}"], job)
    assert _fault_accepted_wrongly([*TRAIN, flag, "3:7" if flag == "--kill" else "3:0.5"], job) is None
