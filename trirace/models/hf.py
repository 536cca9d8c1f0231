"""Hugging Face models in and out: `--model hf:DIR` (GPT-2 or Llama family, a local
directory, never a download) and `--export-hf DIR`.

The directory's config.json becomes a ModelSpec. Its safetensors weights, when present,
are read layer by layer (`load_layer`), so a pipeline stage reads only the tensors its own
layers hold; without weights the model starts from trirace's seeded init. Export writes
one safetensors shard per stage and the index that names them, plus config.json:
`transformers` loads the directory back with `from_pretrained`.

Only the name and layout mapping lives here; safetensors (a dependency of `transformers`,
the `hf` extra) does the file format, and the JSON is the standard library's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..errors import UsageError

PREFIX = "hf:"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def is_hf(model: str) -> bool:
    return model.startswith(PREFIX)


def _read_config(path: Path) -> dict:
    f = path / "config.json"
    if not f.is_file():
        raise UsageError(f"hf model {path}: no config.json there (a local Hugging Face model directory is needed; "
                         "nothing is downloaded)")
    try:
        return json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"hf model {path}: config.json is not readable JSON ({e})") from None


def spec_from_hf(model: str):
    """The ModelSpec of `hf:DIR`, from DIR/config.json (one-line UsageError otherwise)."""
    from .presets import ModelSpec

    path = Path(model[len(PREFIX):]).expanduser()
    if not path.is_dir():
        raise UsageError(f"hf model directory not found: {path}")
    c = _read_config(path)
    kind = c.get("model_type")
    weights = str(path) if (path / WEIGHTS).is_file() or (path / INDEX).is_file() else None
    try:
        if kind == "gpt2":
            act = c.get("activation_function", "gelu_new")
            if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
                raise UsageError(f"hf model {path}: activation {act!r} is not supported")
            return ModelSpec(f"hf:{path.name}", "gpt", vocab_size=c["vocab_size"], d_model=c["n_embd"],
                             n_layers=c["n_layer"], n_heads=c["n_head"], max_seq_len=c["n_positions"],
                             tie_embeddings=c.get("tie_word_embeddings", True), ffn=c.get("n_inner"),
                             norm_eps=c.get("layer_norm_epsilon", 1e-5),
                             activation="gelu" if act == "gelu" else "gelu_tanh", source=str(path),
                             weights=weights)
        if kind == "llama":
            d, heads = c["hidden_size"], c["num_attention_heads"]
            rope = c.get("rope_parameters") or {}
            scaling = c.get("rope_scaling") or ({} if rope.get("rope_type", "default") == "default" else rope)
            if scaling or c.get("attention_bias") or c.get("mlp_bias") or c.get("hidden_act", "silu") != "silu" \
                    or c.get("head_dim", d // heads) != d // heads:
                raise UsageError(f"hf model {path}: this Llama variant (rope scaling, biases, another activation "
                                 "or head size) is not supported")
            return ModelSpec(f"hf:{path.name}", "llama", vocab_size=c["vocab_size"], d_model=d,
                             n_layers=c["num_hidden_layers"], n_heads=heads, max_seq_len=c["max_position_embeddings"],
                             tie_embeddings=c.get("tie_word_embeddings", False),
                             n_kv_heads=c.get("num_key_value_heads") or heads, ffn=c["intermediate_size"],
                             rope_theta=rope.get("rope_theta", c.get("rope_theta") or 10000.0),
                             norm_eps=c.get("rms_norm_eps", 1e-6), source=str(path), weights=weights)
    except KeyError as e:
        raise UsageError(f"hf model {path}: config.json lacks {e.args[0]!r}") from None
    raise UsageError(f"hf model {path}: unsupported architecture {kind!r} (supported: gpt2, llama)")


def is_stored(spec, name: str) -> bool:
    """False for a tied head's weight: the files hold the token table only."""
    return not (name == "lm_head.weight" and spec.tie_embeddings)


def tokenizer_of(spec) -> Path | None:
    """A Hugging Face model directory's own tokenizer.json, which its weights were trained with."""
    if spec.source is None:
        return None
    f = Path(spec.source) / "tokenizer.json"
    return f if f.is_file() else None


def names(spec, index: int) -> list[tuple[str, bool]]:
    """Hugging Face names of layer `index`'s parameters, in the layer's registration order,
    each with whether the stored matrix is the transpose of ours (GPT-2's Conv1D)."""
    n = spec.n_layers
    if spec.arch == "gpt":
        if index == 0:
            return [("transformer.wte.weight", False), ("transformer.wpe.weight", False)]
        if index <= n:
            h = f"transformer.h.{index - 1}"
            return [(f"{h}.ln_1.weight", False), (f"{h}.ln_1.bias", False), (f"{h}.attn.c_attn.weight", True),
                    (f"{h}.attn.c_attn.bias", False), (f"{h}.attn.c_proj.weight", True),
                    (f"{h}.attn.c_proj.bias", False), (f"{h}.ln_2.weight", False), (f"{h}.ln_2.bias", False),
                    (f"{h}.mlp.c_fc.weight", True), (f"{h}.mlp.c_fc.bias", False), (f"{h}.mlp.c_proj.weight", True),
                    (f"{h}.mlp.c_proj.bias", False)]
        if index == n + 1:
            return [("transformer.ln_f.weight", False), ("transformer.ln_f.bias", False)]
        return [("lm_head.weight", False)]
    if spec.arch == "llama":
        if index == 0:
            return [("model.embed_tokens.weight", False)]
        if index <= n:
            h = f"model.layers.{index - 1}"
            return [(f"{h}.input_layernorm.weight", False)] + \
                [(f"{h}.self_attn.{p}_proj.weight", False) for p in "qkvo"] + \
                [(f"{h}.post_attention_layernorm.weight", False)] + \
                [(f"{h}.mlp.{p}_proj.weight", False) for p in ("gate", "up", "down")]
        if index == n + 1:
            return [("model.norm.weight", False)]
        return [("lm_head.weight", False)]
    raise UsageError(f"no Hugging Face layout for arch {spec.arch!r}")


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError:
        raise UsageError("hf: models need the optional extra: pip install 'trirace[hf]'") from None
    return safe_open


def stored_shapes(spec, index: int) -> list[tuple[int, ...]]:
    """The shapes layer `index`'s tensors have in a Hugging Face file, in `names` order."""
    d, v, f, n = spec.d_model, spec.vocab_size, spec.d_ff, spec.n_layers
    if spec.arch == "gpt":
        if index == 0:
            return [(v, d), (spec.max_seq_len, d)]
        if index <= n:
            return [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, f), (f,), (f, d), (d,)]
        return [(d,), (d,)] if index == n + 1 else [(v, d)]
    kv = spec.kv_heads * (d // spec.n_heads)
    if index == 0:
        return [(v, d)]
    if index <= n:
        return [(d,), (d, d), (kv, d), (kv, d), (d, d), (d,), (f, d), (f, d), (d, f)]
    return [(d,)] if index == n + 1 else [(v, d)]


def check_weights(spec) -> None:
    """Every tensor the config implies is in the files, with the shape it implies: read
    from the safetensors headers only, before any process starts."""
    safe_open = _safe_open()
    path = Path(spec.weights)
    where = _files(path)
    for index in range(spec.n_layers + 3):
        for (name, _), shape in zip(names(spec, index), stored_shapes(spec, index)):
            if name not in where:
                if not is_stored(spec, name):
                    continue
                raise UsageError(f"hf model {path}: weights lack {name}")
            with safe_open(str(where[name]), framework="pt") as f:
                got = tuple(f.get_slice(name).get_shape())
            if got != shape:
                raise UsageError(f"hf model {path}: {name} has shape {list(got)} but config.json makes it "
                                 f"{list(shape)}")


def _files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    if (path / INDEX).is_file():
        index = json.loads((path / INDEX).read_text())["weight_map"]
        return {k: path / v for k, v in index.items()}
    with _safe_open()(str(path / WEIGHTS), framework="pt") as f:
        return {k: path / WEIGHTS for k in f.keys()}


@torch.no_grad()
def load_layer(spec, index: int, layer: nn.Module) -> None:
    """Copy layer `index`'s tensors from the spec's safetensors into `layer` (shapes checked)."""
    safe_open = _safe_open()
    path = Path(spec.weights)
    where = _files(path)
    params = list(layer.parameters())
    for p, (name, transposed) in zip(params, names(spec, index)):
        if name not in where:
            if not is_stored(spec, name):
                continue  # a tied head is the token table, already copied in by build_layer
            raise UsageError(f"hf model {path}: weights lack {name}")
        with safe_open(str(where[name]), framework="pt") as f:
            t = f.get_tensor(name)
        if transposed:
            t = t.t()
        if tuple(t.shape) != tuple(p.shape):
            raise UsageError(f"hf model {path}: {name} has shape {list(t.shape)} but the config makes it "
                             f"{list(p.shape)}")
        p.copy_(t.to(p.dtype))


def hf_config(spec) -> dict:
    """config.json for an exported model."""
    if spec.arch == "gpt":
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": spec.vocab_size,
                "n_embd": spec.d_model, "n_layer": spec.n_layers, "n_head": spec.n_heads,
                "n_positions": spec.max_seq_len, "n_inner": spec.d_ff, "layer_norm_epsilon": spec.norm_eps,
                "activation_function": "gelu_new" if spec.activation == "gelu_tanh" else "gelu",
                "tie_word_embeddings": spec.tie_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                "attn_pdrop": 0.0, "bos_token_id": None, "eos_token_id": None, "torch_dtype": "float32"}
    if spec.arch == "llama":
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": spec.vocab_size,
                "hidden_size": spec.d_model, "num_hidden_layers": spec.n_layers,
                "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.kv_heads,
                "intermediate_size": spec.d_ff, "max_position_embeddings": spec.max_seq_len,
                "rms_norm_eps": spec.norm_eps, "rope_theta": spec.rope_theta, "hidden_act": "silu",
                "tie_word_embeddings": spec.tie_embeddings, "attention_bias": False, "mlp_bias": False,
                "bos_token_id": None, "eos_token_id": None, "torch_dtype": "float32"}
    raise UsageError(f"--export-hf supports gpt and llama models, not {spec.arch!r}")


def stage_tensors(spec, indices: range, layers: list[nn.Module],
                  values: dict[int, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """One stage's weights under their Hugging Face names (a tied head is left out: the
    table stands for it). `values`: id(parameter) -> the tensor to write in its place."""
    out = {}
    for index, layer in zip(indices, layers):
        for p, (name, transposed) in zip(layer.parameters(), names(spec, index)):
            if not is_stored(spec, name):
                continue
            t = (values or {}).get(id(p), p).detach().to("cpu", torch.float32)
            out[name] = (t.t() if transposed else t).contiguous()
    return out


def shard_name(stage: int, stages: int) -> str:
    return f"model-{stage + 1:05d}-of-{stages:05d}.safetensors"


def write_shard(out: Path, stage: int, stages: int, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (shard_name(stage, stages) + ".part")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / shard_name(stage, stages))


def write_index(out: Path, spec, stages: int, shard_keys: list[list[str]], total_bytes: int,
                tokenizer: Path | None) -> None:
    """After every stage wrote its shard: the index naming them, config.json, the tokenizer."""
    weight_map = {k: shard_name(s, stages) for s, keys in enumerate(shard_keys) for k in keys}
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total_bytes}, "weight_map": weight_map},
                                        indent=2))
    (out / "config.json").write_text(json.dumps(hf_config(spec), indent=2))
    if tokenizer is not None and tokenizer.is_file():
        (out / "tokenizer.json").write_bytes(tokenizer.read_bytes())
