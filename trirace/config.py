"""One validated training configuration, from defaults, a YAML file and flags (in that order
of precedence, flags last). Every problem becomes a one-line ConfigError.

pydantic does the type checking and coercion, so each flag and YAML key is declared once,
here, with its default and its constraint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError, UsageError
from .yamlfile import read_mapping
from .models import PRESETS, ModelSpec, layer_names, layer_param_counts
from .models.custom import spec_of
from .models.shape_file import resolve as resolve_model
from .plan.partition import balance, check_sizes
from .plan.layout import Layout, is_order


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no --lr inf, no nan timeouts

    model: str = Field("gpt-tiny", description="model preset (" + ", ".join(PRESETS) + "), or a shape file .yaml")
    pp: int = Field(2, ge=1, description="pipeline depth (stages)")
    dp: int = Field(2, ge=1, description="data-parallel width (replicas per stage)")
    schedule: Literal["2bw", "1f1b", "gpipe"] = Field("2bw", description="pipeline schedule")
    micro_batches: int = Field(4, ge=1, description="micro-batches per step, per replica")
    micro_batch_size: int = Field(4, ge=1, description="sequences per micro-batch")
    seq_len: int | None = Field(None, ge=2, description="tokens per sequence (default: min(model max, 128))")
    steps: int = Field(40, ge=1, description="optimizer steps")
    lr: float | None = Field(None, gt=0, description="peak learning rate (default 1e-3 adam/adamw/muon, 0.1 sgd)")
    optimizer: Literal["adam", "adamw", "sgd", "muon"] = Field(
        "adam", description="adam, adamw, sgd, or muon (Muon on hidden matrices, AdamW on the rest; the most "
        "robust to 2bw's one-step delay)")
    weight_decay: float | None = Field(
        None, ge=0, description="weight decay: decoupled for adamw and muon (default 0.01), L2 for adam and sgd (default 0)")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="learning rate after warm-up: constant, or decaying to --min-lr at the last step")
    warmup_steps: int = Field(0, ge=0, description="steps of linear warm-up from lr / warmup_steps to lr")
    min_lr: float = Field(0.0, ge=0, description="where cosine and linear decay end")
    clip_grad: float | None = Field(
        None, gt=0, description="clip the global gradient norm (over every stage and replica) to this value")
    delay_compensation: Literal["none", "predict", "dc"] = Field(
        "none", description="2bw only: correct the one-step weight delay by weight prediction (predict: best "
        "measured with adamw and muon) or DC-ASGD (dc)")
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop", description="a non-finite loss or gradient norm: stop the job (exit 3), or skip that update")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="compute precision; bf16 autocasts compute and keeps fp32 master weights")
    grad_comm_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="dtype gradients cross the data-parallel links in (bf16 halves the bytes)")
    recompute: bool = Field(False, description="recompute each block's activations in backward (saves memory)")
    eval_every: int = Field(0, ge=0, description="validation loss every N steps and after the last (0: never)")
    eval_batches: int = Field(4, ge=1, description="held-out micro-batches per replica in each evaluation")
    memory_check: bool = Field(True, description="refuse at once a job whose estimated memory does not fit")
    seed: int = Field(0, ge=0)
    data: str = Field("stdlib", description="'stdlib' (Python's own sources), 'synthetic', or a file/dir of text")
    partition: list[int] | None = Field(None, description="layers per stage, e.g. [3, 4]; default balances")
    balance: Literal["time", "params"] = Field("time", description="what the partitioner balances")
    rank_order: str = Field(
        "auto", description="which parallelism gets adjacent ranks: dp-inner, pp-inner, dp-blocks-K, pp-blocks-K, "
        "or auto (the fastest of them by prediction)")
    topology: Path | None = Field(None, description="YAML topology (nodes, ranks_per_node, links); default: detect")
    probe: bool = Field(True, description="measure link latency and bandwidth at start-up")
    tie_embeddings: bool = Field(False, description="share the token table with the output head (GPT-2 style)")
    embedding_comm: Literal["dense", "allgather", "alltoall", "auto"] = Field(
        "auto", description="how replicas exchange the token table's gradient (only touched rows are non-zero)")
    comm_policy: Literal["blocking", "fifo", "priority", "trirace"] = Field(
        "trirace", description="communication policy")
    partition_mb: float | None = Field(None, gt=0, description="all-reduce chunk size in MiB (default: per policy)")
    credit_mb: float | None = Field(None, gt=0, description="bound on all-reduce MiB in flight (default: per policy)")
    autotune: bool = Field(False, description="tune chunk and credit sizes during the first steps")
    trace_out: Path | None = Field(None, description="directory for a Chrome/Perfetto timeline")
    comm_log: Path | None = Field(None, description="directory for every rank's log of issued ops (trirace commcheck)")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend (auto: nccl when there is a CUDA device per rank)")
    checkpoint_dir: Path | None = Field(None, description="save checkpoints here")
    checkpoint_every: int = Field(0, ge=0, description="save after every N steps (0: only after the last)")
    resume: Literal["off", "auto", "require"] = Field(
        "off", description="continue from the newest complete checkpoint in --checkpoint-dir; auto (what a bare "
        "--resume means) starts from step 0 when there is none, saying so; require makes that an error")
    fail_timeout_s: float = Field(60.0, gt=0, description="a rank waiting this long on a peer gives up (exit non-zero)")
    kill: tuple[int, int] | None = Field(None, description="fault injection: RANK:STEP kills that rank when the step starts")
    straggler: tuple[int, float] | None = Field(
        None, description="fault injection: RANK:SECONDS makes that rank sleep after every forward")
    metrics_out: Path | None = Field(None, description="JSON lines, one object per step")
    export_hf: Path | None = Field(None, description="after the last step, write a Hugging Face model directory "
                                   "(config.json, safetensors shards, the tokenizer when there is one)")
    overwrite: bool = Field(False, description="let --export-hf replace a directory that is not empty")
    progress: bool = Field(True, description="show a progress bar")
    # Set by trirace.train(cfg, model=LayerModel(...)): how every process finds your layers
    # (models/custom.py). Not a flag.
    layer_model: dict | None = Field(None, description="(Python API) a reference to your own layer list")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v == "custom":  # checked against layer_model below
            return v
        try:
            resolve_model(v)
        except UsageError as e:  # pydantic reports only ValueErrors raised in validators
            raise ValueError(str(e)) from None
        return v

    @field_validator("rank_order")
    @classmethod
    def _known_order(cls, v: str) -> str:
        if v != "auto" and not is_order(v):
            raise ValueError(f"unknown rank order {v!r}; choose auto, dp-inner, pp-inner, dp-blocks-K or pp-blocks-K")
        return v

    @field_validator("partition", mode="before")
    @classmethod
    def _split_partition(cls, v: Any) -> Any:
        return [int(x) for x in v.split(",")] if isinstance(v, str) else v

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_flag(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML `resume: true`, or the flag's old boolean form
            return "auto" if v else "off"
        return v

    @field_validator("straggler", "kill", mode="before")
    @classmethod
    def _split_pair(cls, v: Any) -> Any:
        if isinstance(v, str):
            rank, sep, value = v.partition(":")
            if not sep:
                raise ValueError("expected RANK:VALUE, e.g. 1:0.05")
            return (rank, value)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        if (self.model == "custom") != (self.layer_model is not None):
            raise ValueError("model 'custom' comes with layer_model, from trirace.train(cfg, model=LayerModel(...))")
        try:
            spec = self.spec
        except UsageError as e:
            raise ValueError(str(e)) from None
        n_layers = len(layer_names(spec))
        if self.pp > n_layers:
            raise ValueError(f"pp={self.pp} is more stages than {self.model}'s {n_layers} layers")
        if self.schedule == "2bw" and self.micro_batches < self.pp:
            raise ValueError(
                f"2bw needs micro_batches >= pp (got {self.micro_batches} < {self.pp})")
        if self.seq_len is not None and self.seq_len > spec.max_seq_len:
            raise ValueError(f"seq_len {self.seq_len} exceeds {self.model}'s maximum {spec.max_seq_len}")
        if self.resume != "off" and self.checkpoint_dir is None:
            raise ValueError("resume needs checkpoint_dir")
        if self.delay_compensation != "none" and self.schedule != "2bw":
            raise ValueError("delay_compensation corrects 2bw's weight delay; the other schedules have none")
        if self.min_lr > self.learning_rate:
            raise ValueError(f"min_lr {self.min_lr:g} is above the learning rate {self.learning_rate:g}")
        if self.clip_grad is not None and spec.tie_embeddings and self.pp > 1:
            # The tied gradient is the sum of two stages' parts, known only at the update:
            # the norm each stage contributes earlier would count it wrongly.
            raise ValueError("clip_grad with tie_embeddings across stages (pp > 1) is not supported yet")
        if self.export_hf is not None and spec.arch not in ("gpt", "llama"):
            raise ValueError(f"export_hf writes GPT-2 and Llama models, not arch {spec.arch!r}")
        if self.autotune and self.comm_policy == "blocking":
            raise ValueError("autotune tunes chunk and credit sizes; the blocking policy has none")
        for name, pair in (("straggler", self.straggler), ("kill", self.kill)):
            if pair is not None and not 0 <= pair[0] < self.world_size:
                raise ValueError(f"{name} rank {pair[0]} is outside the {self.world_size} ranks")
        if self.kill is not None and not 0 <= self.kill[1] < self.steps:  # else it never fires
            raise ValueError(f"kill step {self.kill[1]} is outside the job's steps 0..{self.steps - 1}")
        if self.straggler is not None and not 0 <= self.straggler[1] <= 86400:  # what a rank can sleep
            raise ValueError(f"straggler seconds {self.straggler[1]:g} must be between 0 and 86400 (a day)")
        if self.rank_order != "auto":
            try:
                Layout(self.pp, self.dp, self.rank_order)  # a block size must divide its axis
            except UsageError as e:
                raise ValueError(str(e)) from None
        if self.partition is not None:
            try:
                check_sizes(self.partition, n_layers, self.pp)
            except UsageError as e:  # pydantic reports only ValueErrors raised in validators
                raise ValueError(str(e)) from None
        return self

    # Derived values, so that callers never recompute defaults differently.
    @property
    def spec(self) -> ModelSpec:
        spec = spec_of(self.layer_model) if self.layer_model is not None else resolve_model(self.model)
        return spec.with_(tie_embeddings=True) if self.tie_embeddings and spec.custom is None else spec

    @property
    def world_size(self) -> int:
        return self.pp * self.dp

    @property
    def tokens_seq(self) -> int:
        return self.seq_len or min(self.spec.max_seq_len, 128)

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (0.1 if self.optimizer == "sgd" else 1e-3)

    @property
    def decay(self) -> float:
        """Weight decay in effect (--weight-decay, or the optimizer's usual default)."""
        return self.weight_decay if self.weight_decay is not None else (0.01 if self.optimizer in ("adamw", "muon") else 0.0)

    @property
    def activation_shape(self) -> tuple[int, int, int]:
        """What crosses a pipeline link per micro-batch, forward (and its gradient back)."""
        return (self.micro_batch_size, self.tokens_seq, self.spec.d_model)

    @property
    def activation_bytes(self) -> int:
        b, s, d = self.activation_shape
        return 4 * b * s * d

    def stage_sizes(self, layer_times: Callable[[], list[float]]) -> list[int]:
        """Layers per stage: the explicit override, or a balance of parameters or of per-layer
        time, which `layer_times` supplies (measured by the runtime, modelled by the simulator)."""
        if self.partition is not None:
            return list(self.partition)
        if self.balance == "params":
            return balance([float(c) for c in layer_param_counts(self.spec)], self.pp)
        return balance(layer_times(), self.pp)

    @property
    def tokens_per_replica_step(self) -> int:
        return self.micro_batches * self.micro_batch_size * self.tokens_seq

    @property
    def tokens_per_step(self) -> int:
        return self.dp * self.tokens_per_replica_step


def load_yaml(path: str | Path) -> dict[str, Any]:
    data = read_mapping(path, "config file")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def make_config(overrides: dict[str, Any] | None = None, config_file: str | Path | None = None, **kw) -> TrainConfig:
    """Defaults < YAML file < overrides (e.g. flags). Raises ConfigError with one line."""
    try:
        values = load_yaml(config_file) if config_file else {}
    except UsageError as e:
        raise ConfigError(str(e)) from None
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    values.update(kw)
    try:
        return TrainConfig(**values)
    except ValidationError as e:
        raise ConfigError(_one_line(e)) from None


def _one_line(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown option"
    return f"{loc}: {msg}" if loc else msg
