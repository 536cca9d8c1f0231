"""The backend choice: nccl only where every rank has a CUDA device."""

import pytest


def test_backend_choice(capsys):
    """auto falls back to gloo without a CUDA device per rank; asking for nccl there is one
    line and exit 2, before anything is spawned."""
    import torch

    from trirace.cli import main
    from trirace.errors import UsageError
    from trirace.runtime.device import resolve_backend

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert resolve_backend("auto", gpus + 1) == "gloo"
    assert resolve_backend("gloo", 1) == "gloo"
    with pytest.raises(UsageError, match="one CUDA device per rank"):
        resolve_backend("nccl", gpus + 1)
    assert main(["train", "--backend", "nccl", "--pp", "2", "--dp", str(gpus + 1), "--model", "gpt-test",
                 "--data", "synthetic", "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--backend nccl needs one CUDA device per rank" in err[0]
