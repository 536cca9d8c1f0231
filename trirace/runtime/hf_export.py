"""The trained weights as a Hugging Face directory (--export-hf)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..config import TrainConfig
from ..data.dataset import tokenizer_file
from ..models import hf
from ..models.build import layer_param_counts
from ..plan.job import JobPlan
from .groups import Groups
from .stage import StageModel


def export_hf(cfg: TrainConfig, plan: JobPlan, g: Groups, model: StageModel) -> None:
    """The trained weights as a Hugging Face directory: replica 0 of each stage writes
    its own shard into DIR.partial, rank 0 adds the index, config.json and the tokenizer,
    then renames it to DIR, so a failed job leaves no half-written model under DIR.
    (Across nodes DIR must be on storage every node shares.)"""
    spec = cfg.spec
    out = Path(cfg.checkpoint.export_hf)
    part = out.with_name(out.name + ".partial")
    if g.rank == 0:
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
    g.control.barrier()
    stage = plan.stages[g.stage]
    if g.replica == 0:
        # The master weights, W(steps), laid out by the buffer's modules (a buffer may hold a
        # prediction under --delay-compensation predict).
        module = model.module(plan.schedule.steps)
        hf.write_shard(part, g.stage, cfg.parallel.pp, hf.stage_tensors(spec, stage.layers, list(module),
                                                               model.master_of(module)))
    g.control.barrier()
    if g.rank == 0:
        keys = [[name for i in st.layers for name, _ in hf.names(spec, i) if hf.is_stored(spec, name)]
                for st in plan.stages]
        sizes = layer_param_counts(spec)
        total = 4 * (sum(sizes) - (sizes[-1] if spec.tie_embeddings else 0))  # a tied head is not stored
        hf.write_index(part, spec, cfg.parallel.pp, keys, total,
                       hf.tokenizer_of(spec) or tokenizer_file(cfg.data.source, spec.vocab_size))
        if out.exists():  # --overwrite (the pre-check refused a non-empty one without it)
            shutil.rmtree(out)
        part.rename(out)
    g.control.barrier()
