"""The convergence benchmark's bookkeeping (bench/convergence.py), on rows shaped like the
trainer's: which step first reaches the target, and the table's comparison with 1f1b. The
runs themselves are the equivalence tests' (delay compensation against its reference)."""

from trirace.bench.convergence import steps_to, table


def _rows(vals):
    """Evaluations every 2 steps of 4096 tokens, as the trainer reports them."""
    return [{"step": s, "tokens_per_s": 4096.0, "step_time_s": 1.0,
             "val_loss": vals[s // 2] if s % 2 == 1 else None} for s in range(2 * len(vals))]


def test_steps_to_target_is_the_first_evaluation_at_or_below_it():
    r = {"rows": _rows([5.0, 4.0, 3.0, 2.5])}
    assert steps_to(r, 3.0) == 6
    assert steps_to(r, 1.0) is None


def test_table_compares_each_run_with_1f1b_at_equal_tokens():
    results = [{"optimizer": "adamw", "run": "1f1b", "seed": 0, "rows": _rows([5.0, 4.0, 3.0, 2.0])},
               {"optimizer": "adamw", "run": "2bw", "seed": 0, "rows": _rows([5.0, 4.5, 3.5, 2.2])}]
    text = table(results)
    assert "| 0 | adamw | 1f1b | 2.0000 | +0.00% | 8 (target 2.0000) |" in text
    assert "| 0 | adamw | 2bw | 2.2000 | +10.00% | not reached (target 2.0000) |" in text
    assert "over seeds" not in text  # one seed: no summary


def test_table_summarises_seeds_with_their_range():
    results = [{"optimizer": "adamw", "run": "1f1b", "seed": 0, "rows": _rows([5.0, 2.0])},
               {"optimizer": "adamw", "run": "2bw", "seed": 0, "rows": _rows([5.0, 2.2])},
               {"optimizer": "adamw", "run": "1f1b", "seed": 1, "rows": _rows([5.0, 2.0])},
               {"optimizer": "adamw", "run": "2bw", "seed": 1, "rows": _rows([5.0, 1.9])}]
    text = table(results)
    assert "| 1 | adamw | 2bw | 1.9000 | -5.00% |" in text
    assert "| adamw | 2bw | +2.50% | -5.00% .. +10.00% |" in text


def test_bad_arguments_stop_before_any_run(capsys):
    from trirace.bench.convergence import main

    for argv in (["--lr", "-0.001"], ["--lr", "0"], ["--seeds", "x"], ["--runs", "2bw+nothing"],
                 ["--steps", "10", "--eval-every", "10"]):
        assert main(argv + ["--out", "/nonexistent/never-made"]) == 2
        assert "convergence: error:" in capsys.readouterr().err


def test_table_holds_other_optimizers_against_1f1b_with_adamw():
    results = [{"optimizer": "adamw", "run": "1f1b", "seed": 0, "rows": _rows([5.0, 4.0, 3.0, 2.0])},
               {"optimizer": "muon", "run": "1f1b", "seed": 0, "rows": _rows([4.0, 3.0, 2.0, 1.5])},
               {"optimizer": "muon", "run": "2bw", "seed": 0, "rows": _rows([4.5, 3.5, 1.9, 1.6])}]
    text = table(results)
    # Against its own optimizer's 1f1b, then against adamw's (final 2.0, target 2.0 at step 8).
    assert "| 0 | muon | 2bw | 1.6000 | +6.67% | not reached (target 1.5000) | -20.00% | 6 (target 2.0000) |" in text
    assert "| 0 | adamw | 1f1b | 2.0000 | +0.00% | 8 (target 2.0000) | +0.00% | 8 (target 2.0000) |" in text


def test_resume_keeps_finished_runs_and_refuses_other_settings(tmp_path, capsys):
    """A rerun with --resume starts no job for the runs already saved (here: all of them),
    rewrites the table from them, and refuses a file written with other settings."""
    import json

    from trirace.bench.convergence import main

    saved = [{"optimizer": "adamw", "run": n, "seed": 0, "rows": _rows(v)}
             for n, v in (("2bw", [5.0, 4.4]), ("1f1b", [5.0, 4.0]))]
    argv = ["--steps", "4", "--eval-every", "2", "--optimizers", "adamw", "--runs", "1f1b,2bw", "--out", str(tmp_path)]
    (tmp_path / "convergence.json").write_text(json.dumps(saved))  # a list, with no format: refused
    assert main(argv + ["--resume"]) == 2
    assert "has format None; this trirace reads format 1" in capsys.readouterr().err
    (tmp_path / "convergence.json").write_text(json.dumps(
        {"format": 1, "settings": {"steps": 4, "eval_every": 2, "lr": None}, "results": saved}))
    assert main(argv + ["--resume"]) == 0
    assert (tmp_path / "convergence.md").read_text().startswith("`python -m trirace.bench.convergence") and \
        "--resume`" in (tmp_path / "convergence.md").read_text()
    assert "| 0 | adamw | 2bw | 4.4000 | +10.00% |" in (tmp_path / "convergence.md").read_text()
    written = json.loads((tmp_path / "convergence.json").read_text())
    assert written["settings"] == {"steps": 4, "eval_every": 2, "lr": None}
    assert [r["run"] for r in written["results"]] == ["1f1b", "2bw"]  # 1f1b first, as requested
    # Asking for less keeps the rest in the file: only the table narrows.
    assert main(argv[:-4] + ["--runs", "1f1b", "--out", str(tmp_path), "--resume"]) == 0
    assert "| 0 | adamw | 2bw |" not in (tmp_path / "convergence.md").read_text()
    written = json.loads((tmp_path / "convergence.json").read_text())
    assert sorted(r["run"] for r in written["results"]) == ["1f1b", "2bw"]
    capsys.readouterr()
    assert main(["--steps", "6", "--eval-every", "2", "--optimizers", "adamw", "--out", str(tmp_path), "--resume"]) == 2
    assert "other settings" in capsys.readouterr().err
