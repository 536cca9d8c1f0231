"""A checkpoint of format 1 (one file per stage) is refused before anything runs, by
`trirace checkpoint info` and by a resume: one line naming its format, exit status 2."""

import json

from trirace.cli import main

TRAIN = ["train", "--data", "synthetic", "--micro-batches", "2", "--micro-batch-size", "2", "--seq-len", "16",
         "--steps", "9", "--no-progress", "--resume"]


def _one_line_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_checkpoint_of_the_per_stage_format_is_refused(tmp_path, capsys):
    """Format 1 (one file per stage, tied to its layout) names its format and is not read."""
    d = tmp_path / "ck" / "step-000001"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"format": 1, "step": 1, "model": "gpt-test", "pp": 2, "dp": 2,
                                             "partition": [3, 4]}))
    (d / "stage-0.pt").write_bytes(b"")
    for argv in (["checkpoint", "info", str(tmp_path / "ck")],
                 [*TRAIN, "--model", "gpt-test", "--checkpoint-dir", str(tmp_path / "ck")]):
        line = _one_line_error(capsys, argv)
        assert line.endswith(f"checkpoint {d} has format 1 (one file per stage, tied to its layout); this trirace "
                             "reads format 2 (one file per layer)")
