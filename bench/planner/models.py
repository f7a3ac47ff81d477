"""Models of the planner table, as ``module:factory`` names ``accudnn plan`` accepts.

The Hugging Face models are built from their configs (no download) with SDPA attention and
the library's defaults otherwise (dropout, cache); ``transformers`` must be installed
(``pip install -e ".[dev]"``). :func:`tiny_transformer` needs only torch: the test of the table
plans it.

Example:
    >>> model = tiny_transformer()
    >>> sum(p.numel() for p in model.parameters()) > 0
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "gpt2_medium",
    "gpt2_medium_gelu_tanh",
    "headline_gpt",
    "llama_1b",
    "resnet152_channels_last",
    "tiny_transformer",
]


def gpt2_medium() -> nn.Module:
    """GPT-2 medium (24 layers, width 1024, 16 heads, 50257 tokens) with SDPA attention and the
    library's default dropout (0.1 on embeddings, attention and residuals)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=1024, n_layer=24, n_head=16, attn_implementation="sdpa")
    return GPT2LMHeadModel(config)


def gpt2_medium_gelu_tanh() -> nn.Module:
    """:func:`gpt2_medium` with ``activation_function="gelu_pytorch_tanh"``: the same GELU (tanh
    approximation) as one kernel, where the default ``gelu_new`` is Python arithmetic whose
    ``pow`` CUDA autocast runs in float32 (its intermediates are then saved in float32)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_embd=1024,
        n_layer=24,
        n_head=16,
        attn_implementation="sdpa",
        activation_function="gelu_pytorch_tanh",
    )
    return GPT2LMHeadModel(config)


def headline_gpt() -> nn.Module:
    """The GPT of the headline benchmark (``bench.workloads``' ``gpt``: GPT-2 medium's shape,
    torch only), as the GPU runs measured it: ``accudnn plan`` of it can be set against them."""
    from bench.workloads import make_workload

    return make_workload("gpt").build()


def llama_1b() -> nn.Module:
    """A Llama-style 1B: hidden 2048, 16 layers, 32 heads, 8 key/value heads, intermediate 5632,
    vocabulary 32000, SDPA attention (grouped-query), the library's defaults otherwise."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=5632,
        vocab_size=32000,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, -1).transpose(1, 2)
            for t in self.qkv(self.norm1(x)).chunk(3, -1)
        )
        p = self.dropout if self.training else 0.0
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.norm2(x))


class _TinyTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(_Block(dim, heads, dropout) for _ in range(layers)))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def resnet152_channels_last() -> nn.Module:
    """torchvision's ResNet-152 in channels-last memory (``model.to(memory_format=torch.channels_last)``,
    as mixed-precision convolutional training is usually set up): every activation after the stem
    is channels-last."""
    import torchvision

    return torchvision.models.resnet152().to(memory_format=torch.channels_last)


def tiny_transformer() -> nn.Module:
    """A 4-block causal transformer (width 128, 4 heads, dropout 0.1, 512 tokens), for tests."""
    return _TinyTransformer(vocab=512, dim=128, heads=4, layers=4, dropout=0.1)
