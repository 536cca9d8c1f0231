"""Model shapes by name. Small ones run here; the GPT-2 and BERT shapes serve larger machines and the simulator."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str  # "gpt" (causal LM) or "bert" (bidirectional encoder, masked LM)
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    max_seq_len: int
    tie_embeddings: bool = False
    dropout: float = 0.0  # 0 keeps runs bitwise reproducible across schedules

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model

    def with_(self, **changes) -> "ModelSpec":
        return replace(self, **changes)


PRESETS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        ModelSpec("gpt-test", "gpt", vocab_size=2048, d_model=64, n_layers=4, n_heads=4, max_seq_len=64),
        ModelSpec("gpt-tiny", "gpt", vocab_size=16384, d_model=256, n_layers=4, n_heads=4, max_seq_len=128),
        ModelSpec("gpt2-small", "gpt", vocab_size=50257, d_model=768, n_layers=12, n_heads=12, max_seq_len=1024),
        ModelSpec("gpt2-medium", "gpt", vocab_size=50257, d_model=1024, n_layers=24, n_heads=16, max_seq_len=1024),
        ModelSpec("gpt2-xl", "gpt", vocab_size=50257, d_model=1600, n_layers=48, n_heads=25, max_seq_len=1024),
        ModelSpec("bert-test", "bert", vocab_size=2048, d_model=64, n_layers=4, n_heads=4, max_seq_len=64),
        ModelSpec("bert-base", "bert", vocab_size=30522, d_model=768, n_layers=12, n_heads=12, max_seq_len=512),
        ModelSpec("bert-large", "bert", vocab_size=30522, d_model=1024, n_layers=24, n_heads=16, max_seq_len=512),
    ]
}
