"""The convergence benchmark resumed: saved runs are kept and no job starts for them."""






def _rows(vals):
    """Evaluations every 2 steps of 4096 tokens, as the trainer reports them."""
    return [{"step": s, "tokens_per_s": 4096.0, "step_time_s": 1.0,
             "val_loss": vals[s // 2] if s % 2 == 1 else None} for s in range(2 * len(vals))]


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
