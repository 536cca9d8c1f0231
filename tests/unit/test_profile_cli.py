"""`trirace profile`'s checks before anything is measured: each bad setting refused in one
line, no file written."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import pytest


def cli(*args: str) -> SimpleNamespace:
    """The command in this process."""
    from trirace.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.mark.parametrize("flags, says", [(("--rounds", "0"), "--rounds must be"),
                                         (("--probe-seconds", "0"), "--probe-seconds must be"),
                                         (("--probe-seconds", "nan"), "--probe-seconds must be"),
                                         (("--probe-seconds", "inf"), "--probe-seconds must be"),
                                         (("--contention", "--cluster", "a100-ib"),
                                          "--contention measures cores that every rank shares; cluster 'a100-ib'")])
def test_profile_refuses_bad_probe_settings_in_one_line(tmp_path, flags, says):
    p = cli("profile", "--model", "gpt-test", *flags, "--out", str(tmp_path / "cal.json"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert says in p.stderr and not (tmp_path / "cal.json").exists()


def test_profile_help_says_what_contention_costs_and_what_runs_without_it():
    p = cli("profile", "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    assert "--contention" in text and "several minutes" in text and "About a minute" in text
