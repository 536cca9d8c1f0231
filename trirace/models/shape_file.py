"""A model shape from a YAML file (`--model my-shape.yaml`): the presets' fields, checked
by pydantic so that a bad shape is one line naming the key.

    arch: llama            # gpt | bert | llama
    vocab_size: 32000
    d_model: 2048
    n_layers: 22
    n_heads: 32
    n_kv_heads: 4          # llama only (default: n_heads)
    d_ff: 5632             # default: 4 d_model (gpt, bert), SwiGLU's 8/3 rounded up to 256 (llama)
    max_seq_len: 2048
    tie_embeddings: false
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import UsageError
from ..yamlfile import read_mapping
from .hf import check_weights, is_hf, spec_from_hf
from .presets import PRESETS, ModelSpec


class ShapeFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    arch: Literal["gpt", "bert", "llama"]
    vocab_size: int = Field(ge=8)
    d_model: int = Field(ge=1)
    n_layers: int = Field(ge=1)
    n_heads: int = Field(ge=1)
    n_kv_heads: int | None = Field(None, ge=1)
    d_ff: int | None = Field(None, ge=1)
    max_seq_len: int = Field(ge=2)
    tie_embeddings: bool = False
    rope_theta: float = Field(10000.0, gt=0)
    norm_eps: float = Field(1e-5, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> "ShapeFile":
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads {self.n_heads} does not divide d_model {self.d_model}")
        if self.n_kv_heads is not None:
            if self.arch != "llama":
                raise ValueError("n_kv_heads (grouped-query attention) is for arch llama")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads {self.n_kv_heads} does not divide n_heads {self.n_heads}")
        if self.arch == "llama" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"rotary embeddings need an even head size, got {self.d_model // self.n_heads}")
        return self


@functools.lru_cache(maxsize=16)
def _hf(model: str, _stamp: int) -> ModelSpec:
    spec = spec_from_hf(model)
    if spec.weights is not None:
        check_weights(spec)
    return spec


def is_shape_file(model: str) -> bool:
    return model.endswith((".yaml", ".yml"))


def load_shape(path: str) -> ModelSpec:
    """The ModelSpec a shape file describes (named by the file's stem). One-line UsageError."""
    p = Path(path)
    try:
        stamp = p.stat().st_mtime_ns
    except OSError:
        raise UsageError(f"model shape file not found: {p}") from None
    return _load(str(p.resolve()), stamp)


@functools.lru_cache(maxsize=16)
def _load(path: str, _stamp: int) -> ModelSpec:  # the stamp: an edited file is read again
    data = read_mapping(path, "model shape file")
    try:
        shape = ShapeFile(**{str(k).replace("-", "_"): v for k, v in data.items()})
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise UsageError(f"model shape file {path}: {loc + ': ' if loc else ''}{msg}") from None
    fields = shape.model_dump()
    return ModelSpec(Path(path).stem, shape.arch, vocab_size=shape.vocab_size, d_model=shape.d_model,
                     n_layers=shape.n_layers, n_heads=shape.n_heads, max_seq_len=shape.max_seq_len,
                     tie_embeddings=shape.tie_embeddings, n_kv_heads=fields["n_kv_heads"], ffn=fields["d_ff"],
                     rope_theta=shape.rope_theta, norm_eps=shape.norm_eps)


def resolve(model: str) -> ModelSpec:
    """A preset's name, a shape file's path or hf:DIR -> its ModelSpec."""
    if is_shape_file(model):
        return load_shape(model)
    if is_hf(model):
        config = Path(model[len("hf:"):]).expanduser() / "config.json"
        return _hf(model, config.stat().st_mtime_ns if config.is_file() else 0)
    if model not in PRESETS:
        raise UsageError(f"unknown model preset {model!r}; choose from {', '.join(PRESETS)}, or give a shape "
                         "file (.yaml)")
    return PRESETS[model]
