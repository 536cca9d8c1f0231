"""One validated training configuration, from defaults, a YAML file and flags (in that order
of precedence, flags last). Every problem becomes a one-line ConfigError.

The options live in sections (`cfg.parallel.pp`, `cfg.optim.lr`, `cfg.comm.policy`...), so
each part of the system reads the section it owns. Flags and YAML keys stay flat
(`--pp`, `--comm-policy`, `comm_policy:`): `FLAGS` maps each flat name to its section and
field, and is the one table the CLI, YAML files and `make_config` share.

pydantic does the type checking and coercion, so each option is declared once, here, with
its default and its constraint. This module is not the CLI layer: planning and the runtime
import it; it imports only the model registry and the plan's pure checks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from .errors import ConfigError, UsageError
from .yamlfile import read_mapping
from .models import PRESETS, ModelSpec, layer_names, layer_param_counts
from .models.build import layer_flops
from .models.custom import spec_of
from .models.devices import device_named, flop_times, recomputing
from .models.emulated import Emulation, emulated_spec
from .models.shape_file import resolve as resolve_model
from .plan.partition import check_sizes
from .plan.layout import Layout, is_order

EMULATED_STEP_S = 2.0  # --emulate's default dilation aims a stage's computation per step at this

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no --lr inf, no nan timeouts


def _split_pair(v: Any) -> Any:
    if isinstance(v, str):
        rank, sep, value = v.partition(":")
        if not sep:
            raise ValueError("expected RANK:VALUE, e.g. 1:0.05")
        return (rank, value)
    return v


class ModelOptions(BaseModel):
    """What is trained and how its layers compute."""
    model_config = _STRICT

    name: str = Field("gpt-tiny", description="model preset (" + ", ".join(PRESETS) + "), or a shape file .yaml")
    tie_embeddings: bool = Field(False, description="share the token table with the output head (GPT-2 style)")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="compute precision; bf16 autocasts compute and keeps fp32 master weights")
    recompute: bool = Field(False, description="recompute each block's activations in backward (saves memory)")
    # Set by trirace.train(cfg, model=LayerModel(...)): how every process finds your layers
    # (models/custom.py). Not a flag.
    layer_model: dict | None = Field(None, description="(Python API) a reference to your own layer list")
    emulate: str | None = Field(
        None, description="emulate a GPU cluster: each layer sleeps its time on this GPU (h100, a100, h200) and "
        "carries 1/byte-scale of its bytes (see docs/emulation.md)")
    dilation: float | None = Field(
        None, ge=1, description="with --emulate: computation takes this many times its GPU time (default: about "
        f"{EMULATED_STEP_S:g} s of computation per step)")
    byte_scale: int | None = Field(
        None, ge=1, description="with --emulate: tensors hold 1/N of the real bytes (default: the smallest power of "
        "2 that puts the fp32 weights in 128 MiB and a micro-batch's activation in 2 MiB)")

    @field_validator("name")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v == "custom":  # checked against layer_model in TrainConfig
            return v
        try:
            resolve_model(v)
        except UsageError as e:  # pydantic reports only ValueErrors raised in validators
            raise ValueError(str(e)) from None
        return v

    @field_validator("emulate")
    @classmethod
    def _known_device(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                device_named(v)
            except UsageError as e:
                raise ValueError(str(e)) from None
        return v


class ParallelOptions(BaseModel):
    """How the model is cut into stages and replicated, and the shape of a step."""
    model_config = _STRICT

    pp: int = Field(2, ge=1, description="pipeline depth (stages)")
    dp: int = Field(2, ge=1, description="data-parallel width (replicas per stage)")
    schedule: Literal["2bw", "1f1b", "zb-h1", "gpipe"] = Field("2bw", description="pipeline schedule")
    micro_batches: int = Field(4, ge=1, description="micro-batches per step, per replica")
    micro_batch_size: int = Field(4, ge=1, description="sequences per micro-batch")
    seq_len: int | None = Field(None, ge=2, description="tokens per sequence (default: min(model max, 128))")
    partition: list[int] | None = Field(None, description="layers per stage, e.g. [3, 4]; default balances")
    balance: Literal["time", "params"] = Field("time", description="what the partitioner balances")
    rank_order: str = Field(
        "auto", description="which parallelism gets adjacent ranks: dp-inner, pp-inner, dp-blocks-K, pp-blocks-K, "
        "or auto (the fastest of them by prediction)")
    memory_check: bool = Field(True, description="refuse at once a job whose estimated memory does not fit")

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

    @property
    def world_size(self) -> int:
        return self.pp * self.dp


class OptimOptions(BaseModel):
    """The optimizer, its learning-rate schedule and what corrects 2BW's delay."""
    model_config = _STRICT

    optimizer: Literal["adam", "adamw", "sgd", "muon"] = Field(
        "adam", description="adam, adamw, sgd, or muon (Muon on hidden matrices, AdamW on the rest; the most "
        "robust to 2bw's one-step delay)")
    lr: float | None = Field(None, gt=0, description="peak learning rate (default 1e-3 adam/adamw/muon, 0.1 sgd)")
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

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (0.1 if self.optimizer == "sgd" else 1e-3)

    @property
    def decay(self) -> float:
        """Weight decay in effect (--weight-decay, or the optimizer's usual default)."""
        return self.weight_decay if self.weight_decay is not None else (0.01 if self.optimizer in ("adamw", "muon") else 0.0)


class CommOptions(BaseModel):
    """The communication policy, its sizes, and the engine and links it runs on."""
    model_config = _STRICT

    policy: Literal["blocking", "fifo", "priority", "trirace"] = Field(
        "trirace", description="communication policy")
    partition_mb: float | None = Field(None, gt=0, description="all-reduce chunk size in MiB (default: per policy)")
    credit_mb: float | None = Field(None, gt=0, description="bound on all-reduce MiB in flight (default: per policy)")
    autotune: bool = Field(False, description="tune chunk and credit sizes during the first steps")
    embedding_comm: Literal["dense", "allgather", "alltoall", "auto"] = Field(
        "auto", description="how replicas exchange the token table's gradient (only touched rows are non-zero)")
    grad_comm_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="dtype gradients cross the data-parallel links in (bf16 halves the bytes)")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend (auto: nccl when there is a CUDA device per rank)")
    topology: Path | None = Field(None, description="YAML topology (nodes, ranks_per_node, links); default: detect")
    probe: bool = Field(True, description="measure link latency and bandwidth at start-up")


class DataOptions(BaseModel):
    """What is read, and the held-out evaluation."""
    model_config = _STRICT

    source: str = Field("stdlib", description="'stdlib' (Python's own sources), 'synthetic', a file/dir of text, a "
                        "directory from trirace data prepare, or a flat .bin file of token ids (nanoGPT's train.bin)")
    dtype: Literal["uint16", "uint32"] = Field(
        "uint16", description="the ids' type in a .bin file (nanoGPT writes uint16); a prepared directory records its own")
    eval_every: int = Field(0, ge=0, description="validation loss every N steps and after the last (0: never)")
    eval_batches: int = Field(4, ge=1, description="held-out micro-batches per replica in each evaluation")


class CheckpointOptions(BaseModel):
    """Where the run's state goes, how it resumes, and the Hugging Face export."""
    model_config = _STRICT

    dir: Path | None = Field(None, description="save checkpoints here")
    every: int = Field(0, ge=0, description="save after every N steps (0: only after the last)")
    resume: Literal["off", "auto", "require"] = Field(
        "off", description="continue from the newest complete checkpoint in --checkpoint-dir; auto (what a bare "
        "--resume means) starts from step 0 when there is none, saying so; require makes that an error")
    export_hf: Path | None = Field(None, description="after the last step, write a Hugging Face model directory "
                                   "(config.json, safetensors shards, the tokenizer when there is one)")
    overwrite: bool = Field(False, description="let --export-hf replace a directory that is not empty")

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_flag(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML `resume: true`
            return "auto" if v else "off"
        return v


class ObserveOptions(BaseModel):
    """What a run reports besides its progress bar."""
    model_config = _STRICT

    metrics_out: Path | None = Field(None, description="JSON lines, one object per step")
    trace_out: Path | None = Field(None, description="directory for a Chrome/Perfetto timeline")
    comm_log: Path | None = Field(None, description="directory for every rank's log of issued ops (trirace commcheck)")
    tensorboard: Path | None = Field(None, description="directory for TensorBoard scalars of every step (needs the "
                                     "tensorboard extra: pip install 'trirace[tensorboard]')")
    progress: bool = Field(True, description="show a progress bar")

    @field_validator("tensorboard")
    @classmethod
    def _tensorboard_installed(cls, v: Path | None) -> Path | None:
        if v is not None:
            try:
                import tensorboard  # noqa: F401  (torch's SummaryWriter writes through it)
            except ImportError:
                raise ValueError("needs the tensorboard package: pip install 'trirace[tensorboard]'") from None
        return v


class FaultOptions(BaseModel):
    """What a run does when something goes wrong, and the faults it can inject to test that."""
    model_config = _STRICT

    fail_timeout_s: float = Field(60.0, gt=0, description="a rank waiting this long on a peer gives up (exit non-zero)")
    on_nonfinite: Literal["stop", "skip"] = Field(
        "stop", description="a non-finite loss or gradient norm: stop the job (exit 3), or skip that update")
    kill: tuple[int, int] | None = Field(None, description="fault injection: RANK:STEP kills that rank when the step starts")
    straggler: tuple[int, float] | None = Field(
        None, description="fault injection: RANK:SECONDS makes that rank sleep after every forward")

    @field_validator("straggler", "kill", mode="before")
    @classmethod
    def _pairs(cls, v: Any) -> Any:
        return _split_pair(v)


SECTIONS: dict[str, type[BaseModel]] = {
    "model": ModelOptions, "parallel": ParallelOptions, "optim": OptimOptions, "comm": CommOptions,
    "data": DataOptions, "checkpoint": CheckpointOptions, "observe": ObserveOptions, "faults": FaultOptions,
}
# A field's flat name (flag and YAML key) where it is not the field's own name.
_FLAT_NAMES = {("model", "name"): "model", ("comm", "policy"): "comm_policy", ("data", "source"): "data", ("data", "dtype"): "data_dtype",
               ("checkpoint", "dir"): "checkpoint_dir", ("checkpoint", "every"): "checkpoint_every"}
TOP_LEVEL = ("steps", "seed")


class TrainConfig(BaseModel):
    model_config = _STRICT

    steps: int = Field(40, ge=1, description="optimizer steps")
    seed: int = Field(0, ge=0, description="seeds the weights, the data draw and the tokenizer")
    model: ModelOptions = ModelOptions()
    parallel: ParallelOptions = ParallelOptions()
    optim: OptimOptions = OptimOptions()
    comm: CommOptions = CommOptions()
    data: DataOptions = DataOptions()
    checkpoint: CheckpointOptions = CheckpointOptions()
    observe: ObserveOptions = ObserveOptions()
    faults: FaultOptions = FaultOptions()

    @model_validator(mode="after")
    def _consistent(self) -> "TrainConfig":
        m, par, opt = self.model, self.parallel, self.optim
        if (m.name == "custom") != (m.layer_model is not None):
            raise ValueError("model 'custom' comes with layer_model, from trirace.train(cfg, model=LayerModel(...))")
        if m.emulate is None and (m.dilation is not None or m.byte_scale is not None):
            raise ValueError("dilation and byte_scale come with emulate (--emulate h100)")
        if m.emulate is not None and m.layer_model is not None:
            raise ValueError("emulate prices a preset's or shape file's layers, not your own layer list")
        try:
            spec = self.spec
        except UsageError as e:
            raise ValueError(str(e)) from None
        n_layers = len(layer_names(spec))
        if par.pp > n_layers:
            raise ValueError(f"pp={par.pp} is more stages than {m.name}'s {n_layers} layers")
        if par.schedule == "2bw" and par.micro_batches < par.pp:
            raise ValueError(
                f"2bw needs micro_batches >= pp (got {par.micro_batches} < {par.pp})")
        if par.seq_len is not None and par.seq_len > spec.max_seq_len:
            raise ValueError(f"seq_len {par.seq_len} exceeds {m.name}'s maximum {spec.max_seq_len}")
        if self.checkpoint.resume != "off" and self.checkpoint.dir is None:
            raise ValueError("resume needs checkpoint_dir")
        if opt.delay_compensation != "none" and par.schedule != "2bw":
            raise ValueError("delay_compensation corrects 2bw's weight delay; the other schedules have none")
        if opt.min_lr > opt.learning_rate:
            raise ValueError(f"min_lr {opt.min_lr:g} is above the learning rate {opt.learning_rate:g}")
        if opt.clip_grad is not None and spec.tie_embeddings and par.pp > 1:
            # The tied gradient is the sum of two stages' parts, known only at the update:
            # the norm each stage contributes earlier would count it wrongly.
            raise ValueError("clip_grad with tie_embeddings across stages (pp > 1) is not supported yet")
        if self.checkpoint.export_hf is not None and spec.arch not in ("gpt", "llama"):
            raise ValueError(f"export_hf writes GPT-2 and Llama models, not arch {spec.arch!r}")
        if self.comm.autotune and self.comm.policy == "blocking":
            raise ValueError("autotune tunes chunk and credit sizes; the blocking policy has none")
        for name, pair in (("straggler", self.faults.straggler), ("kill", self.faults.kill)):
            if pair is not None and not 0 <= pair[0] < self.world_size:
                raise ValueError(f"{name} rank {pair[0]} is outside the {self.world_size} ranks")
        kill, straggler = self.faults.kill, self.faults.straggler
        if kill is not None and not 0 <= kill[1] < self.steps:  # else it never fires
            raise ValueError(f"kill step {kill[1]} is outside the job's steps 0..{self.steps - 1}")
        if straggler is not None and not 0 <= straggler[1] <= 86400:  # what a rank can sleep
            raise ValueError(f"straggler seconds {straggler[1]:g} must be between 0 and 86400 (a day)")
        if par.rank_order != "auto":
            try:
                Layout(par.pp, par.dp, par.rank_order)  # a block size must divide its axis
            except UsageError as e:
                raise ValueError(str(e)) from None
        if par.partition is not None:
            try:
                check_sizes(par.partition, n_layers, par.pp)
            except UsageError as e:  # pydantic reports only ValueErrors raised in validators
                raise ValueError(str(e)) from None
        return self

    # Derived values, so that callers never recompute defaults differently.
    @property
    def spec(self) -> ModelSpec:
        """The model the job trains: with --emulate, its emulated layers (models/emulated.py)."""
        em = self.emulation
        return emulated_spec(self.real_spec, em) if em is not None else self.real_spec

    @property
    def real_spec(self) -> ModelSpec:
        """The model's own shape (what --emulate prices and scales)."""
        m = self.model
        spec = spec_of(m.layer_model) if m.layer_model is not None else resolve_model(m.name)
        return spec.with_(tie_embeddings=True) if m.tie_embeddings and spec.custom is None else spec

    @property
    def emulation(self) -> Emulation | None:
        m, par = self.model, self.parallel
        if m.emulate is None:
            return None
        spec, device = self.real_spec, device_named(m.emulate)
        times = flop_times(layer_flops(spec, par.micro_batch_size, self.tokens_seq), device, self.optim.optimizer)
        if m.recompute:
            times = recomputing(times, layer_names(spec))
        dilation = m.dilation
        if dilation is None:  # about EMULATED_STEP_S of computation per stage and step, two digits
            step = par.micro_batches * (sum(times.forward_s) + sum(times.backward_s)) / par.pp
            k = max(1.0, EMULATED_STEP_S / step)
            dilation = float(f"{k:.2g}")
        scale = m.byte_scale
        if scale is None:
            weights = 4 * sum(layer_param_counts(spec))
            activation = 4 * par.micro_batch_size * self.tokens_seq * spec.d_model
            need = max(1.0, weights / (128 << 20), activation / (2 << 20))
            scale = 1 << math.ceil(math.log2(need))
        return Emulation(device.name, dilation, scale, times)

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def tokens_seq(self) -> int:
        return self.parallel.seq_len or min(self.real_spec.max_seq_len, 128)

    @property
    def activation_shape(self) -> tuple[int, int, int]:
        """What crosses a pipeline link per micro-batch, forward (and its gradient back)."""
        return (self.parallel.micro_batch_size, self.tokens_seq, self.spec.d_model)

    @property
    def activation_bytes(self) -> int:
        b, s, d = self.activation_shape
        return 4 * b * s * d

    @property
    def tokens_per_replica_step(self) -> int:
        return self.parallel.micro_batches * self.parallel.micro_batch_size * self.tokens_seq

    @property
    def tokens_per_step(self) -> int:
        return self.parallel.dp * self.tokens_per_replica_step

    # The flat view: flag and YAML names.
    def get(self, flat: str) -> Any:
        """The option a flag or YAML key names, e.g. cfg.get("comm_policy")."""
        if flat in TOP_LEVEL:
            return getattr(self, flat)
        section, name = FLAGS[flat][:2]
        return getattr(getattr(self, section), name)

    def flat(self, mode: str = "python") -> dict[str, Any]:
        """Every option under its flag's name (what `make_config` takes back)."""
        dumped = self.model_dump(mode=mode)
        out = {k: dumped[k] for k in TOP_LEVEL}
        for flat, (section, name, _) in FLAGS.items():
            out[flat] = dumped[section][name]
        return out

    def with_(self, **changes: Any) -> "TrainConfig":
        """A copy with options replaced by their flat names, unvalidated (as model_copy):
        for what the caller derived from a valid configuration."""
        if unknown := set(changes) - set(FLAGS) - set(TOP_LEVEL):
            raise KeyError(f"no option {sorted(unknown)[0]!r}")
        update = {k: (getattr(self, k).model_copy(update=v) if k in SECTIONS else v) for k, v in nest(changes).items()}
        return self.model_copy(update=update)


def _flags() -> dict[str, tuple[str, str, FieldInfo]]:
    out: dict[str, tuple[str, str, FieldInfo]] = {}
    for section, cls in SECTIONS.items():
        for name, info in cls.model_fields.items():
            out[_FLAT_NAMES.get((section, name), name)] = (section, name, info)
    return out


# Flat name -> (section, field, its declaration), in declaration order; steps and seed are
# TrainConfig's own fields.
FLAGS: dict[str, tuple[str, str, FieldInfo]] = _flags()


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat options (flags, YAML keys) as TrainConfig's sections; a section given whole (a
    nested YAML file) is kept and flat keys of it join it. An unknown key stays at the top,
    where validation calls it an unknown option."""
    out: dict[str, Any] = {k: dict(v) for k, v in flat.items() if k in SECTIONS and isinstance(v, dict)}
    for key, value in flat.items():
        if key in out:
            continue  # a section given whole (a nested YAML file)
        if key in FLAGS:
            section, name, _ = FLAGS[key]
            out.setdefault(section, {})[name] = value
        else:
            out[key] = value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    data = read_mapping(path, "config file")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def make_config(overrides: dict[str, Any] | None = None, config_file: str | Path | None = None, **kw) -> TrainConfig:
    """Defaults < YAML file < overrides (e.g. flags), all by flat name. Raises ConfigError
    with one line."""
    try:
        values = load_yaml(config_file) if config_file else {}
    except UsageError as e:
        raise ConfigError(str(e)) from None
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    values.update(kw)
    try:
        return TrainConfig(**nest(values))
    except ValidationError as e:
        raise ConfigError(_one_line(e)) from None


def _one_line(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
    if len(loc) >= 2 and loc[0] in SECTIONS:  # name the option as the user wrote it
        loc = [_FLAT_NAMES.get((loc[0], loc[1]), loc[1]), *loc[2:]]
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown option"
    where = ".".join(loc)
    return f"{where}: {msg}" if where else msg
