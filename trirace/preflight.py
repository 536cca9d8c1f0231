"""Checks made in the parent before any process starts, so that a bad path ends in one line
and exit status 2 instead of a worker's failure minutes later.

Outputs are proven writable by creating (and at once removing) a probe directory where the
output will go: permission bits cannot tell, since root passes every access() check while
/proc and read-only mounts still refuse. Nothing the user named is created here: a job that
fails later leaves no empty output behind.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .errors import UsageError


def output_dir(path: str | Path, flag: str) -> None:
    """`path` is, or can be created as, a directory this process can write into."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise UsageError(f"{flag} {path}: exists and is not a directory")
        _probe(_nearest_existing(p), flag, path)
    except (OSError, ValueError) as e:  # a name the OS rejects (too long, embedded NUL)
        raise UsageError(f"{flag} {path}: {_reason(e)}") from None


def output_file(path: str | Path, flag: str) -> None:
    """`path` is, or can be created as, a file this process can write."""
    p = Path(path)
    try:
        if str(path).endswith("/") or p.is_dir():
            raise UsageError(f"{flag} {path}: is a directory, not a file")
        _probe(_nearest_existing(p.parent), flag, path)
    except (OSError, ValueError) as e:
        raise UsageError(f"{flag} {path}: {_reason(e)}") from None


def train_outputs(cfg) -> None:
    """Every path a training run writes (cfg: TrainConfig)."""
    for flag, d in (("--checkpoint-dir", cfg.checkpoint.dir), ("--trace-out", cfg.observe.trace_out),
                    ("--comm-log", cfg.observe.comm_log), ("--tensorboard", cfg.observe.tensorboard)):
        if d is not None:
            output_dir(d, flag)
    if cfg.observe.metrics_out is not None:
        output_file(cfg.observe.metrics_out, "--metrics-out")
    if cfg.checkpoint.export_hf is not None:
        output_dir(cfg.checkpoint.export_hf, "--export-hf")
        p = Path(cfg.checkpoint.export_hf)
        if p.is_dir() and any(p.iterdir()) and not cfg.checkpoint.overwrite:
            raise UsageError(f"--export-hf {p}: not empty (pass --overwrite to replace it)")


def _nearest_existing(p: Path) -> Path:
    p = p.absolute()
    while not p.exists():
        p = p.parent
    return p


def _probe(base: Path, flag: str, path: str | Path) -> None:
    if not base.is_dir():
        raise UsageError(f"{flag} {path}: {base} is a file, so nothing can be created under it")
    try:
        with tempfile.TemporaryDirectory(dir=base, prefix=".trirace-probe-"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write under {base} ({e.strerror or e})") from None


def _reason(e: Exception) -> str:
    return getattr(e, "strerror", None) or str(e)
