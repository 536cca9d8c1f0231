"""Model shapes by name. Small ones run here; the GPT-2, BERT and Llama shapes serve larger
machines and the simulator."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str  # "gpt" (causal LM), "bert" (bidirectional encoder, masked LM) or "llama" (causal LM)
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    max_seq_len: int
    tie_embeddings: bool = False
    dropout: float = 0.0  # 0 keeps runs bitwise reproducible across schedules
    n_kv_heads: int | None = None  # grouped-query attention (llama); None: one per query head
    ffn: int | None = None  # MLP width; None: 4 d (gpt, bert), or SwiGLU's 8d/3 rounded up to 256 (llama)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    activation: str = "gelu"  # the GPT/BERT MLP's: "gelu" (exact) or "gelu_tanh" (GPT-2's gelu_new)
    source: str | None = None  # a Hugging Face directory this shape came from (hf:DIR)
    weights: str | None = None  # that directory, when it holds safetensors weights to start from
    custom: object = field(default=None, compare=False, repr=False)  # a LayerModel (arch "custom")

    @property
    def d_ff(self) -> int:
        if self.ffn is not None:
            return self.ffn
        if self.arch == "llama":
            return 256 * -(-(8 * self.d_model // 3) // 256)
        return 4 * self.d_model

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def causal(self) -> bool:
        return self.arch != "bert"

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
        ModelSpec("llama-test", "llama", vocab_size=2048, d_model=64, n_layers=4, n_heads=4, max_seq_len=64,
                  n_kv_heads=2),
        ModelSpec("llama-tiny", "llama", vocab_size=16384, d_model=256, n_layers=4, n_heads=8, max_seq_len=128,
                  n_kv_heads=2),
        # TinyLlama-1.1B's shape and Llama-2-7B's.
        ModelSpec("llama-1b", "llama", vocab_size=32000, d_model=2048, n_layers=22, n_heads=32, max_seq_len=2048,
                  n_kv_heads=4, ffn=5632),
        ModelSpec("llama-7b", "llama", vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, max_seq_len=4096,
                  ffn=11008),
    ]
}
