"""A fast slice of the CLI fuzzer (python -m trirace.bench.fuzz_cli runs 1000+ cases): every
case ends in exit 0, or in exit 2 with one line, no traceback and nothing left behind."""

from trirace.bench.fuzz_cli import fuzz, run_case


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
