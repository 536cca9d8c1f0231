"""Checkpoints of a pipeline that never flushes.

After OPT t a stage holds everything step t+1 needs: W(t) (which step t+1 computes on
under 2BW), W(t+1), the optimizer's master weights and state. Gradients of step t+1
already in flight are not saved; a resumed run recomputes step t+1 from its start, in the
same order, so its losses are bitwise those of an uninterrupted run. Batches are a pure
function of (seed, step, index), so the data position is the step.

Layout: DIR/step-000005/{meta.json, stage-0.pt, ..., stage-(pp-1).pt}, each file written
to a temporary name and renamed, so a process killed mid-write leaves an incomplete step
that loading skips in favour of the previous complete one. Loading uses weights_only=True.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from ..config import TrainConfig
from ..errors import UsageError
from .stage import StageModel

_STEP = re.compile(r"step-(\d{6})")
FORMAT = 1  # meta.json's "format": what this module writes and the only one it reads


def identity(cfg: TrainConfig, partition: list[int]) -> dict:
    """What a checkpoint must match to be resumed (the communication policy may differ)."""
    return {"model": cfg.model.name, "tie_embeddings": cfg.model.tie_embeddings, "pp": cfg.parallel.pp, "dp": cfg.parallel.dp,
            "schedule": cfg.parallel.schedule, "partition": list(partition), "optimizer": cfg.optim.optimizer, "seed": cfg.seed}


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def save(root: Path, step: int, stage: int, model: StageModel, ident: dict) -> None:
    """Called by replica 0 of every stage after its OPT `step` (replicas hold the same state)."""
    d = Path(root) / f"step-{step:06d}"
    d.mkdir(parents=True, exist_ok=True)
    if stage == 0:
        _atomic_write(d / "meta.json", lambda p: p.write_text(json.dumps({"format": FORMAT, "step": step, **ident})))
    state = {
        "step": step,
        "versions": [m.state_dict() for m in model.versions],
        "master": [m.detach() for m in model.master],
        "optimizer": model.optimizer.state_dict(),
        "rng": torch.get_rng_state(),
    }
    _atomic_write(d / f"stage-{stage}.pt", lambda p: torch.save(state, p))


def latest(root: Path, pp: int) -> Path | None:
    """The newest step directory whose meta and every stage file are complete."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.fullmatch(p.name)))
    for _, d in reversed(steps):
        if (d / "meta.json").is_file() and all((d / f"stage-{s}.pt").is_file() for s in range(pp)):
            return d
    return None


def check(d: Path, ident: dict) -> int:
    """The checkpoint's step, after making sure it belongs to this model and layout."""
    try:
        meta = json.loads((d / "meta.json").read_text())
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or not JSON
        raise UsageError(f"unreadable checkpoint {d}: {e}") from None
    if not isinstance(meta, dict):
        raise UsageError(f"checkpoint {d}: meta.json is not a trirace checkpoint's meta")
    if meta.get("format") != FORMAT:
        raise UsageError(f"checkpoint {d} has format {meta.get('format')!r}; this trirace reads format {FORMAT}")
    if not isinstance(meta.get("step"), int) or meta["step"] != _step_of(d):
        raise UsageError(f"checkpoint {d}: meta.json is not the meta of this step directory")
    for k, v in ident.items():
        if meta.get(k) != v:
            raise UsageError(f"checkpoint {d} is for {k}={meta.get(k)!r}, this run has {k}={v!r}")
    return meta["step"]


def _step_of(d: Path) -> int:
    return int(_STEP.fullmatch(d.name).group(1))


def resume_point(cfg: TrainConfig, partition: list[int]) -> tuple[Path | None, int]:
    """(checkpoint to load, first global step to run) for `cfg`: (None, 0) unless resuming
    from a checkpoint that exists; with resume=require, a missing one is an error."""
    if cfg.checkpoint.resume == "off":
        return None, 0
    found = latest(cfg.checkpoint.dir, cfg.parallel.pp)
    if found is None:
        if cfg.checkpoint.resume == "require":
            raise UsageError(f"--resume=require: no complete checkpoint in {cfg.checkpoint.dir}")
        return None, 0
    first = check(found, identity(cfg, partition)) + 1
    if first >= cfg.steps:
        raise UsageError(f"checkpoint {found} already reaches --steps {cfg.steps}; raise --steps to continue")
    return found, first


def resume_line(cfg: TrainConfig, found: Path | None, first: int) -> str | None:
    """What a resuming run tells the user before its first step (None when not resuming):
    a typo in the directory must not restart a long run from step 0 silently."""
    if cfg.checkpoint.resume == "off":
        return None
    if found is None:
        return f"no checkpoint in {cfg.checkpoint.dir}; training starts from step 0"
    return f"resuming from {found} (step {first} of {cfg.steps})"


def load(d: Path, stage: int, model: StageModel) -> None:
    """Restore a stage. Buffers go back to the slots they were saved from: the resumed
    model's `offset` keeps every global version in its original slot."""
    state = torch.load(d / f"stage-{stage}.pt", weights_only=True, map_location="cpu")
    for module, sd in zip(model.versions, state["versions"]):
        module.load_state_dict(sd)
    with torch.no_grad():
        for m, saved in zip(model.master, state["master"]):
            m.copy_(saved)
    model.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
