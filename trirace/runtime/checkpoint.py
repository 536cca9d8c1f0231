"""Checkpoints of a pipeline that never flushes, in a form any layout can resume.

After OPT t a stage holds everything step t+1 needs: W(t) (which step t+1 computes on
under 2BW), W(t+1), the optimizer's master weights and state. Gradients of step t+1
already in flight are not saved; a resumed run recomputes step t+1 from its start, in the
same order, so with the same layout its losses are bitwise those of an uninterrupted run.
Batches are a pure function of (seed, step, index), so the data position is the step.

Layout: DIR/step-000005/{meta.json, embedding.pt, block0.pt, ..., lm_head.pt}. Each layer's
file holds, under the layer's global name, its weight buffers (one per weight version,
slot s holding the global version v with v % versions == s, the slot every layout's stage
puts it in), its master weights and its optimizer state, per parameter name. Replica 0 of
each stage writes its own layers' files and stage 0 the manifest (meta.json), which names
every layer file a complete step holds: no rank gathers the model, and a run of any pp,
dp, partition or rank order rebuilds its stages from the files of the layers it owns.
Each file is written to a temporary name and renamed, so a process killed mid-write leaves
a step without some file, and loading passes over it to the previous complete one.

Files are torch.save per layer, read with weights_only=True: optimizer state is a nested
dict of tensors and numbers per parameter (Adam's step counter, Muon's momentum), which
safetensors' flat tensor map cannot hold without a naming scheme of its own, and
torch.distributed.checkpoint would reshard through a process group and a planner where
a layer is already the unit of resharding here, and loads nothing without a group
(`trirace generate`, `trirace checkpoint info`). No dependency is added.

Torch's global RNG state is saved per stage (rng-A-B.pt, for layers A..B-1) and restored
only by a stage of exactly those layers: a layout-free state has no meaning, since which
rank draws what depends on the layout. Training draws nothing from it (dropout is 0 in
every built-in model; batches come from generators seeded by (seed, step, index)); only a
custom layer that draws (its own dropout) depends on it, and stays bitwise where the
layout is unchanged.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from torch import nn

from ..config import TrainConfig
from ..errors import UsageError
from ..models import layer_names
from ..plan.schedule import build_schedule
from .stage import StageModel

_STEP = re.compile(r"step-(\d{6})")
FORMAT = 2  # meta.json's "format": what this module writes and the only one it reads
# What a resume must match. Not the layout (pp, dp, partition, rank order), nor the
# schedule beyond its weight-version count (gpipe and 1f1b compute the same updates), nor
# the optimizer's hyperparameters: the resuming run's configuration sets those.
MATCH = ("model", "tie_embeddings", "shape", "layers", "optimizer", "seed", "weight_versions")


def manifest(cfg: TrainConfig, partition: list[int]) -> dict:
    """What meta.json records of the run that writes it (less the step)."""
    spec = cfg.spec
    shape = None if spec.custom is not None else {
        "arch": spec.arch, "vocab_size": spec.vocab_size, "d_model": spec.d_model, "n_layers": spec.n_layers,
        "n_heads": spec.n_heads, "kv_heads": spec.kv_heads, "d_ff": spec.d_ff, "max_seq_len": spec.max_seq_len}
    return {"model": cfg.model.name, "tie_embeddings": spec.tie_embeddings, "shape": shape,
            "layers": layer_names(spec), "optimizer": cfg.optim.optimizer, "seed": cfg.seed,
            "weight_versions": weight_versions(cfg.parallel.schedule), "schedule": cfg.parallel.schedule,
            "data": str(cfg.data.source),
            "written_by": {"pp": cfg.parallel.pp, "dp": cfg.parallel.dp, "partition": list(partition),
                           "rank_order": cfg.parallel.rank_order}}


def weight_versions(schedule: str) -> int:
    """Weight buffers a stage keeps under `schedule` (2BW keeps W(t-1) beside W(t))."""
    return build_schedule(schedule, 1, 1, 1).staleness + 1


def layer_file(name: str) -> str:
    return f"{name}.pt"


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def _optimizers(opt) -> list[torch.optim.Optimizer]:
    """torch optimizers inside `opt` (MuonAdamW steps two)."""
    return list(getattr(opt, "parts", [opt]))


def _master_index(model: StageModel) -> dict[int, int]:
    """id(parameter of any weight buffer) -> index of its master copy. A tied head that
    shares the table's parameter (both ends on one stage) maps to the table's."""
    index = {}
    for module in model.versions:
        index.update({id(p): i for i, p in enumerate(module.parameters())})
    return index


def save(root: Path, step: int, stage: int, model: StageModel, meta: dict) -> None:
    """Called by replica 0 of every stage after its OPT `step` (replicas hold the same state).
    `meta` is manifest()'s."""
    d = Path(root) / f"step-{step:06d}"
    d.mkdir(parents=True, exist_ok=True)
    if stage == 0:
        text = json.dumps({"format": FORMAT, "step": step, "next_step": step + 1, **meta}, indent=1)
        _atomic_write(d / "meta.json", lambda p: p.write_text(text))
    index = _master_index(model)
    per_param: dict[int, dict] = {}  # id(master parameter) -> its optimizer state
    for o in _optimizers(model.optimizer):
        order = [p for g in o.param_groups for p in g["params"]]
        for i, st in o.state_dict()["state"].items():
            per_param[id(order[i])] = st
    names = meta["layers"]
    for j, layer in enumerate(model.versions[0]):
        g = model.layers.start + j
        params = dict(layer.named_parameters())
        state = {
            "format": FORMAT, "layer": names[g], "index": g, "step": step,
            "versions": [module[j].state_dict() for module in model.versions],
            "master": {n: model.master[index[id(p)]].detach() for n, p in params.items()},
            "optimizer": {n: s for n, p in params.items()
                          if (s := per_param.get(id(model.master[index[id(p)]]))) is not None},
        }
        _atomic_write(d / layer_file(names[g]), lambda p, s=state: torch.save(s, p))
    rng = {"cpu": torch.get_rng_state()}
    device = model.master[0].device if model.master else torch.device("cpu")
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    _atomic_write(d / _rng_file(model.layers), lambda p: torch.save(rng, p))


def _rng_file(layers: range) -> str:
    return f"rng-{layers.start}-{layers.stop}.pt"


def read_meta(d: Path) -> dict:
    """A step directory's manifest, refused in one line unless this module wrote it."""
    try:
        meta = json.loads((d / "meta.json").read_text())
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or not JSON
        raise UsageError(f"unreadable checkpoint {d}: {e}") from None
    if not isinstance(meta, dict):
        raise UsageError(f"checkpoint {d}: meta.json is not a trirace checkpoint's meta")
    if meta.get("format") != FORMAT:
        was = " (one file per stage, tied to its layout)" if meta.get("format") == 1 else ""
        raise UsageError(f"checkpoint {d} has format {meta.get('format')!r}{was}; this trirace reads format "
                         f"{FORMAT} (one file per layer)")
    if not isinstance(meta.get("step"), int) or meta["step"] != _step_of(d) or not isinstance(meta.get("layers"), list):
        raise UsageError(f"checkpoint {d}: meta.json is not the meta of this step directory")
    return meta


def missing(d: Path, meta: dict) -> list[str]:
    """The layer files a step's manifest names that are not there."""
    return [f for f in map(layer_file, meta["layers"]) if not (d / f).is_file()]


def latest(root: Path) -> Path | None:
    """The newest step directory whose manifest and every layer file are there (None when
    there are no steps). A manifest of another format is returned, for read_meta to refuse
    in one line rather than be passed over; steps that exist but none complete are an error
    naming what the newest lacks."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.fullmatch(p.name)) and p.is_dir())
    for _, d in reversed(steps):
        if not (d / "meta.json").is_file():
            continue  # stage 0 died before its manifest: torn
        try:
            meta = read_meta(d)
        except UsageError:
            return d
        if not missing(d, meta):
            return d
    if steps:
        d = steps[-1][1]
        lacks = missing(d, read_meta(d)) if (d / "meta.json").is_file() else ["meta.json"]
        raise UsageError(f"checkpoint {d} is incomplete ({_few(lacks)} missing) and no earlier step is complete")
    return None


def _few(files: list[str]) -> str:
    return ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def check(d: Path, cfg: TrainConfig) -> int:
    """The checkpoint's step, after making sure it is one this run can resume."""
    meta = read_meta(d)
    want = manifest(cfg, [])
    for k in MATCH:  # the model first: a schedule mismatch means little for another model
        if k == "weight_versions" and meta.get(k) != want[k]:
            raise UsageError(f"checkpoint {d} holds {meta.get(k)} weight version(s) (schedule {meta.get('schedule')}), "
                             f"this run's schedule {want['schedule']} keeps {want[k]}: resume with --schedule "
                             f"{meta.get('schedule')}")
        if meta.get(k) != want[k]:
            raise UsageError(f"checkpoint {d} is for {k}={meta.get(k)!r}, this run has {k}={want[k]!r}")
    return meta["step"]


def _step_of(d: Path) -> int:
    m = _STEP.fullmatch(d.name)
    return int(m.group(1)) if m else -1


def resume_point(cfg: TrainConfig) -> tuple[Path | None, int]:
    """(checkpoint to load, first global step to run) for `cfg`: (None, 0) unless resuming
    from a checkpoint that exists; with resume=require, a missing one is an error."""
    if cfg.checkpoint.resume == "off":
        return None, 0
    found = latest(cfg.checkpoint.dir)
    if found is None:
        if cfg.checkpoint.resume == "require":
            raise UsageError(f"--resume=require: no complete checkpoint in {cfg.checkpoint.dir}")
        return None, 0
    first = check(found, cfg) + 1
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


def _load_layer(d: Path, name: str) -> dict:
    return torch.load(d / layer_file(name), weights_only=True, map_location="cpu")


def _check_shapes(d: Path, name: str, have: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    for n, t in have.items():
        if n not in saved or tuple(saved[n].shape) != tuple(t.shape):
            got = "none" if n not in saved else tuple(saved[n].shape)
            raise UsageError(f"checkpoint {d}: layer {name}'s {n} is {got}, this model's is {tuple(t.shape)}")


def load(d: Path, model: StageModel) -> None:
    """Restore a stage of any layout from the files of its layers. Weight buffers go back to
    the slots of their global versions: the resumed model's `offset` (its first step)
    keeps that mapping."""
    names = read_meta(d)["layers"]
    index = _master_index(model)
    per_param: dict[int, dict] = {}  # id(master parameter) -> saved optimizer state
    with torch.no_grad():
        for j, layer in enumerate(model.versions[0]):
            name = names[model.layers.start + j]
            state = _load_layer(d, name)
            params = dict(layer.named_parameters())
            _check_shapes(d, name, params, state["master"])
            for module, sd in zip(model.versions, state["versions"]):
                module[j].load_state_dict(sd)
            for n, p in params.items():
                master = model.master[index[id(p)]]
                master.copy_(state["master"][n])
                if n in state["optimizer"]:
                    per_param[id(master)] = state["optimizer"][n]
    for o in _optimizers(model.optimizer):
        # This run's parameter groups (its hyperparameters), with each parameter's state
        # under the index this stage's optimizer gives it.
        fresh = o.state_dict()
        order = [p for g in o.param_groups for p in g["params"]]
        o.load_state_dict({"state": {i: per_param[id(p)] for i, p in enumerate(order) if id(p) in per_param},
                           "param_groups": fresh["param_groups"]})
    rng = d / _rng_file(model.layers)
    if rng.is_file():
        saved = torch.load(rng, weights_only=True)
        torch.set_rng_state(saved["cpu"])
        if "cuda" in saved and model.master and model.master[0].device.type == "cuda":
            torch.cuda.set_rng_state(saved["cuda"], model.master[0].device)


def load_weights(d: Path, layers: list[nn.Module], meta: dict) -> None:
    """The master weights of a whole model (trirace generate): every layer, in one process."""
    with torch.no_grad():
        for name, layer in zip(meta["layers"], layers, strict=True):
            saved = _load_layer(d, name)["master"]
            params = dict(layer.named_parameters())
            _check_shapes(d, name, params, saved)
            for n, p in params.items():
                p.copy_(saved[n])


def find(path: Path) -> Path:
    """The step a path names: a step directory itself, or a --checkpoint-dir's newest
    complete step; anything else is refused in one line."""
    path = Path(path)
    if (path / "meta.json").is_file():
        meta = read_meta(path)
        if lacks := missing(path, meta):
            raise UsageError(f"checkpoint {path} is incomplete: {_few(lacks)} missing")
        return path
    found = latest(path) if path.is_dir() else None
    if found is None:
        raise UsageError(f"{path}: not a trirace checkpoint (no step-NNNNNN/meta.json)")
    read_meta(found)
    return found


def info(path: Path) -> list[str]:
    """What `trirace checkpoint info` prints: the step a path resolves to (find) and what it
    holds, then any newer steps a resume passes over."""
    d = find(path)
    meta = read_meta(d)
    by = meta.get("written_by", {})
    lines = [f"{d}: step {meta['step']}, complete; a resume continues at step {meta['next_step']}",
             f"model {meta['model']}{' (tied embeddings)' if meta['tie_embeddings'] else ''}, optimizer "
             f"{meta['optimizer']}, seed {meta['seed']}, data {meta.get('data')}",
             f"weight versions {meta['weight_versions']} (schedule {meta['schedule']}); written at pp={by.get('pp')} "
             f"x dp={by.get('dp')}, partition {','.join(map(str, by.get('partition', [])))}; any layout resumes it"]
    total = 0
    rows = []
    for name in meta["layers"]:
        f = d / layer_file(name)
        size = f.stat().st_size
        total += size
        state = torch.load(f, weights_only=True, map_location="cpu", mmap=True)
        numel = sum(t.numel() for t in state["master"].values())
        rows.append(f"  {name:<12} {_bytes(size):>10}  {len(state['master']):>3} tensor(s), {numel:,} parameters, "
                    f"optimizer state for {len(state['optimizer'])}")
    lines.append(f"{len(meta['layers'])} layers, {_bytes(total)}:")
    lines += rows
    if d != Path(path):  # the newest complete step of a --checkpoint-dir: say what it passed over
        for p in sorted(d.parent.iterdir()):
            if _step_of(p) > meta["step"] and p.is_dir():
                lacks = missing(p, read_meta(p)) if (p / "meta.json").is_file() else ["meta.json"]
                lines.append(f"{p}: incomplete ({_few(lacks)} missing); a resume passes over it")
    return lines


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
