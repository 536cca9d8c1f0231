"""`trirace generate`: sample text from a trained model on one process.

The model comes from a trirace checkpoint directory (its newest complete step, or a step
directory: each layer's master weights) or from a Hugging Face directory (one that
--export-hf wrote, or any GPT-2 / Llama one). The tokenizer is the
directory's tokenizer.json, or else the BPE trirace trained on the run's --data.
Decoding is greedy (--top-k 1, the default) or top-k sampling at a temperature, with a
seeded generator: the same command prints the same text.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from .data.dataset import tokenizer_file
from .errors import UsageError
from .models import build_layers
from .models.hf import tokenizer_of
from .models.build import tie_in_place
from .models.shape_file import resolve


def load_model(directory: str | Path) -> tuple[torch.nn.Sequential, object, Path]:
    """(model in eval mode, its ModelSpec, the directory) from a checkpoint or HF directory."""
    d = Path(directory)
    if (d / "config.json").is_file():
        spec = resolve(f"hf:{d}")
        layers = build_layers(spec, seed=0)
        if spec.tie_embeddings:
            tie_in_place(layers, spec)
        return torch.nn.Sequential(*layers).eval(), spec, d
    from .runtime import checkpoint

    if not any(d.glob("step-*/meta.json")) and not (d / "meta.json").is_file():
        raise UsageError(f"{d}: neither a Hugging Face directory (config.json) nor a trirace checkpoint "
                         "directory (step-*/meta.json)")
    step_dir = checkpoint.find(d)
    meta = checkpoint.read_meta(step_dir)
    spec = resolve(meta["model"])
    spec = spec.with_(tie_embeddings=True) if meta.get("tie_embeddings") else spec
    layers = build_layers(spec, seed=0)
    checkpoint.load_weights(step_dir, layers, meta)
    if spec.tie_embeddings:  # the head's copy equals the table's (the tied reduction keeps them so)
        tie_in_place(layers, spec)
    return torch.nn.Sequential(*layers).eval(), spec, step_dir


def find_tokenizer(directory: Path, spec, data: str) -> Tokenizer:
    for f in (directory / "tokenizer.json", directory.parent / "tokenizer.json"):
        if f.is_file():
            return Tokenizer.from_file(str(f))
    if (f := tokenizer_of(spec)) is not None:
        return Tokenizer.from_file(str(f))
    f = tokenizer_file(data, spec.vocab_size)
    if f is None:
        raise UsageError(f"no tokenizer.json in {directory}, and no tokenizer trained on --data {data!r} in the "
                         "cache (train on that data first, or give the data the model was trained on)")
    return Tokenizer.from_file(str(f))


@torch.no_grad()
def generate(model: torch.nn.Module, ids: list[int], max_new_tokens: int, max_seq_len: int, top_k: int = 1,
             temperature: float = 1.0, seed: int = 0) -> list[int]:
    """Continue `ids` by `max_new_tokens` tokens (the context is cut to the model's window)."""
    g = torch.Generator().manual_seed(seed)
    out = list(ids)
    for _ in range(max_new_tokens):
        x = torch.tensor([out[-max_seq_len:]])
        logits = model(x)[0, -1].float()
        if top_k == 1:
            nxt = int(logits.argmax())
        else:
            vals, idx = logits.topk(min(top_k, logits.numel()))
            probs = torch.softmax(vals / temperature, dim=-1)
            nxt = int(idx[torch.multinomial(probs, 1, generator=g)])
        out.append(nxt)
    return out


def main(directory: str, prompt: str, max_new_tokens: int, top_k: int, temperature: float, seed: int,
         data: str) -> int:
    if max_new_tokens < 1 or top_k < 1 or not temperature > 0:
        raise UsageError("--max-new-tokens and --top-k must be at least 1, --temperature above 0")
    model, spec, where = load_model(directory)
    tok = find_tokenizer(Path(directory), spec, data)
    ids = tok.encode(prompt).ids
    if not ids:
        raise UsageError("the prompt encodes to no tokens")
    if max(ids) >= spec.vocab_size:
        raise UsageError(f"the tokenizer gives ids up to {max(ids)}, beyond the model's {spec.vocab_size} tokens")
    out = generate(model, ids, max_new_tokens, spec.max_seq_len, top_k, temperature, seed)
    print(tok.decode(out))
    return 0
