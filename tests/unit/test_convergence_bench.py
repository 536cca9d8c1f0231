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
