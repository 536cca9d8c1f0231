"""A model is an ordered list of layers. Layer i is initialised from a generator seeded by
(seed, i), so a pipeline stage can build just its own layers and still hold exactly the
weights the whole model would have."""

from __future__ import annotations

import torch
from torch import nn

from .layers import (Block, Embedding, FinalNorm, FinalRMSNorm, LlamaBlock, LMHead, MLMHead, TokenEmbedding,
                     init_weights, lm_loss)
from .presets import ModelSpec


def layer_names(spec: ModelSpec) -> list[str]:
    if spec.custom is not None:
        return [f"layer{i}" for i in range(spec.n_layers)]
    head = "mlm_head" if spec.arch == "bert" else "lm_head"
    return ["embedding", *(f"block{i}" for i in range(spec.n_layers)), "final_norm", head]


def build_layer(spec: ModelSpec, index: int, seed: int, sparse_embedding: bool = False) -> nn.Module:
    n = len(layer_names(spec))
    if not 0 <= index < n:
        raise IndexError(f"layer {index} out of range for {spec.name} ({n} layers)")
    if spec.custom is not None:
        layer = spec.custom.build(index, seed)
        if spec.tie_embeddings and index == n - 1:  # the tied head starts as the table
            with torch.no_grad():
                _param(layer, head_name(spec)).copy_(_param(build_layer(spec, 0, seed), table_name(spec)))
        return layer
    llama = spec.arch == "llama"
    if index == 0:
        layer: nn.Module = TokenEmbedding(spec.vocab_size, spec.d_model, sparse=sparse_embedding) if llama else \
            Embedding(spec.vocab_size, spec.d_model, spec.max_seq_len, sparse=sparse_embedding)
    elif index <= spec.n_layers:
        layer = LlamaBlock(spec.d_model, spec.n_heads, spec.kv_heads, spec.d_ff, spec.max_seq_len, spec.rope_theta,
                           spec.norm_eps) if llama else \
            Block(spec.d_model, spec.n_heads, spec.d_ff, causal=spec.causal, dropout=spec.dropout,
                  activation=spec.activation, eps=spec.norm_eps)
    elif index == spec.n_layers + 1:
        layer = FinalRMSNorm(spec.d_model, eps=spec.norm_eps) if llama else FinalNorm(spec.d_model, eps=spec.norm_eps)
    else:
        layer = MLMHead(spec.d_model, spec.vocab_size) if spec.arch == "bert" else LMHead(spec.d_model, spec.vocab_size)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    init_weights(layer, spec.n_layers, gen)
    if spec.weights is not None:  # a Hugging Face model's own weights: only this layer's tensors are read
        from .hf import load_layer

        load_layer(spec, index, layer)
    if spec.tie_embeddings and index == n - 1:  # a tied head starts as the embedding table
        with torch.no_grad():
            layer.proj.weight.copy_(build_layer(spec, 0, seed).tok.weight)
    return layer


def loss_of(spec: ModelSpec):
    """Your model's loss (LayerModel(loss=...)), or cross entropy over the vocabulary."""
    return spec.custom.loss if spec.custom is not None and spec.custom.loss is not None else lm_loss


def table_name(spec: ModelSpec) -> str | None:
    """The token table's parameter name within the first layer (None: a custom first layer
    without an nn.Embedding)."""
    return spec.custom.traced[3] if spec.custom is not None else "tok.weight"


def head_name(spec: ModelSpec) -> str:
    """The output projection's parameter name within the last layer (what a tie shares)."""
    return spec.custom.tie[1].split(".", 1)[1] if spec.custom is not None else "proj.weight"


def table_index(spec: ModelSpec) -> int | None:
    """Position of the token table among the first layer's parameters."""
    if spec.custom is None:
        return 0
    name = table_name(spec)
    return None if name is None else spec.custom.traced[2][0].index(name)


def _param(layer: nn.Module, name: str) -> nn.Parameter:
    return layer.get_parameter(name)


def tie_in_place(layers: list[nn.Module], spec: ModelSpec | None = None) -> None:
    """Share one parameter between the token table and the head when both are here."""
    first, last = layers[0], layers[-1]
    if spec is not None and spec.custom is not None:
        owner, _, attr = head_name(spec).rpartition(".")
        setattr(last.get_submodule(owner) if owner else last, attr, _param(first, table_name(spec)))
    elif isinstance(first, (Embedding, TokenEmbedding)) and isinstance(last, (LMHead, MLMHead)):
        last.proj.weight = first.tok.weight


def build_layers(spec: ModelSpec, seed: int, indices: range | None = None, sparse_embedding: bool = False) -> list[nn.Module]:
    indices = range(len(layer_names(spec))) if indices is None else indices
    return [build_layer(spec, i, seed, sparse_embedding) for i in indices]


def build_model(spec: ModelSpec, seed: int, sparse_embedding: bool = False) -> nn.Sequential:
    """The whole model in one process: the reference every parallel run must reproduce."""
    layers = build_layers(spec, seed, sparse_embedding=sparse_embedding)
    if spec.tie_embeddings:
        tie_in_place(layers, spec)
    return nn.Sequential(*layers)


def count_params(layers) -> int:
    return sum(p.numel() for layer in layers for p in layer.parameters())


def layer_param_numels(spec: ModelSpec) -> list[list[int]]:
    """Each layer's parameters' sizes in registration order (the order of a stage's flat
    gradient), from the shapes alone (no tensors): cheap even for gpt2-xl."""
    if spec.custom is not None:
        return spec.custom.traced[1]
    d, v, f = spec.d_model, spec.vocab_size, spec.d_ff
    if spec.arch == "llama":
        kv = spec.kv_heads * (d // spec.n_heads)
        block = [d, d * d, kv * d, kv * d, d * d, d, f * d, f * d, d * f]  # attn_norm q k v o mlp_norm gate up down
        return [[v * d], *([block] * spec.n_layers), [d], [d * v]]
    block = [d, d, 3 * d * d, 3 * d, d * d, d, d, d, f * d, f, d * f, d]  # ln1 qkv proj ln2 fc out
    head = [d * v] if spec.arch == "gpt" else [d * d, d, d, d, d * v, v]
    return [[v * d, spec.max_seq_len * d], *([block] * spec.n_layers), [d, d], head]


def tied_head_param(spec: ModelSpec) -> int:
    """Position of the output projection's weight (tied to the token table, parameter 0 of
    the embedding layer) among the head layer's parameters."""
    if spec.custom is not None:  # (untied: 0, which nothing reads)
        return spec.custom.traced[2][-1].index(head_name(spec)) if spec.custom.tie else 0
    return 4 if spec.arch == "bert" else 0  # MLM head: dense w, b, norm w, b, then proj.weight


def layer_param_counts(spec: ModelSpec) -> list[int]:
    """Parameters per layer."""
    return [sum(n) for n in layer_param_numels(spec)]


def layer_flops(spec: ModelSpec, batch: int, seq: int) -> list[float]:
    """Forward FLOPs per layer of one micro-batch of `batch` x `seq` tokens (sim/compute.py
    says how; backward is twice that)."""
    d, v, tokens = spec.d_model, spec.vocab_size, batch * seq
    if spec.arch == "llama":  # q and o, k and v (grouped), gate, up and down
        kv = spec.kv_heads * (d // spec.n_heads)
        block = 2 * tokens * (2 * d * d + 2 * d * kv + 3 * d * spec.d_ff) + 4 * batch * seq * seq * d
    else:
        block = 2 * tokens * (4 * d * d + 2 * d * spec.d_ff) + 4 * batch * seq * seq * d
    head = 2 * tokens * d * v + (2 * tokens * d * d if spec.arch == "bert" else 0)
    return [0.0, *([float(block)] * spec.n_layers), 0.0, float(head)]
