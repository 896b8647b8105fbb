"""A small decoder-only transformer (GPT-style), short enough to read in one sitting.

Token and position embeddings, pre-norm blocks of causal self-attention (through
``F.scaled_dot_product_attention``) and a GELU MLP, a final LayerNorm and a vocabulary head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TransformerConfig:
    """The sizes of a :class:`DecoderTransformer`.
    """

    vocab_size: int
    seq_len: int  # longest input the position embedding covers
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t attends only to positions <= t.
    """

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        # (batch, seq, width) -> (batch, heads, seq, head_dim), the layout SDPA expects
        q, k, v = (t.view(batch, seq, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class MLP(nn.Module):
    """Linear -> GELU -> Linear, ``mlp_ratio`` times wider in the middle.
    """

    def __init__(self, d_model: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, mlp_ratio * d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """One pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).
    """

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class DecoderTransformer(nn.Module):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab_size).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.Sequential(*(Block(config.d_model, config.n_heads, config.mlp_ratio)
                                      for _ in range(config.n_layers)))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        if seq > self.config.seq_len:
            raise ValueError(f"sequence of {seq} tokens is longer than seq_len "
                             f"{self.config.seq_len}")
        positions = torch.arange(seq, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        return self.head(self.ln_f(self.blocks(x)))
