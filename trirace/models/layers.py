"""The layers a model is cut from. Each maps one tensor to one tensor, so any contiguous
run of them is a pipeline stage: token ids -> hidden states -> ... -> logits.
GPT-2 and BERT: learned positions, LayerNorm, GELU MLP, biases. Llama: rotary positions,
RMSNorm, SwiGLU MLP, grouped-query attention, no biases."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Embedding(nn.Module):
    """Token plus learned position embedding. `sparse=True` gives the token table sparse
    gradients: only the rows a batch touched, which sparse communication exploits."""

    def __init__(self, vocab_size: int, d_model: int, max_seq_len: int, sparse: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model, sparse=sparse)
        self.pos = nn.Embedding(max_seq_len, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(positions)


class Block(nn.Module):
    """Pre-norm transformer block; `causal` selects GPT (True) or BERT (False) attention."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, causal: bool, dropout: float = 0.0,
                 activation: str = "gelu", eps: float = 1e-5):
        super().__init__()
        self.n_heads, self.causal, self.dropout = n_heads, causal, dropout
        self.approximate = "tanh" if activation == "gelu_tanh" else "none"
        self.ln1 = nn.LayerNorm(d_model, eps=eps)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model, eps=eps)
        self.fc = nn.Linear(d_model, d_ff)
        self.out = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, dropout_p=p)
        x = x + F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)), p, self.training)
        return x + F.dropout(self.out(F.gelu(self.fc(self.ln2(x)), approximate=self.approximate)), p, self.training)


class TokenEmbedding(nn.Module):
    """Token table only (Llama: positions enter through rotary embeddings in attention)."""

    def __init__(self, vocab_size: int, d_model: int, sparse: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model, sparse=sparse)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids)


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_seq_len, head_dim] of rotary position embeddings, with each
    frequency used for two dimensions half a head apart (the layout Hugging Face's Llama
    weights assume)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: RMSNorm, causal attention with rotary positions and grouped
    query heads (n_kv_heads key/value heads shared by n_heads query heads), RMSNorm, SwiGLU
    MLP; no biases. Parameter names follow the Llama layout (q, k, v, o; gate, up, down)."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, max_seq_len: int,
                 rope_theta: float = 10000.0, eps: float = 1e-5):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.attn_norm = nn.RMSNorm(d_model, eps=eps)
        self.q = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        self.mlp_norm = nn.RMSNorm(d_model, eps=eps)
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)
        cos, sin = rotary_tables(self.head_dim, max_seq_len, rope_theta)
        # Buffers, not parameters: they follow .to(device) but stay out of gradients and checkpoints.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class FinalRMSNorm(nn.RMSNorm):
    """The RMSNorm after a Llama model's last block, a layer of its own."""


class FinalNorm(nn.LayerNorm):
    """The LayerNorm after the last block, a layer of its own so a partitioner can place it."""


class LMHead(nn.Module):
    """Hidden states -> vocabulary logits (GPT's output projection)."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense, GELU, LayerNorm, then a vocabulary projection."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(F.gelu(self.dense(x))))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over the positions that have a target (-100 marks none)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def init_weights(layer: nn.Module, n_layers: int, generator: torch.Generator) -> None:
    """GPT-2 style init from `generator`: N(0, 0.02) for matrices and tables, residual
    output projections scaled by 1/sqrt(2 * n_layers), zero biases, unit norms."""
    with torch.no_grad():
        for m in layer.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                std = 0.02
                if (isinstance(layer, Block) and m in (layer.proj, layer.out)) or \
                        (isinstance(layer, LlamaBlock) and m in (layer.o, layer.down)):
                    std /= math.sqrt(2 * n_layers)
                m.weight.normal_(0.0, std, generator=generator)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
            elif isinstance(m, nn.RMSNorm):
                m.weight.fill_(1.0)
